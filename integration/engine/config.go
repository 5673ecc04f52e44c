package engine

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/gpu"
	"github.com/kvtierfs/kvtierfs/integration/engineio"
)

// Scenario names.
const (
	// ScenarioEagle stores prompts with a full-attention and an EAGLE group,
	// restarts the engine and asks them again cold.
	ScenarioEagle = "eagle"
	// ScenarioMultinode stores a prompt on two nodes, cycles the primary tier
	// with a filler prompt, then asks the prompt again: every hit block is
	// promoted into a recycled row.
	ScenarioMultinode = "multinode"
	// ScenarioLongPrefix stores one prompt larger than the primary tier,
	// restarts the engine and asks it again cold.
	ScenarioLongPrefix = "long-prefix"
	// ScenarioAgent serves agent sessions: requests whose long prompts extend
	// earlier ones and share a preamble.
	ScenarioAgent = "agent"
)

// Scenarios lists the scenarios Run knows, in the order of the docs.
func Scenarios() []string {
	return []string{ScenarioEagle, ScenarioMultinode, ScenarioLongPrefix, ScenarioAgent}
}

// Engine behaviours (see the package doc).
const (
	// EngineStock is the engine as the field found it: the old store filter
	// and a lookup that promotes every key it confirms.
	EngineStock = "stock"
	// EngineUpstream is vLLM main today: the EAGLE store filter fixed, and
	// a lookup that still promotes every key it confirms, asynchronously
	// (see upstream.go).
	EngineUpstream = "upstream"
	// EngineFixed keeps the EAGLE segment head, matches without staging
	// (.kvtier/match) and stages the hit in waves.
	EngineFixed = "fixed"
)

// Engines lists the engine behaviours, in the order of the docs.
func Engines() []string { return []string{EngineStock, EngineUpstream, EngineFixed} }

// KV layouts across TP ranks.
const (
	// KVMLA is a replicated cache (MLA): every rank stores the same bytes.
	KVMLA = "mla"
	// KVGQA is a head-sharded cache (GQA/MHA): each rank stores its own bytes.
	KVGQA = "gqa"
)

// FieldRowBytes is the field's row: DeepSeek-V4-Flash, TP=2, 8 blocks per
// chunk (8,601,600 bytes, 2100 pages).
const FieldRowBytes = gpu.EngineRowBytes

// DefaultIOThreads is the engine's number of tier I/O threads for stores and
// for loads.
const DefaultIOThreads = 16

// Group is one KV cache group of the model; its id is its index in
// Config.Groups, the N of its `_g<N>` directories.
type Group struct {
	// Kind is full attention, sliding window or EAGLE.
	Kind ctlabi.GroupKind
	// Tail is the sliding window in chunks; 0 for full attention.
	Tail int
	// Acc is the alignment segment in chunks of the store filter; 0 for full
	// attention.
	Acc int
}

// String is the group's --groups form: "full", "sliding:TAIL:ACC" or
// "eagle:TAIL:ACC".
func (g Group) String() string {
	if g.Kind == ctlabi.KindFull {
		return g.Kind.String()
	}
	return fmt.Sprintf("%s:%d:%d", g.Kind, g.Tail, g.Acc)
}

// ParseGroups parses a --groups value: comma-separated groups, each "full",
// "sliding:TAIL:ACC" or "eagle:TAIL:ACC" with 0 < TAIL <= ACC.
func ParseGroups(spec string) ([]Group, error) {
	var groups []Group
	for _, item := range strings.Split(spec, ",") {
		parts := strings.Split(strings.TrimSpace(item), ":")
		kind, err := ctlabi.ParseGroupKind(parts[0])
		if err != nil {
			return nil, fmt.Errorf("--groups %q: group %q: want full, sliding:TAIL:ACC or eagle:TAIL:ACC", spec, item)
		}
		g := Group{Kind: kind}
		switch {
		case kind == ctlabi.KindFull && len(parts) == 1:
		case kind != ctlabi.KindFull && len(parts) == 3:
			tail, errTail := strconv.Atoi(parts[1])
			acc, errAcc := strconv.Atoi(parts[2])
			if errTail != nil || errAcc != nil || tail <= 0 || acc < tail {
				return nil, fmt.Errorf("--groups %q: group %q: want %s:TAIL:ACC with 0 < TAIL <= ACC", spec, item, kind)
			}
			g.Tail, g.Acc = tail, acc
		default:
			return nil, fmt.Errorf("--groups %q: group %q: want full, sliding:TAIL:ACC or eagle:TAIL:ACC", spec, item)
		}
		groups = append(groups, g)
	}
	return groups, nil
}

