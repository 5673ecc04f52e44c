package fusefs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/prime"
	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// TestMain runs the lookup helper when the test binary is started as one.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == prime.HelperCommand {
		os.Exit(prime.Main(os.Args[2:], os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

// When the kernel looks a tier up afresh, the lookup helper looks its
// prefix names up: the engine's lookups of absent keys then end in the
// kernel's cache and never reach the daemon, the helper's own lookups do not
// count as the engine's misses, and a present block's lookup still reaches
// the daemon (which protects what it says is present). Unprimed, the same
// lookups reach the daemon, one per missing prefix.
func TestLookupsOfAPrimedTierStayInTheKernel(t *testing.T) {
	for _, primed := range []bool{false, true} {
		t.Run(fmt.Sprintf("primed=%v", primed), func(t *testing.T) {
			mnt := t.TempDir()
			diag := &recordingDiagnoser{}
			opts := Options{Diagnostics: diag}
			var helper *prime.Helper
			if primed {
				var err error
				if helper, err = prime.Start(os.Args[0], mnt, slog.New(slog.DiscardHandler)); err != nil {
					t.Fatal(err)
				}
				defer helper.Close() // before the unmount the cleanup does
				opts.Primer = helper
			}
			f := mountInProcessAt(t, mnt, opts)
			const tier = "M_0123456789ab_r0"
			if err := os.Mkdir(filepath.Join(mnt, tier), 0o700); err != nil {
				t.Fatal(err)
			}
			h := "abc" + strings.Repeat("d", 61)
			rel := fmt.Sprintf("%s/%s/%s_g0/%s.bin", tier, h[:3], h[3:5], h)
			if err := f.store.Import(rel, bytes.Repeat([]byte{7}, 2*block.PageSize)); err != nil {
				t.Fatal(err)
			}
			// The kernel forgets the tier, as after dropping its caches.
			if errno := f.root.EmbeddedInode().NotifyEntry(tier); errno != 0 {
				t.Fatalf("invalidating the tier's entry: %v", errno)
			}
			if _, err := os.Stat(filepath.Join(mnt, tier)); err != nil {
				t.Fatal(err)
			}
			if primed {
				deadline := time.Now().Add(time.Minute)
				for helper.Looked() < prime.PrefixNames+1 { // and the block's group directory
					if time.Now().After(deadline) {
						t.Fatalf("the helper looked up %d names of the tier, want %d", helper.Looked(), prime.PrefixNames+1)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			if c := f.Stats().Counters; primed && (c.TiersPrimed != 1 || c.NamesPrimed != helper.Looked()) {
				t.Errorf("stats: tiers primed %d, names primed %d; want 1 and the helper's %d", c.TiersPrimed, c.NamesPrimed, helper.Looked())
			}
			if missed := missedLookups(diag); len(missed) != 0 {
				t.Fatalf("priming counted as the engine's missed lookups: %d, e.g. %s", len(missed), missed[0])
			}
			lookups := f.store.Counters().Lookups.Load()
			const absent = 50
			for i := range absent {
				k := fmt.Sprintf("%03x", i) + strings.Repeat("0", 61)
				_, err := os.Stat(filepath.Join(mnt, fmt.Sprintf("%s/%s/%s_g0/%s.bin", tier, k[:3], k[3:5], k)))
				if !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("lookup of an absent key: %v", err)
				}
			}
			reached := f.store.Counters().Lookups.Load() - lookups
			switch {
			case primed && (reached != 0 || len(missedLookups(diag)) != 0):
				t.Errorf("%d lookups of absent keys under a primed tier reached the daemon, want 0", reached)
			case !primed && reached != absent:
				t.Errorf("%d lookups of absent keys under missing prefixes reached the daemon, want %d", reached, absent)
			}
			if primed {
				// The kernel drops some of the tier's prefix names but keeps
				// the tier (memory pressure takes the leaves first): the
				// engine's lookup that reaches the daemon primes it again.
				tierNode := f.root.EmbeddedInode().GetChild(tier)
				for i := range 3 {
					if errno := tierNode.NotifyEntry(fmt.Sprintf("%03x", i)); errno != 0 {
						t.Fatalf("invalidating a prefix name: %v", errno)
					}
				}
				time.Sleep(prime.Interval)
				k := strings.Repeat("0", 64)
				if _, err := os.Stat(filepath.Join(mnt, fmt.Sprintf("%s/%s/%s_g0/%s.bin", tier, k[:3], k[3:5], k))); !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("lookup of an absent key: %v", err)
				}
				deadline := time.Now().Add(time.Minute)
				for helper.Looked() < 2*(prime.PrefixNames+1) {
					if time.Now().After(deadline) {
						t.Fatalf("the helper looked up %d names, want the tier primed again after a prefix name was dropped (%d)", helper.Looked(), 2*(prime.PrefixNames+1))
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			hits := f.store.Counters().LookupHits.Load()
			if _, err := os.Stat(filepath.Join(mnt, rel)); err != nil {
				t.Fatalf("lookup of the present block: %v", err)
			}
			if got := f.store.Counters().LookupHits.Load() - hits; got != 1 {
				t.Errorf("the present block's lookup reached the daemon %d times, want 1", got)
			}
		})
	}
}

// missedLookups are the diagnostics' missed-lookup events.
func missedLookups(d *recordingDiagnoser) []string {
	var missed []string
	for _, e := range d.seen() {
		if strings.HasPrefix(e, "missed ") {
			missed = append(missed, e)
		}
	}
	return missed
}
