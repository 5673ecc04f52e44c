package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"golang.org/x/sys/unix"
)

// barWidth is the width of an occupancy bar in characters.
const barWidth = 20

// historyRows is how many past snapshots the terminal view lists.
const historyRows = 10

// watchStats prints a live view of a mount every interval until SIGINT or
// SIGTERM: a screen redrawn in place on a terminal, with the rates of the
// last historyRows snapshots, or one logfmt line per snapshot otherwise (for
// logs and pipes). Each snapshot is read within timeout.
func watchStats(w io.Writer, mnt string, interval, timeout time.Duration, terminal bool) error {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(signals)
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	var prev *ctlabi.Stats
	var prevAt time.Time
	var history []historyRow
	for {
		cur, err := readStats(mnt, timeout)
		if errors.As(err, new(interruptedError)) {
			return nil
		}
		if err != nil {
			return err
		}
		now := time.Now()
		rates := snapshotRates(prev, &cur, now.Sub(prevAt))
		if terminal {
			if rates != nil {
				history = append(history, historyRow{at: now, rates: *rates})
				history = history[max(0, len(history)-historyRows):]
			}
			var view strings.Builder
			renderWatch(&view, cur, rates, now, interval)
			renderHistory(&view, history)
			fmt.Fprint(w, "\x1b[H\x1b[2J", fitWidth(view.String(), terminalWidth(os.Stdout))) // home and clear the screen
		} else {
			renderWatchLine(w, cur, rates, now)
		}
		prev, prevAt = &cur, now
		select {
		case <-signals:
			return nil
		case <-ticker.C:
		}
	}
}

// historyRow is the rates of one past snapshot.
type historyRow struct {
	at    time.Time
	rates rates
}

// renderHistory lists the rates of the recent snapshots, oldest first, as
// JuiceFS's stats scrolls.
func renderHistory(w io.Writer, history []historyRow) {
	if len(history) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%-8s  %9s %6s %9s %11s %9s %11s\n", "time", "lookups/s", "hits", "loads/s", "load B/s", "stores/s", "store B/s")
	for _, h := range history {
		hits := "-"
		if h.rates.lookups > 0 {
			hits = fmt.Sprintf("%.1f%%", 100*h.rates.lookupHits/h.rates.lookups)
		}
		fmt.Fprintf(w, "%-8s  %9.1f %6s %9.1f %11s %9.1f %11s\n", h.at.Format("15:04:05"), h.rates.lookups, hits,
			h.rates.loads, formatBytes(int64(h.rates.loadBytes)), h.rates.stores, formatBytes(int64(h.rates.storeBytes)))
	}
}

// defaultWidth is the terminal width assumed when it cannot be read.
const defaultWidth = 80

// terminalWidth is the width of the terminal f, or defaultWidth.
func terminalWidth(f *os.File) int {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil || ws.Col == 0 {
		return defaultWidth
	}
	return int(ws.Col)
}

// fitWidth cuts every line of text to width characters, marking a cut
// line with "…", so that no line wraps and the redrawn screen stays put.
func fitWidth(text string, width int) string {
	lines := strings.Split(text, "\n")
	for i, line := range lines {
		if r := []rune(line); len(r) > width {
			lines[i] = string(r[:width-1]) + "…"
		}
	}
	return strings.Join(lines, "\n")
}

// isTerminal reports whether f is a terminal (the TCGETS ioctl succeeds).
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// rates are per-second rates between two snapshots; nil before the second.
type rates struct {
	lookups, lookupHits, loads, loadBytes, stores, storeBytes float64
	mirrored, evictions, stagingHits, checksumFailures        float64
	peerRows                                                  map[string]float64
}