// FormatGroups is the --groups form of groups.
func FormatGroups(groups []Group) string {
	names := make([]string, len(groups))
	for i, g := range groups {
		names[i] = g.String()
	}
	return strings.Join(names, ",")
}

// Config is one run of a scenario. Validate's errors name the `kvtierfs
// bench` flag of the offending field.
type Config struct {
	// Scenario is one of Scenarios().
	Scenario string
	// Engine is one of Engines() (--engine).
	Engine string
	// LookupBudget runs the mounts with --lookup-budget auto, else off
	// (--lookup-budget).
	LookupBudget bool
	// AtOnce has the measured cold requests of eagle and long-prefix arrive
	// together: their lookups run in the same scheduler steps, before any
	// of their prefills (--at-once).
	AtOnce bool
	// Sync turns on the filesystem's row mirroring between the nodes (--sync).
	Sync bool
	// Netns puts each node's daemon in a network namespace of its own, the
	// nodes joined by a bridge, so that rows cross veth links (--netns; root).
	Netns bool
	// Profile, when set, is the directory for the CPU profiles and CPU use
	// of the measured requests (--profile; not with Netns).
	Profile string

	// RowBytes is the size of a row and of every block file (--row-bytes), a
	// multiple of the page size.
	RowBytes int
	// Rows is the number of rows of each node's primary region (--rows).
	Rows int
	// TokensPerChunk is the tokens per chunk, i.e. per key (--tokens-per-chunk).
	TokensPerChunk int
	// WorldSize is the TP world size (--world-size); the ranks are spread
	// evenly over the nodes.
	WorldSize int
	// Nodes is 1 to MaxNodes (--nodes).
	Nodes int
	// KV is KVMLA or KVGQA (--kv).
	KV string
	// Groups are the model's KV cache groups (--groups).
	Groups []Group
	// HashSeed is the PYTHONHASHSEED analogue mixed into every chunk hash
	// (--hash-seed).
	HashSeed string
	// Model names the tier directories `<model>_<digest12>_r0` (--model).
	Model string

	// Requests is the number of prompts (--requests): distinct prompts for
	// eagle and long-prefix, agent requests for agent.
	Requests int
	// PromptTokens is the prompt length of eagle and long-prefix
	// (--prompt-tokens).
	PromptTokens int
	// Promote is the number of rows each multinode prompt promotes
	// (--promote).
	Promote int
	// Prompts is the number of distinct prompts multinode stores and then
	// asks again, measured, one after another (--prompts): the measured
	// promotions number Prompts·Promote.
	Prompts int
	// Sessions, PrefixMin, PrefixMax and SharedPrefix shape agent: Sessions
	// sessions take turns; the turns of a session grow from PrefixMin to
	// PrefixMax tokens; every session starts with the same SharedPrefix
	// tokens (--sessions, --prefix-min, --prefix-max, --shared-prefix).
	Sessions, PrefixMin, PrefixMax, SharedPrefix int

	// IOThreads is the number of tier I/O threads for stores and for loads
	// (--threads).
	IOThreads int
	// Staging turns the mounts' wave staging on (their default budget) or
	// off (--staging-bytes 0) (--staging).
	Staging bool
	// StepGap is how long the fixed engine works between waves: once a
	// wave's loads completed and reached the GPUs, it computes (prefill of
	// the remainder, decode of other requests) for this long before it
	// loads the next wave, as a real scheduler's steps do (--step-gap).
	StepGap time.Duration
	// GPU is the gpu.Open kind: "auto", "cuda" or "host" (--gpu).
	GPU string
	// GPUDevices are the CUDA devices; rank r uses GPUDevices[r % len]
	// (--gpu-devices).
	GPUDevices []int

	// ReplicatedKV is passed to the mounts as --replicated-kv when Sync is on
	// (--replicated-kv).
	ReplicatedKV string
	// Capacity is passed to the mounts as --capacity unless empty (--capacity).
	Capacity string
	// Binary is the kvtierfs binary whose `mount` the cluster runs.
	Binary string
	// Dir is where the run's stores and mountpoints go, in a new temporary
	// directory removed at the end; empty means the system's (--dir).
	Dir string
	// RegionID names the region files /dev/shm/vllm_offload_<RegionID>_<node>.mmap.
	RegionID string
	// Progress receives progress lines of long runs; nil means none.
	Progress io.Writer
}

