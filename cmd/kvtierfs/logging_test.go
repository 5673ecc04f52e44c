package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
)

// TestLogEvents checks the one line per event logged between snapshots, in
// the json format: regions found and lost, eviction starting (once while it
// goes on) and stopping, warnings raised and cleared (one line per code,
// however many warnings share it), and nothing when nothing changed.
func TestLogEvents(t *testing.T) {
	var buf bytes.Buffer
	defer slog.SetDefault(slog.Default())
	logger := newLogger(&buf, "json", slog.LevelInfo)
	prev := ctlabi.Stats{
		Primary: ctlabi.Primary{Regions: []ctlabi.Region{{Path: "/dev/shm/vllm_offload_old.mmap"}}},
		Warnings: []ctlabi.Warning{{Code: "peer_down", Message: "peer b is down"},
			{Code: "shm_ignored", Message: "a"}, {Code: "shm_ignored", Message: "b"}},
	}
	cur := ctlabi.Stats{
		Primary: ctlabi.Primary{Regions: []ctlabi.Region{{Path: "/dev/shm/vllm_offload_new.mmap", Size: 1 << 20, Rows: 4}}},
		Warnings: []ctlabi.Warning{{Code: "no_space", Message: "raise --capacity"}, {Code: "no_space", Message: "again"},
			{Code: "shm_ignored", Message: "a"}, {Code: "shm_ignored", Message: "b"}},
	}
	cur.Disk.Evictions = 3
	events := &eventLog{logger: logger, prev: prev}
	records := func() []string {
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if line == "" {
				continue
			}
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("log line is not JSON: %q", line)
			}
			got = append(got, rec["level"].(string)+" "+rec["msg"].(string))
		}
		buf.Reset()
		return got
	}
	events.observe(cur)
	want := []string{"INFO shm region found", "INFO shm region lost", "INFO evicting to stay within capacity",
		"WARN warning raised", "INFO warning cleared"}
	if got := records(); !slices.Equal(got, want) {
		t.Errorf("events\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	still := cur
	still.Disk.Evictions = 7
	events.observe(still)
	if got := records(); len(got) != 0 {
		t.Errorf("steady eviction logged again: %v", got)
	}
	events.observe(still)
	if got := records(); !slices.Equal(got, []string{"INFO eviction stopped"}) {
		t.Errorf("eviction stopping logged %v", got)
	}
	events.observe(still)
	if got := records(); len(got) != 0 {
		t.Errorf("events logged between equal snapshots: %v", got)
	}
}

// TestLogsEscapeControlBytes: a /dev/shm name with escape sequences reaches
// the log, in either format, with no raw control byte.
func TestLogsEscapeControlBytes(t *testing.T) {
	defer slog.SetDefault(slog.Default())
	for _, format := range []logFormat{"text", "json"} {
		var buf bytes.Buffer
		newLogger(&buf, format, slog.LevelInfo).Warn("shm file matching the glob ignored",
			"path", "/dev/shm/vllm_offload_\x1b]0;owned\x07\x1b[2J.mmap")
		if strings.ContainsAny(buf.String(), "\x1b\x07") || !strings.Contains(buf.String(), "owned") {
			t.Errorf("%s log line %q", format, buf.String())
		}
	}
}
