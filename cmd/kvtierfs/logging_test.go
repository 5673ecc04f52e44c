package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/kvtierfs/kvtierfs/fusefs"
	"github.com/kvtierfs/kvtierfs/tiers/shm"
)

// TestLogEvents checks the one line per event logged between two
// snapshots, in the json format: regions found and lost, eviction pressure,
// warnings raised and cleared, and nothing when nothing changed.
func TestLogEvents(t *testing.T) {
	var buf bytes.Buffer
	defer slog.SetDefault(slog.Default())
	logger := newLogger(&buf, "json", slog.LevelInfo)
	prev := fusefs.Stats{
		Primary:  fusefs.Primary{Regions: []shm.Info{{Path: "/dev/shm/vllm_offload_old.mmap"}}},
		Warnings: []fusefs.Warning{{Code: "peer_down", Message: "peer b is down"}},
	}
	cur := fusefs.Stats{
		Primary:  fusefs.Primary{Regions: []shm.Info{{Path: "/dev/shm/vllm_offload_new.mmap", Size: 1 << 20, Rows: 4}}},
		Warnings: []fusefs.Warning{{Code: "no_space", Message: "raise --capacity"}},
	}
	cur.Disk.Evictions = 3
	logEvents(logger, prev, cur)
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		got = append(got, rec["level"].(string)+" "+rec["msg"].(string))
	}
	want := []string{"INFO shm region found", "INFO shm region lost", "WARN evicting to stay within capacity",
		"WARN warning raised", "INFO warning cleared"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	buf.Reset()
	logEvents(logger, cur, cur)
	if buf.Len() != 0 {
		t.Errorf("events logged between equal snapshots: %s", buf.String())
	}
}
