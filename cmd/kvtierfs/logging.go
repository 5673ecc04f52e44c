package main

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/spf13/pflag"
)

// logFormat is the value of --log-format: text (logfmt-style key=value
// lines, for journald and terminals) or json (one object per line, for log
// collectors).
type logFormat string

// Set accepts text or json (pflag.Value).
func (f *logFormat) Set(s string) error {
	if s != "text" && s != "json" {
		return fmt.Errorf("unknown log format")
	}
	*f = logFormat(s)
	return nil
}

func (f *logFormat) String() string { return string(*f) }

// Type lists the accepted values (pflag.Value).
func (*logFormat) Type() string { return "text|json" }

// addLogFormatFlag registers --log-format on fl.
func addLogFormatFlag(fl *pflag.FlagSet) *logFormat {
	f := logFormat("text")
	fl.Var(&f, "log-format", "log line format: text (key=value) or json (one object per line)")
	return &f
}

// newLogger returns the daemon's logger writing to w in format f and makes
// it the default one.
func newLogger(w io.Writer, f logFormat, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if f == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	logger := slog.New(h)
	slog.SetDefault(logger)
	return logger
}

// eventLogInterval is how often the event log compares stats snapshots.
const eventLogInterval = 10 * time.Second

// startEventLog logs, from a stats snapshot every eventLogInterval, the
// events an operator follows in the log that no single request reports:
// engine regions found and lost, eviction under capacity pressure starting
// and stopping, warnings raised and cleared. It returns a function that
// stops it.
func startEventLog(snapshot func() ctlabi.Stats, logger *slog.Logger) (stop func()) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(eventLogInterval)
		defer tick.Stop()
		events := &eventLog{logger: logger, prev: snapshot()}
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				events.observe(snapshot())
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

// eventLog turns successive snapshots into log lines.
type eventLog struct {
	logger *slog.Logger
	prev   ctlabi.Stats
	// evicting is whether the store evicted during the last interval, so
	// that steady eviction in a full store is one line, not one per interval.
	evicting bool
}

// observe logs one line for each event between the previous snapshot and cur.
func (e *eventLog) observe(cur ctlabi.Stats) {
	prev, logger := e.prev, e.logger
	e.prev = cur
	before := map[string]bool{}
	for _, r := range prev.Primary.Regions {
		before[r.Path] = true
	}
	for _, r := range cur.Primary.Regions {
		if !before[r.Path] {
			logger.Info("shm region found", "path", r.Path, "size", formatBytes(r.Size), "rows", r.Rows)
		}
		delete(before, r.Path)
	}
	for _, path := range slices.Sorted(maps.Keys(before)) {
		logger.Info("shm region lost", "path", path)
	}
	evicted := cur.Disk.Evictions - prev.Disk.Evictions
	switch {
	case evicted > 0 && !e.evicting:
		logger.Info("evicting to stay within capacity", "blocks_evicted", evicted,
			"on_disk", formatBytes(cur.Disk.PhysicalBytes), "capacity", formatBytes(cur.Disk.CapacityBytes))
	case evicted == 0 && e.evicting:
		logger.Info("eviction stopped", "on_disk", formatBytes(cur.Disk.PhysicalBytes), "capacity", formatBytes(cur.Disk.CapacityBytes))
	}
	e.evicting = evicted > 0
	// One line per code raised or cleared, however many warnings share it.
	before = map[string]bool{}
	for _, w := range prev.Warnings {
		before[w.Code] = true
	}
	now := map[string]bool{}
	for _, w := range cur.Warnings {
		if !before[w.Code] && !now[w.Code] {
			logger.Warn("warning raised", "code", w.Code, "message", w.Message)
		}
		now[w.Code] = true
	}
	for _, code := range slices.Sorted(maps.Keys(before)) {
		if !now[code] {
			logger.Info("warning cleared", "code", code)
		}
	}
}
