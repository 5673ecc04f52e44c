package mount_test

import (
	"os"
	"strings"
	"testing"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
	"github.com/kvtierfs/kvtierfs/staging/match"
)

// matchThroughMount writes a request to the mount's match file and reads the
// answer back on the same descriptor.
func matchThroughMount(t *testing.T, d *mounttest.Daemon, request []byte) []byte {
	t.Helper()
	f, err := os.OpenFile(d.Path(ctlabi.Dir, ctlabi.MatchFile), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(request); err != nil {
		t.Fatal(err)
	}
	answer := make([]byte, 1<<16)
	n, err := f.ReadAt(answer, 0)
	if n == 0 {
		t.Fatalf("reading the match answer: %v", err)
	}
	return answer[:n]
}

// TestMatchControlFile stores a full-attention group and an EAGLE group the
// way the stock and the fixed engines retain them, and matches the prompt
// through .kvtier/match: the answer equals vLLM's rules evaluated with
// faccessat through the mount, the stock retention never hits (the field's
// failure) and the fixed one does.
func TestMatchControlFile(t *testing.T) {
	const chunks, tail, acc = 40, 2, 8
	for _, fixed := range []bool{false, true} {
		name := map[bool]string{false: "stock retention", true: "fixed retention"}[fixed]
		t.Run(name, func(t *testing.T) {
			d := mounttest.Start(t, mounttest.Options{})
			tier := openTier(t, d)
			region := newRegion(t, 1)
			retained := match.StockRetained
			if fixed {
				retained = match.Retained
			}
			full := ctlabi.GroupSpec{Group: 0, Kind: ctlabi.KindFull}
			eagle := ctlabi.GroupSpec{Group: 1, Kind: ctlabi.KindEagle, Tail: tail, Acc: acc}
			for c := 0; c < chunks; c++ {
				full.Keys = append(full.Keys, hashOf(c))
				eagle.Keys = append(eagle.Keys, hashOf(1000+c))
				fillRow(region.Row(0), c)
				if _, err := tier.Store(tier.BlockPath(tierDir, 0, hashOf(c)), region.Row(0)); err != nil {
					t.Fatal(err)
				}
				if retained(ctlabi.KindEagle, tail, acc, c) {
					if _, err := tier.Store(tier.BlockPath(tierDir, 1, hashOf(1000+c)), region.Row(0)); err != nil {
						t.Fatal(err)
					}
				}
			}
			req := ctlabi.MatchRequest{Tier: tierDir, Groups: []ctlabi.GroupSpec{full, eagle}}
			body, err := ctlabi.EncodeMatchRequest(req)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ctlabi.DecodeMatchResult(matchThroughMount(t, d, body))
			if err != nil {
				t.Fatal(err)
			}
			want, err := match.Hit(req, func(group int, key string) bool {
				return tier.Exists(tier.BlockPath(tierDir, group, key))
			})
			if err != nil {
				t.Fatal(err)
			}
			if got.HitChunks != want.HitChunks {
				t.Fatalf("match file: %d hit chunks, faccessat with the same rules: %d", got.HitChunks, want.HitChunks)
			}
			if fixed != (got.HitChunks > 0) {
				t.Fatalf("%s: %d hit chunks", name, got.HitChunks)
			}
			if st := d.Stats(); st.Counters.Matches != 1 || st.Staging == nil || st.Staging.Bytes != 0 {
				t.Fatalf("after one match: %d matches, staging %+v; matching must stage nothing", st.Counters.Matches, st.Staging)
			}
		})
	}
}

// TestMatchRefusesBadRequests checks that a malformed request gets an error
// answer naming the problem, and the daemon keeps serving.
func TestMatchRefusesBadRequests(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	for request, want := range map[string]string{
		`{"tier":"t","groups":[{"group":0,"kind":"bogus","keys":["ab12ab12ab12"]}]}`: "kind",
		`not json`: "error",
		`{"tier":"t","groups":[{"group":0,"kind":"sliding","tail":4,"acc":2,"keys":["ab12ab12ab12"]}]}`: "acc",
	} {
		answer := string(matchThroughMount(t, d, []byte(request)))
		if !strings.Contains(answer, `"error"`) || !strings.Contains(answer, want) {
			t.Errorf("request %s: answer %s, want an error about %q", request, answer, want)
		}
	}
	if !d.Running() {
		t.Fatal("the daemon died on a bad match request")
	}
}
