package rowsync

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
)

// Mode is the --replicated-kv setting: whether the KV cache is replicated
// across ranks (MLA), which is the only case where copying one node's row
// onto another is right. It implements flag.Value (and pflag.Value).
type Mode uint8

// Modes.
const (
	// ModeAuto mirrors once store samples showed identical rows on every
	// node, and never after a sample differed.
	ModeAuto Mode = iota
	// ModeOn always mirrors.
	ModeOn
	// ModeOff never mirrors.
	ModeOff
)

// ParseMode parses a replicated-KV mode: auto, on or off.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "auto":
		return ModeAuto, nil
	case "on":
		return ModeOn, nil
	case "off":
		return ModeOff, nil
	}
	return ModeAuto, fmt.Errorf("replicated-KV mode %q: want auto, on or off", s)
}

// String returns "auto", "on" or "off".
func (m Mode) String() string {
	switch m {
	case ModeOn:
		return "on"
	case ModeOff:
		return "off"
	}
	return "auto"
}

// Set parses s into m (flag.Value).
func (m *Mode) Set(s string) error {
	v, err := ParseMode(s)
	if err == nil {
		*m = v
	}
	return err
}

// Type names the flag's value type (pflag.Value).
func (*Mode) Type() string { return "auto|on|off" }

const (
	// firstSamples is how many store samples are taken from the first stores.
	firstSamples = 16
	// sampleEvery keeps sampling one store in sampleEvery afterwards.
	sampleEvery = 64
)

// Gate decides whether promoted rows may be mirrored. In ModeAuto the
// evidence is store samples: when a block is stored, its row sits in every
// node's region (each node's worker wrote its own copy), so equal checksums
// of that row on two nodes are a "replicated" sample and different ones a
// mismatch. Before the first sample, and forever after a mismatch, auto does
// not mirror. Samples are counted in every mode, so that stat shows a
// mismatch even when the flag forces mirroring on.
type Gate struct {
	mode   Mode
	logf   func(format string, args ...any)
	stores atomic.Uint64

	// notes keeps the samples across restarts; nil keeps them in memory.
	notes Notes

	mu            sync.Mutex // guards the fields below
	samples       uint64
	mismatches    uint64
	decidedBy     string
	firstMismatch string
}

// GateSnapshot is the replication section of stat. Samples counts identical
// store samples, Mismatches differing ones, and FirstMismatch describes the
// first of those (in auto it is also DecidedBy).
type GateSnapshot struct {
	Mode          string
	Allowed       bool
	DecidedBy     string
	Samples       uint64
	Mismatches    uint64
	FirstMismatch string
}

// NewGate returns a gate in mode; logf (nil: discard) hears its decisions.
func NewGate(mode Mode, logf func(format string, args ...any)) *Gate {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	g := &Gate{mode: mode, logf: logf, decidedBy: "no store samples yet"}
	if mode != ModeAuto {
		g.decidedBy = "flag --replicated-kv=" + mode.String()
	}
	return g
}

// Notes keeps small records across restarts of the daemon (the store's
// tiers/disk.Store.ReadNote and WriteNote); ReadNote's error wraps
// fs.ErrNotExist for a note never written.
type Notes interface {
	ReadNote(name string) ([]byte, error)
	WriteNote(name string, value []byte) error
}

// evidenceNote is the note that holds the gate's store samples.
const evidenceNote = "replication"

// evidence is the gate's record in its note.
type evidence struct {
	Samples       uint64 `json:"samples"`
	Mismatches    uint64 `json:"mismatches"`
	FirstMismatch string `json:"first_mismatch,omitempty"`
}

// Remember makes the gate keep its samples in notes and takes up those of
// an earlier run: after a restart on a full store, where the engine stores
// nothing new to sample, auto mirrors (or not) as it did before. A note
// that cannot be read or decoded is reported and counts as none.
func (g *Gate) Remember(notes Notes) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.notes = notes
	raw, err := notes.ReadNote(evidenceNote)
	if err != nil {
		return err
	}
	var e evidence
	if err := json.Unmarshal(raw, &e); err != nil {
		return fmt.Errorf("decoding the replication note %q: %w", raw, err)
	}
	g.samples, g.mismatches, g.firstMismatch = e.Samples, e.Mismatches, e.FirstMismatch
	if g.mode != ModeAuto {
		return nil
	}
	switch {
	case g.mismatches > 0:
		g.decidedBy = g.firstMismatch + " (before a restart)"
	case g.samples > 0:
		g.decidedBy = fmt.Sprintf("%d identical store samples (%d before a restart)", g.samples, g.samples)
	}
	return nil
}

// saveLocked writes the samples to the notes; g.mu is held.
func (g *Gate) saveLocked() {
	if g.notes == nil {
		return
	}
	raw, _ := json.Marshal(evidence{Samples: g.samples, Mismatches: g.mismatches, FirstMismatch: g.firstMismatch})
	if err := g.notes.WriteNote(evidenceNote, raw); err != nil {
		g.logf("rowsync: keeping the store samples for a restart: %v", err)
	}
}

// Allowed reports whether rows may be mirrored now.
func (g *Gate) Allowed() bool {
	switch g.mode {
	case ModeOn:
		return true
	case ModeOff:
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.samples > 0 && g.mismatches == 0
}

// WantSample is called once per stored block and says whether to sample
// this one: until firstSamples samples were taken, then one store in sampleEvery.
func (g *Gate) WantSample() bool {
	n := g.stores.Add(1)
	g.mu.Lock()
	taken := g.samples + g.mismatches
	g.mu.Unlock()
	return taken < firstSamples || n%sampleEvery == 0
}

// NoteSample records one comparison: the row holding key has CRC32C here on
// this node and there on node peer.
func (g *Gate) NoteSample(key string, here, there uint32, peer string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	defer g.saveLocked()
	if here != there {
		g.mismatches++
		if g.mismatches == 1 {
			g.firstMismatch = fmt.Sprintf("store sample %q: row CRC32C %08x here, %08x on %s: KV is not replicated across ranks", key, here, there, peer)
			if g.mode == ModeAuto {
				g.decidedBy = g.firstMismatch
				g.logf("rowsync: mirroring disabled: %s", g.firstMismatch)
			} else {
				g.logf("rowsync: --replicated-kv=%s, but %s", g.mode, g.firstMismatch)
			}
		}
		return
	}
	g.samples++
	if g.mode == ModeAuto && g.mismatches == 0 {
		if g.samples == 1 {
			g.logf("rowsync: mirroring enabled: store sample %q identical on %s", key, peer)
		}
		g.decidedBy = fmt.Sprintf("%d identical store samples", g.samples)
	}
}

// Snapshot returns the gate's state for stat.
func (g *Gate) Snapshot() GateSnapshot {
	allowed := g.Allowed()
	g.mu.Lock()
	defer g.mu.Unlock()
	return GateSnapshot{
		Mode:          g.mode.String(),
		Allowed:       allowed,
		DecidedBy:     g.decidedBy,
		Samples:       g.samples,
		Mismatches:    g.mismatches,
		FirstMismatch: g.firstMismatch,
	}
}