// DefaultConfig returns the CI-sized defaults of a scenario: 256 KiB rows,
// 2048 tokens per chunk, 16 I/O threads, MLA, the fixed engine, and
//
//   - eagle: 1 node, groups full,eagle:2:8, 64 rows, 4 prompts of 100,400 tokens;
//   - multinode: 2 nodes, TP 2, group full, 128 rows, 112 rows promoted;
//   - long-prefix: 1 node, groups full,sliding:1:1, 124 rows, one prompt of
//     348,000 tokens;
//   - agent: 2 nodes, TP 2, sync on, groups full,sliding:1:1, 124 rows, 40
//     requests of 4 sessions growing from 240,000 to 350,000 tokens with a
//     shared preamble of 160,000.
//
// Binary, RegionID and Progress are left for the caller.
func DefaultConfig(scenario string) (Config, error) {
	c := Config{
		Scenario:       scenario,
		Engine:         EngineFixed,
		RowBytes:       256 << 10,
		TokensPerChunk: 2048,
		WorldSize:      1,
		Nodes:          1,
		KV:             KVMLA,
		HashSeed:       "0",
		Model:          "DeepSeek-V4-Flash",
		Requests:       1,
		IOThreads:      DefaultIOThreads,
		Staging:        true,
		LookupBudget:   true,
		GPU:            gpu.KindAuto,
		GPUDevices:     []int{0},
		ReplicatedKV:   "auto",
	}
	full := Group{Kind: ctlabi.KindFull}
	switch scenario {
	case ScenarioEagle:
		c.Groups = []Group{full, {Kind: ctlabi.KindEagle, Tail: 2, Acc: 8}}
		c.Rows, c.Requests, c.PromptTokens = 64, 4, 100_400
	case ScenarioMultinode:
		c.Groups = []Group{full}
		c.Nodes, c.WorldSize, c.Rows, c.Promote, c.Prompts = 2, 2, 128, 112, 4
	case ScenarioLongPrefix:
		c.Groups = []Group{full, {Kind: ctlabi.KindSliding, Tail: 1, Acc: 1}}
		c.Rows, c.PromptTokens = 124, 348_000
	case ScenarioAgent:
		c.Groups = []Group{full, {Kind: ctlabi.KindSliding, Tail: 1, Acc: 1}}
		c.Nodes, c.WorldSize, c.Sync, c.Rows = 2, 2, true, 124
		c.Requests, c.Sessions = 40, 4
		c.PrefixMin, c.PrefixMax, c.SharedPrefix = 240_000, 350_000, 160_000
	default:
		return c, unknownScenario(scenario)
	}
	return c, nil
}

func unknownScenario(name string) error {
	return fmt.Errorf("unknown scenario %q: want one of %s", name, strings.Join(Scenarios(), ", "))
}

// MaxNodes is the most nodes a cluster has: the TP groups of the field run
// on 2 to 4 nodes (issue 28).
const MaxNodes = 4

// SlotBytes is the bytes of one rank's slot in a row: the row divided by the
// world size, rounded down to whole pages; the rest of the row is padding.
func (c Config) SlotBytes() int {
	return c.RowBytes / c.WorldSize / engineio.PageSize * engineio.PageSize
}

