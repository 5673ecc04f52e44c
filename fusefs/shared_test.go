package fusefs

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/tiers/shared"
)

// fakeShared is a shared level that only has stats.
type fakeShared struct{ st shared.Stats }

func (f fakeShared) Lookup(string) bool           { return false }
func (f fakeShared) Size(string) (int64, bool)    { return 0, false }
func (f fakeShared) LookedUp(string, int64)       {}
func (f fakeShared) Published(string, int64)      {}
func (f fakeShared) Fetch(string) ([]byte, error) { return nil, nil }
func (f fakeShared) Stats() shared.Stats          { return f.st }

// TestSharedMetricsAndWarnings: every number of the "shared" section is a
// kvtierfs_shared_<field> gauge of its value, lease_held labelled with the
// holder, and an unreachable shared store raises its warning.
func TestSharedMetricsAndWarnings(t *testing.T) {
	f := newStatsFS(t, Options{Shared: fakeShared{shared.Stats{Dir: "/shared", Reachable: false, QueueBlocks: 3, BytesBehind: 7, LeaseHolder: "node-b", LeaseHeld: true, Timeouts: 2}}})
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(newStatsCollector(f.Stats)); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, family := range families {
		m := family.GetMetric()[0]
		got[family.GetName()] = m.GetGauge().GetValue()
		if family.GetName() == "kvtierfs_shared_lease_held" {
			if labels := m.GetLabel(); len(labels) != 1 || labels[0].GetName() != "holder" || labels[0].GetValue() != "node-b" {
				t.Errorf("kvtierfs_shared_lease_held's labels %v, want holder=node-b", labels)
			}
		}
	}
	exported := 0
	for _, m := range ctlabi.Metrics {
		if strings.HasPrefix(m.Field, "shared.") {
			if _, ok := got[m.Name]; !ok {
				t.Errorf("no metric %s", m.Name)
			}
			exported++
		}
	}
	if exported == 0 {
		t.Error("ctlabi.Metrics lists no number of the shared section")
	}
	for name, want := range map[string]float64{"kvtierfs_shared_queue_blocks": 3, "kvtierfs_shared_reachable": 0,
		"kvtierfs_shared_timeouts": 2, "kvtierfs_shared_bytes_behind": 7, "kvtierfs_shared_lease_held": 1} {
		if value, ok := got[name]; !ok || value != want {
			t.Errorf("%s = %v (exported %v), want %v", name, value, ok, want)
		}
	}
	var warnings []ctlabi.Warning
	for _, w := range f.Stats().Warnings {
		if strings.HasPrefix(w.Code, "shared_") {
			warnings = append(warnings, w)
		}
	}
	if len(warnings) != 1 || warnings[0].Code != ctlabi.WarnSharedUnreachable || !strings.Contains(warnings[0].Message, "/shared") {
		t.Errorf("warnings %+v", warnings)
	}
}