// snapshotRates computes rates from prev to cur over elapsed; nil without prev.
func snapshotRates(prev, cur *ctlabi.Stats, elapsed time.Duration) *rates {
	if prev == nil || elapsed <= 0 {
		return nil
	}
	s := elapsed.Seconds()
	per := func(a, b int64) float64 { return max(0, float64(b-a)) / s }
	p, c := prev.Counters, cur.Counters
	r := &rates{
		lookups: per(p.Lookups, c.Lookups), lookupHits: per(p.LookupHits, c.LookupHits),
		loads: per(p.Reads, c.Reads), loadBytes: per(p.ReadBytes, c.ReadBytes),
		stores: per(p.Writes, c.Writes), storeBytes: per(p.WriteBytes, c.WriteBytes),
		mirrored: per(p.RowsMirrored, c.RowsMirrored), evictions: per(prev.Disk.Evictions, cur.Disk.Evictions),
		checksumFailures: per(p.ChecksumFailures, c.ChecksumFailures),
		peerRows:         map[string]float64{},
	}
	if prev.Staging != nil && cur.Staging != nil {
		r.stagingHits = per(prev.Staging.Hits, cur.Staging.Hits)
	}
	sent := map[string]uint64{}
	for _, peer := range prev.Peers {
		sent[peer.Addr] = peer.RowsSent + peer.RowsReceived
	}
	for _, peer := range cur.Peers {
		if before, ok := sent[peer.Addr]; ok {
			r.peerRows[peer.Addr] = per(int64(before), int64(peer.RowsSent+peer.RowsReceived))
		}
	}
	return r
}

// bar draws used/total as a bar of barWidth characters and a percentage.
func bar(used, total int64) string {
	frac := 0.0
	if total > 0 {
		frac = min(1, max(0, float64(used)/float64(total)))
	}
	filled := int(frac*barWidth + 0.5)
	return fmt.Sprintf("[%s%s] %5.1f%%", strings.Repeat("█", filled), strings.Repeat("·", barWidth-filled), 100*frac)
}

// rate formats a per-second rate, or "-" before there are two snapshots.
func rate(r *rates, value func(*rates) float64) string {
	if r == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f/s", value(r))
}

// byteRate formats a bytes-per-second rate, or "-".
func byteRate(r *rates, value func(*rates) float64) string {
	if r == nil {
		return "-"
	}
	return formatBytes(int64(value(r))) + "/s"
}

