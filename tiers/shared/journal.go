package shared

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// The names journal (DESIGN.md "The shared level"): every node appends the
// names it publishes in the shared store ("+ <seq> <size> <rel> <tag>",
// after the block's rename) and removes ("- <seq> <rel> <tag>", after the
// removal) to its own log under namesDir, and tails every node's log at most
// once per half of NegativeTTL, so that lookups are answered from memory.
// A log's name carries a tag of its holder and each line a tag of the log's
// name and the line (auth.go), and a log's sequence numbers only grow: lines
// nobody with the key wrote, lines copied from another log and old lines
// appended again are skipped. The journal only saves calls: a name it holds
// is still verified at its fetch, and a name it lacks is at worst a miss.

const (
	namesDir  = controlDir + "/names"
	logSuffix = ".log"
	// maxJournalNames caps the names kept; past it, lookups go back to the
	// listings until the node restarts.
	maxJournalNames = 1 << 21
	// maxLogs caps the logs tailed; past it, lookups go to the listings.
	maxLogs = 1024
	// maxLogBytes is the size past which a node rewrites its own log with
	// the names it published that are still in its set.
	maxLogBytes = 64 << 20
	// maxLogRead caps the bytes read from one log in one refresh; a read
	// that long without a line's end is skipped (no line is that long).
	maxLogRead = 64 << 20
	// maxLogSize bounds a log a reader tails: larger ones are not kept by
	// their holder (which compacts past maxLogBytes) and are skipped.
	maxLogSize = 1 << 30
	// unrecordedBatch is how many records of the walk go in one append, so
	// that compaction keeps the log near maxLogBytes.
	unrecordedBatch = 1 << 16
)

// journal is the node's set of the names the shared store holds, as the logs tell.
type journal struct {
	// refresh serializes the reads of the logs.
	refresh sync.Mutex

	mu sync.Mutex
	// names maps each present block to its size and whether this node's log
	// records it; dirs counts the names below each directory of the layout.
	names map[string]journalName
	dirs  map[string]int
	// tails are how far each log was read, and the file read.
	tails map[string]logTail
	// readAt is when the logs were last read whole; overflowed is set once a
	// name was refused past maxJournalNames or a log past maxLogs.
	readAt     time.Time
	overflowed bool
	// triedAt is when a read last started: a failing journal is tried at
	// most once per half of NegativeTTL too.
	triedAt time.Time
	// ownBytes is the size of this node's log as far as it appended.
	ownBytes int64
	// own is this node's log; appending serialises its appends, so that
	// its sequence numbers reach the log in order; seq is the last one used.
	own       string
	appending sync.Mutex
	seq       uint64
}

type journalName struct {
	size int64
	mine bool
}

type logTail struct {
	off      int64
	dev, ino uint64
	// seq is the last sequence number taken from the log, kept when the log
	// is replaced (compacted): an older line never counts again.
	seq uint64
}

// journalRecord is one line of a log before it is numbered and tagged.
type journalRecord struct {
	present bool
	size    int64
	rel     string
}

func (j *journal) init() {
	j.names = make(map[string]journalName)
	j.dirs = make(map[string]int)
	j.tails = make(map[string]logTail)
}

// logName is the base name of holder's log: the holder and a tag of it.
func (l *Level) logName(holder string) string {
	holder = strings.ReplaceAll(holder, "/", "_")
	return holder + "-" + hex.EncodeToString(l.tag(domainLog, []byte(holder))[:logTagBytes]) + logSuffix
}

// logTagBytes are the bytes of a log name's tag.
const logTagBytes = 16

// authenticLog reports whether name is a log name some holder of the key made.
func (l *Level) authenticLog(name string) bool {
	base, ok := strings.CutSuffix(name, logSuffix)
	i := strings.LastIndexByte(base, '-')
	return ok && i > 0 && l.logName(base[:i]) == name
}

// ownLog is this node's log.
func (l *Level) ownLog() string { return l.journal.own }

// journalAdd records a block this node published; it runs on a bound worker
// after the block's rename, so a name in a log was always published first.
func (l *Level) journalAdd(rel string, size int64) {
	l.journalAppend([]journalRecord{{present: true, size: size, rel: rel}})
	l.journal.apply(rel, true, size, true)
}

// journalRemove records a block this node removed; on a bound worker.
func (l *Level) journalRemove(rel string) {
	l.journalAppend([]journalRecord{{rel: rel}})
	l.journal.apply(rel, false, 0, true)
}

// signLines numbers and tags records as lines of this node's log. The
// numbers follow the clock (so a holder restarted under the same name goes
// on above its old lines) and always grow. j.appending is held.
func (l *Level) signLines(records []journalRecord) []byte {
	j := &l.journal
	var buf bytes.Buffer
	name := path.Base(j.own)
	for _, r := range records {
		j.seq = max(j.seq+1, uint64(max(0, l.cfg.Clock.Now().UnixNano())))
		body := fmt.Sprintf("- %d %s", j.seq, r.rel)
		if r.present {
			body = fmt.Sprintf("+ %d %d %s", j.seq, r.size, r.rel)
		}
		fmt.Fprintf(&buf, "%s %x\n", body, l.tag(domainLine, []byte(name), []byte(body)))
	}
	return buf.Bytes()
}