// Validate checks the configuration and names the bench flag of the first
// bad field with its allowed values.
func (c Config) Validate() error {
	if _, err := DefaultConfig(c.Scenario); err != nil {
		return err
	}
	positive := []struct {
		flag  string
		value int
	}{
		{"--rows", c.Rows}, {"--tokens-per-chunk", c.TokensPerChunk}, {"--world-size", c.WorldSize},
		{"--requests", c.Requests}, {"--threads", c.IOThreads},
	}
	for _, p := range positive {
		if p.value <= 0 {
			return fmt.Errorf("%s %d: want a positive number", p.flag, p.value)
		}
	}
	switch {
	case c.StepGap < 0:
		return fmt.Errorf("--step-gap %v: want a duration of at least 0", c.StepGap)
	case !slices.Contains(Engines(), c.Engine):
		return fmt.Errorf("--engine %q: want one of %s", c.Engine, strings.Join(Engines(), ", "))
	case c.RowBytes <= 0 || c.RowBytes%engineio.PageSize != 0:
		return fmt.Errorf("--row-bytes %d: want a positive multiple of %d (the field's row is %d)", c.RowBytes, engineio.PageSize, FieldRowBytes)
	case c.Nodes < 1 || c.Nodes > MaxNodes:
		return fmt.Errorf("--nodes %d: want 1 to %d", c.Nodes, MaxNodes)
	case c.WorldSize%c.Nodes != 0:
		return fmt.Errorf("--world-size %d: want a multiple of --nodes %d (the same number of GPUs on every node)", c.WorldSize, c.Nodes)
	case c.SlotBytes() == 0:
		return fmt.Errorf("--row-bytes %d: too small for --world-size %d slots of at least one page", c.RowBytes, c.WorldSize)
	case c.Profile != "" && c.Netns:
		return fmt.Errorf("--profile: not with --netns (the daemons' pprof endpoints listen on loopback)")
	case c.Sync && c.Nodes == 1:
		return fmt.Errorf("--sync on: needs --nodes 2 or more (a single node has no peer to mirror rows to)")
	case c.KV != KVMLA && c.KV != KVGQA:
		return fmt.Errorf("--kv %q: want %s or %s", c.KV, KVMLA, KVGQA)
	case len(c.Groups) == 0:
		return fmt.Errorf("--groups: want at least one group")
	case c.Model == "" || strings.ContainsAny(c.Model, "/\x00") || c.Model == "." || c.Model == "..":
		return fmt.Errorf("--model %q: want a non-empty name without '/'", c.Model)
	case c.GPU != gpu.KindAuto && c.GPU != gpu.KindCUDA && c.GPU != gpu.KindHost:
		return fmt.Errorf("--gpu %q: want %s, %s or %s", c.GPU, gpu.KindAuto, gpu.KindCUDA, gpu.KindHost)
	case len(c.GPUDevices) == 0:
		return fmt.Errorf("--gpu-devices: want at least one device index")
	case c.ReplicatedKV != "auto" && c.ReplicatedKV != "on" && c.ReplicatedKV != "off":
		return fmt.Errorf("--replicated-kv %q: want auto, on or off", c.ReplicatedKV)
	case c.Binary == "":
		return fmt.Errorf("no kvtierfs binary to run `mount` with")
	}
	for _, d := range c.GPUDevices {
		if d < 0 {
			return fmt.Errorf("--gpu-devices: device %d: want indices >= 0", d)
		}
	}
	for i, g := range c.Groups {
		if g.Kind != ctlabi.KindFull && (g.Tail <= 0 || g.Acc < g.Tail) {
			return fmt.Errorf("--groups: group %d (%s): want 0 < TAIL <= ACC", i, g)
		}
	}
	return c.validateScenario()
}

// validateScenario checks the fields that shape the scenario's prompts.
func (c Config) validateScenario() error {
	chunk := c.TokensPerChunk
	if c.AtOnce && c.Scenario != ScenarioEagle && c.Scenario != ScenarioLongPrefix {
		return fmt.Errorf("--at-once: applies to %s and %s only", ScenarioEagle, ScenarioLongPrefix)
	}
	switch c.Scenario {
	case ScenarioEagle, ScenarioLongPrefix:
		if c.PromptTokens <= chunk {
			return fmt.Errorf("--prompt-tokens %d: want more than one chunk (--tokens-per-chunk %d)", c.PromptTokens, chunk)
		}
	case ScenarioMultinode:
		if c.Promote <= 0 {
			return fmt.Errorf("--promote %d: want a positive number of rows", c.Promote)
		}
		if c.Prompts <= 0 {
			return fmt.Errorf("--prompts %d: want a positive number of prompts", c.Prompts)
		}
	case ScenarioAgent:
		switch {
		case c.Sessions <= 0 || c.Sessions > c.Requests:
			return fmt.Errorf("--sessions %d: want between 1 and --requests %d", c.Sessions, c.Requests)
		case c.PrefixMin <= chunk || c.PrefixMax < c.PrefixMin:
			return fmt.Errorf("--prefix-min %d --prefix-max %d: want more than one chunk (%d tokens) and min <= max", c.PrefixMin, c.PrefixMax, chunk)
		case c.SharedPrefix < 0 || c.SharedPrefix > c.PrefixMin:
			return fmt.Errorf("--shared-prefix %d: want between 0 and --prefix-min %d", c.SharedPrefix, c.PrefixMin)
		}
	}
	return nil
}