// renderWatch draws the terminal view of one snapshot.
func renderWatch(w io.Writer, st ctlabi.Stats, r *rates, at time.Time, interval time.Duration) {
	d := st.Disk
	fmt.Fprintf(w, "kvtierfs %s   %s   every %s, Ctrl-C to stop\n\n", st.Mountpoint, at.Format("15:04:05"), interval)
	fmt.Fprintf(w, "disk     %s  %s used, %s free, %s\n", bar(d.PhysicalBytes, d.PhysicalBytes+d.FreeBytes),
		formatBytes(d.PhysicalBytes), formatBytes(d.FreeBytes), plural(d.Blocks, "block"))
	if sg := st.Staging; sg != nil {
		fmt.Fprintf(w, "staging  %s  %s of %s, %s streaming\n", bar(sg.Bytes, sg.BudgetBytes),
			formatBytes(sg.Bytes), formatBytes(sg.BudgetBytes), plural(int64(sg.Chains), "chain"))
	} else {
		fmt.Fprintf(w, "staging  off\n")
	}
	if len(st.Primary.Regions) == 0 {
		fmt.Fprintf(w, "primary  no shm region found\n")
	}
	for _, reg := range st.Primary.Regions {
		rows := fmt.Sprintf("%d rows × %s", reg.Rows, formatBytes(reg.RowBytes))
		if reg.RowBytes == 0 {
			rows = "geometry unknown"
		}
		// The engine's use of its rows is not visible to the daemon: no bar.
		fmt.Fprintf(w, "primary  %s: %s, %s\n", ctlabi.Printable(reg.Path), formatBytes(reg.Size), rows)
	}
	fmt.Fprintln(w)
	hits := "-"
	if r != nil && r.lookups > 0 {
		hits = fmt.Sprintf("%.1f%%", 100*r.lookupHits/r.lookups)
	}
	fmt.Fprintf(w, "lookups  %-10s hits %s\n", rate(r, func(r *rates) float64 { return r.lookups }), hits)
	fmt.Fprintf(w, "loads    %-10s %s, %s from staging\n", rate(r, func(r *rates) float64 { return r.loads }),
		byteRate(r, func(r *rates) float64 { return r.loadBytes }), rate(r, func(r *rates) float64 { return r.stagingHits }))
	fmt.Fprintf(w, "stores   %-10s %s, %s evictions\n", rate(r, func(r *rates) float64 { return r.stores }),
		byteRate(r, func(r *rates) float64 { return r.storeBytes }), rate(r, func(r *rates) float64 { return r.evictions }))
	if st.Replication != nil || len(st.Peers) > 0 {
		fmt.Fprintf(w, "mirrored %-10s rows\n", rate(r, func(r *rates) float64 { return r.mirrored }))
	}
	if sh := st.Shared; sh != nil {
		state := "reachable"
		if !sh.Reachable {
			state = "UNREACHABLE"
		}
		fmt.Fprintf(w, "shared   %s, %s behind (%d queued), %d written, %d fetched, %d dropped\n",
			state, formatBytes(sh.BytesBehind), sh.QueueBlocks, sh.WrittenBlocks, sh.FetchedBlocks, sh.DroppedBlocks)
	}
	for _, p := range st.Peers {
		rows := "-"
		if r != nil {
			rows = fmt.Sprintf("%.1f rows/s", r.peerRows[p.Addr])
		}
		line := fmt.Sprintf("peer     %s %s, %s", p.Addr, p.State, rows)
		if p.LastError != "" {
			line += ", last error: " + p.LastError
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintln(w)
	if len(st.Warnings) == 0 {
		fmt.Fprintln(w, "warnings: none")
		return
	}
	fmt.Fprintln(w, "warnings:")
	for _, warn := range st.Warnings {
		fmt.Fprintf(w, "  [%s] %s\n", warn.Code, ctlabi.Printable(warn.Message))
	}
}

// renderWatchLine prints one snapshot as one logfmt line: key=value
// fields, values without spaces, rates per second ("-" before there are two
// snapshots) and byte rates in bytes.
func renderWatchLine(w io.Writer, st ctlabi.Stats, r *rates, at time.Time) {
	d := st.Disk
	fields := []string{"time=" + at.Format(time.RFC3339), "disk=" + pct(d.PhysicalBytes, d.PhysicalBytes+d.FreeBytes), fmt.Sprintf("blocks=%d", d.Blocks)}
	if sg := st.Staging; sg != nil {
		fields = append(fields, "staging="+pct(sg.Bytes, sg.BudgetBytes))
	}
	rows := int64(0)
	for _, reg := range st.Primary.Regions {
		rows += reg.Rows
	}
	perSecond := func(value func(*rates) float64) string {
		if r == nil {
			return "-"
		}
		return fmt.Sprintf("%.1f", value(r))
	}
	bytesPerSecond := func(value func(*rates) float64) string {
		if r == nil {
			return "-"
		}
		return fmt.Sprintf("%d", int64(value(r)))
	}
	fields = append(fields, fmt.Sprintf("primary_rows=%d", rows),
		"lookups_per_s="+perSecond(func(r *rates) float64 { return r.lookups }),
		"loads_per_s="+perSecond(func(r *rates) float64 { return r.loads }),
		"load_bytes_per_s="+bytesPerSecond(func(r *rates) float64 { return r.loadBytes }),
		"stores_per_s="+perSecond(func(r *rates) float64 { return r.stores }),
		"store_bytes_per_s="+bytesPerSecond(func(r *rates) float64 { return r.storeBytes }))
	if st.Replication != nil || len(st.Peers) > 0 {
		fields = append(fields, "mirrored_per_s="+perSecond(func(r *rates) float64 { return r.mirrored }))
	}
	up := 0
	for _, p := range st.Peers {
		if p.State == "up" || p.State == "inbound" {
			up++
		}
	}
	if len(st.Peers) > 0 {
		fields = append(fields, fmt.Sprintf("peers_up=%d/%d", up, len(st.Peers)))
	}
	if sh := st.Shared; sh != nil {
		fields = append(fields, fmt.Sprintf("shared_reachable=%t", sh.Reachable), fmt.Sprintf("shared_behind_bytes=%d", sh.BytesBehind))
	}
	codes := make([]string, 0, len(st.Warnings))
	for _, warn := range st.Warnings {
		codes = append(codes, warn.Code)
	}
	warnings := "none"
	if len(codes) > 0 {
		warnings = strings.Join(codes, ",")
	}
	fields = append(fields, "warnings="+warnings)
	fmt.Fprintln(w, strings.Join(fields, " "))
}

// pct formats used/total as a percentage.
func pct(used, total int64) string {
	if total <= 0 {
		return "0.0%"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(used)/float64(total))
}