// journalAppend appends records to this node's log in one write, first
// rewriting the log with the names it still holds once it passed
// maxLogBytes. A failed append is a name other nodes miss: a miss, never a
// wrong block.
func (l *Level) journalAppend(records []journalRecord) {
	j := &l.journal
	j.appending.Lock()
	defer j.appending.Unlock()
	j.mu.Lock()
	compact := j.ownBytes > maxLogBytes
	j.mu.Unlock()
	if compact {
		l.compactOwnLog(j.own)
	}
	lines := l.signLines(records)
	if err := l.dir.Append(j.own, lines); err != nil {
		// Its directory or the log itself replaced by something else (a
		// link, a FIFO): the name removed, never what it points to.
		if info, err := l.dir.Stat(j.own); err == nil && !info.IsFile && !info.IsDir {
			l.dir.Remove(j.own)
		}
		if l.ensureControlDir() != nil || l.dir.Append(j.own, lines) != nil {
			return
		}
	}
	j.mu.Lock()
	j.ownBytes += int64(len(lines))
	j.mu.Unlock()
}

// journalUnrecorded records, in one append, the blocks the lease holder's
// walk found that no log records (written before the journal, or by a node
// whose append failed), so that the journal comes to know every block.
func (l *Level) journalUnrecorded(blocks []sharedBlock) {
	j := &l.journal
	j.mu.Lock()
	var unknown []sharedBlock
	for _, b := range blocks {
		if _, ok := j.names[b.rel]; !ok {
			unknown = append(unknown, b)
		}
	}
	j.mu.Unlock()
	// Only a block whose record the key authenticates, of its size, is
	// recorded: a file someone put there without the key stays unknown.
	var records []journalRecord
	for _, b := range unknown {
		if l.stopping() {
			return
		}
		if l.authentic(b.rel, b.name, b.scanInfo.Size) {
			records = append(records, journalRecord{present: true, size: b.scanInfo.Size, rel: b.rel})
		}
	}
	for len(records) > 0 {
		batch := records[:min(len(records), unrecordedBatch)]
		records = records[len(batch):]
		if l.bound.do(func() error { l.journalAppend(batch); return nil }) != nil {
			return
		}
		for _, r := range batch {
			j.apply(r.rel, true, r.size, true)
		}
	}
}

// compactOwnLog replaces this node's log (tmp + rename) with one record per
// name it published that its set still holds; readers see a new file and
// read it from its start. j.appending is held.
func (l *Level) compactOwnLog(own string) {
	j := &l.journal
	var records []journalRecord
	j.mu.Lock()
	for rel, n := range j.names {
		if n.mine {
			records = append(records, journalRecord{present: true, size: n.size, rel: rel})
		}
	}
	j.mu.Unlock()
	lines := l.signLines(records)
	tmp := fmt.Sprintf("%s_%s.tmp", own, l.unique())
	if err := l.dir.WriteFile(tmp, lines); err != nil {
		l.dir.Remove(tmp)
		return
	}
	if err := l.dir.Rename(tmp, own); err != nil {
		l.dir.Remove(tmp)
		return
	}
	j.mu.Lock()
	j.ownBytes = int64(len(lines))
	j.mu.Unlock()
}

// apply adds or removes a name; false when the set is full.
func (j *journal) apply(rel string, present bool, size int64, mine bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	old, had := j.names[rel]
	switch {
	case present && had:
		j.names[rel] = journalName{size: size, mine: mine || old.mine}
	case present && len(j.names) >= maxJournalNames:
		j.overflowed = true
	case present:
		j.names[rel] = journalName{size: size, mine: mine}
		j.countDirs(rel, 1)
	case had:
		delete(j.names, rel)
		j.countDirs(rel, -1)
	}
}

// countDirs adds n to the count of every directory above rel. j.mu is held.
func (j *journal) countDirs(rel string, n int) {
	for dir := path.Dir(rel); dir != "."; dir = path.Dir(dir) {
		if j.dirs[dir] += n; j.dirs[dir] <= 0 {
			delete(j.dirs, dir)
		}
	}
}

// forget drops a name found missing or refused at its fetch.
func (l *Level) journalForget(rel string) { l.journal.apply(rel, false, 0, false) }

// parseLine reads one line of the log named log; ok is false for anything
// but a well-formed record of a block path of the layout whose tag verifies.
func (l *Level) parseLine(log, line string) (rel string, present bool, size int64, seq uint64, ok bool) {
	body, tag, found := cutLast(line, " ")
	if !found || tag != hex.EncodeToString(l.tag(domainLine, []byte(log), []byte(body))) {
		return "", false, 0, 0, false
	}
	op, rest, _ := strings.Cut(body, " ")
	seqText, rest, _ := strings.Cut(rest, " ")
	seq, err := strconv.ParseUint(seqText, 10, 64)
	if err != nil {
		return "", false, 0, 0, false
	}
	switch op {
	case "+":
		sz, r, found := strings.Cut(rest, " ")
		n, err := strconv.ParseInt(sz, 10, 64)
		if !found || err != nil || n <= 0 || n > maxBlockBytes {
			return "", false, 0, 0, false
		}
		rel, present, size = r, true, n
	case "-":
		rel = rest
	default:
		return "", false, 0, 0, false
	}
	if kind, _ := block.Parse(rel); kind != block.File || !inLayout(rel) {
		return "", false, 0, 0, false
	}
	return rel, present, size, seq, true
}

