package diagnose

import (
	"strings"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// workload drives a Diagnostics through a fake clock.
type workload struct {
	d     *Diagnostics
	clock *fakeClock
}

const diagBlock = 64 << 10 // block size of the diagnostics workloads

func (w workload) store(keys []block.Ref) {
	for _, k := range keys {
		w.d.Stored(k, diagBlock)
	}
}

func (w workload) read(keys []block.Ref) {
	for _, k := range keys {
		w.d.Read(k, diagBlock)
	}
}

func (w workload) lookUp(keys []block.Ref, present bool) {
	for _, k := range keys {
		w.d.LookedUp(k, present)
	}
}

// minutes runs step once a minute for n minutes, then advances a minute.
func (w workload) minutes(n int, step func(minute int)) {
	for m := range n {
		step(m)
		w.clock.Advance(time.Minute)
	}
}

// prompt is the keys of chunks [from, from+n) of a tier's group.
func prompt(tier string, group, from, n int) []block.Ref {
	return chunkKeys(tier, group, from+n)[from:]
}

func TestDiagnostics(t *testing.T) {
	opts := Options{
		Window:           10 * time.Minute,
		ReadGrace:        30 * time.Second,
		MinStoredBytes:   4 << 20, // 64 blocks
		MinLookups:       200,
		MinStores:        20,
		MinNeverLookedUp: 500,
		MinWaiting:       16,
	}
	// healthy is a workload that reuses its prefixes: each minute it looks
	// up last minute's prompt (present) and a new one (absent), loads the
	// hit and stores the new prompt, in groups 0 and 1.
	healthy := func(w workload) {
		w.minutes(12, func(m int) {
			for g := range 2 {
				old, fresh := prompt(tierA, g, 20*m, 20), prompt(tierA, g, 20*(m+1), 20)
				if m > 0 {
					w.lookUp(old, true)
					w.read(old)
				}
				w.lookUp(fresh[:1], false)
				w.store(fresh)
			}
		})
	}
	settled := StoreState{Blocks: 480, NeverLookedUp: 40, PrimaryRows: 100}

	for _, tc := range []struct {
		name     string
		run      func(w workload)
		state    StoreState
		want     string   // the warning code expected, "" for none
		evidence []string // text the message must hold
	}{
		{name: "healthy", run: healthy, state: settled},
		{name: "healthy, rows unknown", run: healthy, state: StoreState{Blocks: 480, NeverLookedUp: 40}},

		// write_only_group: the EAGLE group 1 is stored but never hits.
		{name: "write-only group", state: settled, want: ctlabi.WarnWriteOnlyGroup,
			evidence: []string{"tier " + tierA + ", group 1:", "5.6 MiB stored in 90 blocks", "group(s) 0 read"},
			run: func(w workload) {
				w.minutes(12, func(m int) {
					w.lookUp(prompt(tierA, 0, 0, 10), true)
					w.read(prompt(tierA, 0, 0, 10))
					w.store(prompt(tierA, 1, 10*m, 10))
				})
			}},
		{name: "group read before the window", state: settled, want: ctlabi.WarnWriteOnlyGroup,
			evidence: []string{"group 1:"},
			run: func(w workload) {
				w.read(prompt(tierA, 1, 0, 10)) // 12 minutes ago: out of the window
				w.minutes(12, func(m int) {
					w.read(prompt(tierA, 0, 0, 10))
					w.store(prompt(tierA, 1, 10*m, 10))
				})
			}},
		{name: "both groups read", state: settled,
			run: func(w workload) {
				w.minutes(12, func(m int) {
					w.read(prompt(tierA, 0, 0, 10))
					w.read(prompt(tierA, 1, 0, 1))
					w.store(prompt(tierA, 1, 10*m, 10))
				})
			}},
		{name: "other tier read", state: settled,
			run: func(w workload) {
				w.minutes(12, func(m int) {
					w.read(prompt(tierB, 0, 0, 10))
					w.store(prompt(tierA, 1, 10*m, 1)) // below MinStoredBytes
				})
			}},
		{name: "group stores too little", state: settled,
			run: func(w workload) {
				w.minutes(12, func(m int) {
					w.read(prompt(tierA, 0, 0, 10))
					w.store(prompt(tierA, 1, m, 1))
				})
			}},

		// write_only_tier: the engine stores, never loads, never looks up.
		{name: "write-only tier", state: settled, want: ctlabi.WarnWriteOnlyTier,
			evidence: []string{"written in 180 blocks", "nothing read in the last 10m0s", "0 lookups"},
			run: func(w workload) {
				w.minutes(12, func(m int) {
					w.store(prompt(tierA, 0, 10*m, 10))
					w.store(prompt(tierA, 1, 10*m, 10))
				})
			}},
		{name: "write-only for less than a window", state: settled,
			run: func(w workload) {
				w.minutes(5, func(m int) {
					w.store(prompt(tierA, 0, 100*m, 100))
				})
			}},
		{name: "one read in the window", state: settled,
			run: func(w workload) {
				w.minutes(12, func(m int) {
					w.store(prompt(tierA, 0, 10*m, 10))
				})
				w.read(prompt(tierA, 0, 0, 1))
			}},

		// hash_seed_drift: new keys miss, old blocks are never asked for.
		{name: "hash seed drift", state: StoreState{Blocks: 5000, NeverLookedUp: 4800, PrimaryRows: 100},
			want:     ctlabi.WarnHashSeedDrift,
			evidence: []string{"found 1 of 302 keys (0.33%)", "30 new blocks", "4800 of the 5000 blocks", "vLLM PR #51875", "--prefix-caching-hash-algo", "Only the xxhash algorithms still depend on PYTHONHASHSEED"},
			run: func(w workload) {
				w.minutes(3, func(m int) {
					w.lookUp(prompt(tierB, 0, 100*m, 100), false)
					w.store(prompt(tierB, 0, 100*m, 10))
				})
				w.lookUp(prompt(tierB, 0, 0, 1), true)
				w.lookUp(prompt(tierB, 0, 0, 1), false)
				w.read(prompt(tierB, 0, 0, 1))
			}},
		{name: "lookups hit", state: StoreState{Blocks: 5000, NeverLookedUp: 4800, PrimaryRows: 100},
			run: func(w workload) {
				w.minutes(3, func(m int) {
					w.lookUp(prompt(tierB, 0, 100*m, 90), false)
					w.lookUp(prompt(tierB, 0, 100*m+90, 10), true)
					w.read(prompt(tierB, 0, 100*m+90, 10))
					w.store(prompt(tierB, 0, 100*m, 10))
				})
			}},
		{name: "fresh store misses", state: StoreState{Blocks: 300, NeverLookedUp: 300, PrimaryRows: 100},
			run: func(w workload) {
				w.minutes(3, func(m int) {
					w.lookUp(prompt(tierB, 0, 100*m, 100), false)
					w.store(prompt(tierB, 0, 100*m, 100))
				})
			}},
		{name: "misses without new stores", state: StoreState{Blocks: 5000, NeverLookedUp: 4800, PrimaryRows: 100},
			run: func(w workload) {
				w.minutes(3, func(m int) {
					w.lookUp(prompt(tierB, 0, 100*m, 100), false)
				})
			}},

		// primary_tier_exhausted: the stock engine promotes while it matches.
		{name: "reads pinned at the row count", state: settled, want: ctlabi.WarnPrimaryTierExhausted,
			evidence: []string{"900 keys answered present", "while 100 were read after answering present", "100 rows"},
			run: func(w workload) {
				keys := prompt(tierA, 0, 0, 1000)
				w.minutes(3, func(int) {
					w.lookUp(keys, true)
				})
				w.read(keys[:100])
			}},
		{name: "present keys pinned, nothing read", state: settled, want: ctlabi.WarnPrimaryTierExhausted,
			evidence: []string{"98 keys answered present", "while 0 were read"},
			run: func(w workload) {
				w.minutes(3, func(int) {
					w.lookUp(prompt(tierA, 0, 0, 98), true)
				})
			}},
		{name: "every present key read", state: settled,
			run: func(w workload) {
				keys := prompt(tierA, 0, 0, 1000)
				w.minutes(3, func(m int) {
					w.lookUp(keys, true)
					w.read(keys[m*100 : (m+1)*100])
				})
				w.read(keys)
			}},
		{name: "reads far past the row count", state: settled,
			run: func(w workload) {
				keys := prompt(tierA, 0, 0, 1000)
				w.minutes(3, func(int) {
					w.lookUp(keys, true)
				})
				w.read(keys[:500])
			}},
		{name: "fewer waiting than rows", state: settled,
			run: func(w workload) {
				w.minutes(3, func(int) {
					w.lookUp(prompt(tierA, 0, 0, 50), true)
				})
			}},
		{name: "waiting within the read grace", state: settled,
			run: func(w workload) {
				w.lookUp(prompt(tierA, 0, 0, 1000), true)
				w.clock.Advance(10 * time.Second)
			}},
		{name: "waiting keys out of the window", state: settled,
			run: func(w workload) {
				w.lookUp(prompt(tierA, 0, 0, 1000), true)
				w.clock.Advance(11 * time.Minute)
			}},
		{name: "rows unknown", state: StoreState{Blocks: 480, NeverLookedUp: 40},
			run: func(w workload) {
				w.minutes(3, func(int) {
					w.lookUp(prompt(tierA, 0, 0, 1000), true)
				})
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			o := opts
			o.Now = clock.Now
			w := workload{d: New(o), clock: clock}
			tc.run(w)
			got := w.d.Warnings(tc.state)
			switch {
			case tc.want == "" && len(got) > 0:
				t.Fatalf("healthy workload warned: %+v", got)
			case tc.want == "":
				return
			case len(got) != 1 || got[0].Code != tc.want:
				t.Fatalf("warnings %+v, want one %s", got, tc.want)
			}
			for _, text := range tc.evidence {
				if !strings.Contains(got[0].Message, text) {
					t.Errorf("message lacks %q:\n%s", text, got[0].Message)
				}
			}
		})
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 502 << 30: "502.0 GiB", 3 << 40: "3.0 TiB"} {
		if got := formatBytes(n); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestDiagnosticsTracksBoundedKeys(t *testing.T) {
	clock := newFakeClock()
	d := New(Options{Now: clock.Now, MaxTrackedKeys: 10, MinWaiting: 1, Window: time.Minute, ReadGrace: time.Second})
	for _, k := range prompt(tierA, 0, 0, 20) {
		d.LookedUp(k, true)
	}
	if len(d.waiting) != 10 {
		t.Fatalf("%d keys tracked, limit 10", len(d.waiting))
	}
	clock.Advance(2 * time.Minute) // the tracked keys leave the window
	for _, k := range prompt(tierA, 0, 20, 10) {
		d.LookedUp(k, true)
	}
	clock.Advance(2 * time.Second)
	got := d.Warnings(StoreState{PrimaryRows: 10})
	if len(got) != 1 || got[0].Code != ctlabi.WarnPrimaryTierExhausted || !strings.HasPrefix(got[0].Message, "10 keys answered present") {
		t.Errorf("warnings %+v, want the 10 new keys waiting", got)
	}
}
