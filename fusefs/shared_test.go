package fusefs

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtierfs/kvtierfs/tiers/shared"
)

// fakeShared is a shared level that only has stats.
type fakeShared struct{ st shared.Stats }

func (f fakeShared) Lookup(string) bool           { return false }
func (f fakeShared) Size(string) (int64, bool)    { return 0, false }
func (f fakeShared) LookedUp(string, int64)       {}
func (f fakeShared) Fetch(string) ([]byte, error) { return nil, nil }
func (f fakeShared) Stats() shared.Stats          { return f.st }

// TestSharedMetricsAndWarnings: every numeric and boolean field of the
// "shared" stats is a kvtierfs_shared_<field> metric, and an unreachable
// shared store raises its warning.
func TestSharedMetricsAndWarnings(t *testing.T) {
	st := shared.Stats{Dir: "/shared", Reachable: false, QueueBlocks: 3, BytesBehind: 7, LeaseHolder: "node-b", Timeouts: 2}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(sharedCollector{fakeShared{st}}); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		got[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
	}
	raw, _ := json.Marshal(st)
	var fields map[string]any
	json.Unmarshal(raw, &fields)
	for name, v := range fields {
		if _, text := v.(string); text {
			continue
		}
		if _, ok := got["kvtierfs_shared_"+name]; !ok {
			t.Errorf("no metric kvtierfs_shared_%s", name)
		}
	}
	if got["kvtierfs_shared_queue_blocks"] != 3 || got["kvtierfs_shared_reachable"] != 0 || got["kvtierfs_shared_timeouts"] != 2 {
		t.Errorf("metric values %v", got)
	}
	warnings := sharedWarnings(st)
	if len(warnings) != 1 || warnings[0].Code != "shared_unreachable" || !strings.Contains(warnings[0].Message, "/shared") {
		t.Errorf("warnings %+v", warnings)
	}
}