// cutLast is strings.Cut at the last sep.
func cutLast(s, sep string) (before, after string, found bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// inLayout reports a clean relative path whose components are plain names
// outside the level's own directory.
func inLayout(rel string) bool {
	if rel == "" || path.Clean(rel) != rel || strings.HasPrefix(rel, "/") || strings.HasPrefix(rel, controlDir+"/") {
		return false
	}
	for _, c := range strings.Split(rel, "/") {
		if c == "." || c == ".." || strings.ContainsAny(c, "\x00\\") {
			return false
		}
	}
	return true
}

// readJournal tails every log once under the bound: the bytes appended
// since the last read, whole lines only; a log replaced (compacted) is
// read from its start. It is skipped when the logs were read within half
// of NegativeTTL.
func (l *Level) readJournal(now time.Time) {
	j := &l.journal
	j.refresh.Lock()
	defer j.refresh.Unlock()
	j.mu.Lock()
	fresh := !j.triedAt.IsZero() && now.Sub(j.triedAt) < l.cfg.NegativeTTL/2
	if !fresh {
		j.triedAt = now
	}
	j.mu.Unlock()
	if fresh {
		return
	}
	// Only logs whose names verify are kept (and counted against maxLogs):
	// files anyone else put there are never opened.
	entries, err := call(l.bound, func() ([]fs.DirEntry, error) { return l.dir.ReadDir(namesDir, maxLogs, l.authenticLog) })
	switch {
	case errors.Is(err, syscall.ENOENT):
		entries = nil
	case errors.Is(err, errTooLarge):
		j.mu.Lock()
		j.overflowed = true
		j.mu.Unlock()
		return
	case err != nil:
		return
	}
	var logs []string
	for _, e := range entries {
		if e.Type().IsRegular() {
			logs = append(logs, namesDir+"/"+e.Name())
		}
	}
	for _, log := range logs {
		if !l.tailLog(log) {
			return
		}
	}
	j.mu.Lock()
	j.readAt = now
	j.mu.Unlock()
}

// tailLog applies the whole lines appended to one log since its last read.
func (l *Level) tailLog(log string) bool {
	j := &l.journal
	j.mu.Lock()
	tail := j.tails[log]
	j.mu.Unlock()
	type read struct {
		data []byte
		info FileInfo
	}
	got, err := call(l.bound, func() (r read, err error) {
		r.data, r.info, err = l.dir.ReadFrom(log, tail.off, maxLogRead, maxLogSize)
		if err == nil && (r.info.Dev != tail.dev || r.info.Ino != tail.ino || r.info.Size < tail.off) && tail.off > 0 {
			// A new file under the name: read it from its start.
			r.data, r.info, err = l.dir.ReadFrom(log, 0, maxLogRead, maxLogSize)
		}
		return r, err
	})
	switch {
	case errors.Is(err, syscall.ENOENT) || errors.Is(err, errTooLarge) || errors.Is(err, errNotRegular):
		// Gone, or not a log its holder keeps: nothing to take from it.
		return true
	case err != nil:
		return false
	}
	if got.info.Dev != tail.dev || got.info.Ino != tail.ino {
		tail = logTail{dev: got.info.Dev, ino: got.info.Ino, seq: tail.seq}
	}
	// A line not ended yet is read again next time.
	end := bytes.LastIndexByte(got.data, '\n') + 1
	if end == 0 && len(got.data) == maxLogRead {
		end = maxLogRead
	}
	name := path.Base(log)
	for _, line := range strings.Split(string(got.data[:end]), "\n") {
		rel, present, size, seq, ok := l.parseLine(name, line)
		if ok && seq > tail.seq {
			tail.seq = seq
			j.apply(rel, present, size, false)
		}
	}
	tail.off += int64(end)
	j.mu.Lock()
	j.tails[log] = tail
	if log == l.ownLog() {
		j.ownBytes = max(j.ownBytes, tail.off)
	}
	j.mu.Unlock()
	return true
}

// fromJournal answers a lookup from the journal: ok is false when it cannot
// (not read within NegativeTTL, past its caps, or no log at all: blocks in
// the store were not written by nodes keeping the journal).
func (l *Level) fromJournal(rel string, isBlock bool, now time.Time) (present bool, size int64, ok bool) {
	l.readJournal(now)
	j := &l.journal
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.overflowed || len(j.tails) == 0 || j.readAt.IsZero() || now.Sub(j.readAt) >= l.cfg.NegativeTTL {
		return false, 0, false
	}
	if !isBlock {
		return j.dirs[rel] > 0, 0, true
	}
	n, present := j.names[rel]
	return present, n.size, true
}
