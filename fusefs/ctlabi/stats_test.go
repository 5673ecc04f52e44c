package ctlabi

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
)

// exportedElsewhere are numbers of stats.json that Metrics leaves to other
// collectors, and which.
var exportedElsewhere = map[string]string{
	"counters.kv_events_published": "fusefs/kvevents",
	"counters.kv_events_dropped":   "fusefs/kvevents",
}

// numberedStats returns a Stats whose every number in counters, disk,
// descriptors, staging and shared is distinct, so a metric reading the wrong field shows
// (its booleans alternate, true first, so two of them differ).
func numberedStats() Stats {
	st := Stats{Staging: &Staging{}, Shared: &Shared{}}
	next := int64(1)
	flag := false
	for _, v := range []reflect.Value{reflect.ValueOf(&st.Counters).Elem(), reflect.ValueOf(&st.Disk).Elem(),
		reflect.ValueOf(&st.Descriptors).Elem(), reflect.ValueOf(st.Staging).Elem(), reflect.ValueOf(st.Shared).Elem()} {
		for i := range v.NumField() {
			switch f := v.Field(i); f.Kind() {
			case reflect.Int, reflect.Int64:
				f.SetInt(next)
			case reflect.Float64:
				f.SetFloat(float64(next) + 0.5)
			case reflect.Bool:
				flag = !flag
				f.SetBool(flag)
			}
			next++
		}
	}
	return st
}

// numbers flattens the numbers of the sections of a stats.json into their
// paths ("counters.lookups"), booleans as 1 and 0.
func numbers(t *testing.T, st Stats, sections ...string) map[string]float64 {
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, section := range sections {
		fields, _ := doc[section].(map[string]any)
		for name, v := range fields {
			switch v := v.(type) {
			case float64:
				out[section+"."+name] = v
			case bool:
				out[section+"."+name] = map[bool]float64{false: 0, true: 1}[v]
			}
		}
	}
	return out
}

// TestEveryStatHasAMetric: every number of the counters, disk, descriptors,
// staging and shared sections of stats.json is exported under one metric that reads that very
// number, and every metric names a number that exists.
func TestEveryStatHasAMetric(t *testing.T) {
	st := numberedStats()
	want := numbers(t, st, "counters", "disk", "descriptors", "staging", "shared")
	names := map[string]bool{}
	for _, m := range Metrics {
		if names[m.Name] {
			t.Errorf("metric %s listed twice", m.Name)
		}
		names[m.Name] = true
		if !strings.HasPrefix(m.Name, "kvtierfs_") || m.Help == "" || (m.Kind == Counter) != strings.HasSuffix(m.Name, "_total") {
			t.Errorf("metric %s: want a kvtierfs_ name, a help text, and _total exactly on counters", m.Name)
		}
		number, ok := want[m.Field]
		if !ok {
			t.Errorf("metric %s reads %s, which stats.json does not have", m.Name, m.Field)
			continue
		}
		if got, ok := m.Value(&st); !ok || got != number {
			t.Errorf("metric %s = %v (present %v), want %s = %v", m.Name, got, ok, m.Field, number)
		}
		if (m.Label == "") != (m.LabelValue == nil) {
			t.Errorf("metric %s: a label needs both its name and its value", m.Name)
		}
		delete(want, m.Field)
	}
	for field := range want {
		if exportedElsewhere[field] == "" {
			t.Errorf("stats.json's %s has no metric: add it to Metrics", field)
		}
	}
}

// TestOptionalSectionsMetricsAbsent: with staging off and no shared level,
// their metrics are not exported rather than exported as 0.
func TestOptionalSectionsMetricsAbsent(t *testing.T) {
	for _, m := range Metrics {
		optional := strings.HasPrefix(m.Field, "staging.") || strings.HasPrefix(m.Field, "shared.")
		if _, ok := m.Value(&Stats{}); ok == optional {
			t.Errorf("metric %s: present %v without staging and shared level", m.Name, ok)
		}
	}
}

// TestLeaseHolderLabel: lease_held carries the holder's name.
func TestLeaseHolderLabel(t *testing.T) {
	st := Stats{Shared: &Shared{LeaseHolder: "node-b"}}
	for _, m := range Metrics {
		if m.Name == "kvtierfs_shared_lease_held" {
			if m.Label != "holder" || m.LabelValue(&st) != "node-b" {
				t.Errorf("lease_held's label %q = %q, want holder = node-b", m.Label, m.LabelValue(&st))
			}
			return
		}
	}
	t.Error("no kvtierfs_shared_lease_held metric")
}

// TestStatsGolden decodes a stats.json as shipped, every field set, with
// unknown fields refused, and encodes it back to the same bytes: a field
// renamed or dropped from the ABI fails here.
func TestStatsGolden(t *testing.T) {
	golden, err := os.ReadFile("testdata/stats.json")
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(golden))
	dec.DisallowUnknownFields()
	var st Stats
	if err := dec.Decode(&st); err != nil {
		t.Fatalf("decoding the golden stats.json: %v", err)
	}
	again, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(append(again, '\n'), golden) {
		t.Errorf("stats.json encodes differently from testdata/stats.json:\n%s", again)
	}
}

// TestPrintable leaves printable text alone and quotes the rest.
func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"/dev/shm/vllm_offload_a b.mmap": "/dev/shm/vllm_offload_a b.mmap",
		"peer nodeB:7470 is down":        "peer nodeB:7470 is down",
		"/dev/shm/x\x1b]0;t\x07.mmap":    `"/dev/shm/x\x1b]0;t\a.mmap"`,
		"line\nbreak":                    `"line\nbreak"`,
		"bad\xffutf8":                    `"bad\xffutf8"`,
		"right\u202eto-left":             `"right\u202eto-left"`,
		"ünïcode":                        "ünïcode",
	} {
		if got := Printable(in); got != want {
			t.Errorf("Printable(%q) = %s, want %s", in, got, want)
		}
	}
}
