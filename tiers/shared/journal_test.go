package shared

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writtenBehind has l write blocks behind and waits until they are written.
func writtenBehind(t *testing.T, l *Level, local *fakeLocal, blocks ...int) {
	t.Helper()
	want := l.Stats().WrittenBlocks + int64(len(blocks))
	for _, i := range blocks {
		local.put(blockRel(i), blockData(i, testBlock))
		l.Published(blockRel(i), testBlock64)
	}
	eventually(t, "blocks written behind", func() bool { return l.Stats().WrittenBlocks == want })
}

// layoutCalls are the listings and stats of the layout (the journal's own
// directory left out).
func layoutCalls(dir *countingDir) (listings, stats int) {
	ls, stats := dir.counts()
	for d, n := range ls {
		if d != namesDir {
			listings += n
		}
	}
	return listings, stats
}

// spreadRel is a block path under one of 4096 × 256 directories of the layout.
func spreadRel(i int) string {
	h := fmt.Sprintf("%08x%024x", uint32(i)*2654435761, i)
	return fmt.Sprintf("model/%s/%s_g0/%s.bin", h[:3], h[3:5], h)
}

// TestJournalAnswersWithoutCalls: once the journal was read, absent keys
// across many directories of the layout and a present one cost no listing
// and no stat; the present one answers its size.
func TestJournalAnswersWithoutCalls(t *testing.T) {
	root := t.TempDir()
	a, aLocal, _ := newTestLevel(t, NewOSDir(root), root, nil)
	writtenBehind(t, a, aLocal, 0)
	dir := &countingDir{Dir: NewOSDir(root), listings: map[string]int{}}
	b, _, _ := newTestLevel(t, dir, root, func(c *Config) { c.Holder = "node-b" })
	listingsAtStart, statsAtStart := layoutCalls(dir)
	const n = 2000
	for i := 1; i <= n; i++ {
		if b.Lookup(spreadRel(i)) {
			t.Fatalf("absent key %d answered present", i)
		}
	}
	if !b.Lookup(blockRel(0)) {
		t.Fatal("block written behind by A answered absent")
	}
	if size, ok := b.Size(blockRel(0)); !ok || size != testBlock64 {
		t.Fatalf("size %d, %v; want %d", size, ok, testBlock)
	}
	if !b.Lookup(filepath.Dir(blockRel(0))) || b.Lookup(filepath.Dir(spreadRel(1))) || b.Lookup("model/fff") {
		t.Fatal("directories of the layout not answered from the journal")
	}
	listings, stats := layoutCalls(dir)
	if listings != listingsAtStart || stats != statsAtStart {
		t.Fatalf("%d listings and %d stats of the layout for %d lookups, want none",
			listings-listingsAtStart, stats-statsAtStart, n+3)
	}
	if got := b.Stats().JournalFallbacks; got != 0 {
		t.Fatalf("%d lookups fell back to the listings", got)
	}
}

// TestJournalVisibility: a block A writes behind after B read the journal is
// found by B once B's reading is half of NegativeTTL old; A's removal of a
// block (corrupt, dropped at its fetch) makes it absent on B.
func TestJournalVisibility(t *testing.T) {
	root := t.TempDir()
	a, aLocal, _ := newTestLevel(t, NewOSDir(root), root, nil)
	writtenBehind(t, a, aLocal, 0)
	b, _, clock := newTestLevel(t, NewOSDir(root), root, func(c *Config) {
		c.Holder = "node-b"
		c.NegativeTTL = 2 * time.Second
	})
	if b.Lookup(blockRel(1)) {
		t.Fatal("block 1 present before it was written")
	}
	writtenBehind(t, a, aLocal, 1)
	if b.Lookup(blockRel(1)) {
		t.Fatal("journal read again before half of NegativeTTL")
	}
	clock.Advance(time.Second)
	if !b.Lookup(blockRel(1)) {
		t.Fatal("block written behind by A not seen by B within NegativeTTL")
	}

	// A removes block 2, which B holds in its journal but never looked up,
	// as corrupt: the removal record reaches B.
	writtenBehind(t, a, aLocal, 2)
	clock.Advance(time.Second)
	if b.Lookup(spreadRel(7)) {
		t.Fatal("absent key answered present")
	}
	if n := b.Stats(); n.JournalNames != 3 {
		t.Fatalf("%d names in B's journal, want 3", n.JournalNames)
	}
	if err := os.WriteFile(filepath.Join(root, blockRel(2)+".new"), blockData(99, testBlock), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := NewOSDir(root).SetXattr(blockRel(2)+".new", recordXattr, mustXattr(t, root, blockRel(2))); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(root, blockRel(2)+".new"), filepath.Join(root, blockRel(2))); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Fetch(blockRel(2)); err == nil || a.Stats().CorruptDropped != 1 {
		t.Fatalf("corrupt block fetched (%v) or not dropped", err)
	}
	clock.Advance(time.Second)
	if b.Lookup(blockRel(2)) {
		t.Fatal("removal record did not make the block absent")
	}
	if !b.Lookup(blockRel(0)) {
		t.Fatal("block 0 lost")
	}
}

func mustXattr(t *testing.T, root, rel string) []byte {
	t.Helper()
	rec, err := NewOSDir(root).GetXattr(rel, recordXattr)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestJournalRemovalRecords: "-" records remove names, in log order.
func TestJournalRemovalRecords(t *testing.T) {
	root := t.TempDir()
	writeLog(t, root, keyHolder(testKey, "other"), journalRecord{true, 10, blockRel(1)}, journalRecord{true, 11, blockRel(2)}, journalRecord{false, 0, blockRel(1)})
	l, _, _ := newTestLevel(t, NewOSDir(root), root, nil)
	if l.Lookup(blockRel(1)) {
		t.Fatal("removed name answered present")
	}
	if !l.Lookup(blockRel(2)) {
		t.Fatal("name answered absent")
	}
	if l.Stats().JournalNames != 1 {
		t.Fatalf("%d names in the journal, want 1", l.Stats().JournalNames)
	}
}

func writeLog(t *testing.T, root string, holder *Level, records ...journalRecord) {
	t.Helper()
	appendLog(t, root, holder, holder.signLines(records))
}

// appendLog appends raw bytes to holder's log.
func appendLog(t *testing.T, root string, holder *Level, content []byte) {
	t.Helper()
	dir := filepath.Join(root, namesDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(root, holder.ownLog()), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(content); err != nil {
		t.Fatal(err)
	}
}

// TestJournalHostileLines: lines tagged with the key but malformed (garbage,
// paths out of the layout, sizes no block has) and a line not ended yet are
// skipped; the line is read once it is ended.
func TestJournalHostileLines(t *testing.T) {
	root := t.TempDir()
	good := blockRel(1)
	h := good[strings.LastIndex(good, "/")+1:]
	hostile := []string{
		"garbage", "+", "+ 1 10", "+ 1 x " + good, "+ 1 -1 " + good, "+ 1 0 " + good, "* 1 10 " + good, "", "+ 10 " + good,
		"+ 1 10 ../" + good, "+ 1 10 /" + good, "+ 1 10 model/../" + good, "+ 1 10 ./" + good,
		"+ 1 10 model//abc/de_g0/" + h, "+ 1 10 " + namesDir + "/de_g0/" + h, "+ 1 10 model/abc/de_g0/notahash.bin",
		"+ 1 10 model/abc/de_g0/" + h + "\x00", "- 1 ../" + good, "\xff\xfe", "+ 1 99999999999999999999999 " + good,
		fmt.Sprintf("+ 1 %d %s", int64(maxBlockBytes)+1, good),
	}
	evil := keyHolder(testKey, "evil")
	logName := filepath.Base(evil.ownLog())
	var content []byte
	for _, body := range hostile {
		content = fmt.Appendf(content, "%s %x\n", body, evil.tag(domainLine, []byte(logName), []byte(body)))
	}
	unended := evil.signLines([]journalRecord{{true, 10, good}})
	appendLog(t, root, evil, append(content, unended[:len(unended)-1]...))
	l, _, clock := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.NegativeTTL = 2 * time.Second })
	if l.Lookup(good) {
		t.Fatal("a line not ended yet was read")
	}
	if n := l.Stats().JournalNames; n != 0 {
		l.journal.mu.Lock()
		t.Fatalf("%d names kept from hostile lines: %v", n, l.journal.names)
	}
	appendLog(t, root, evil, []byte("\n"))
	clock.Advance(time.Second)
	if !l.Lookup(good) {
		t.Fatal("the line ended later not read")
	}
	if n := l.Stats().JournalNames; n != 1 {
		t.Fatalf("%d names kept, want 1", n)
	}
}

// TestJournalCapFallsBack: past maxJournalNames the journal answers nothing
// and lookups go to the listings, counted.
func TestJournalCapFallsBack(t *testing.T) {
	root := t.TempDir()
	a, aLocal, _ := newTestLevel(t, NewOSDir(root), root, nil)
	writtenBehind(t, a, aLocal, 0)
	dir := &countingDir{Dir: NewOSDir(root), listings: map[string]int{}}
	b, _, _ := newTestLevel(t, dir, root, func(c *Config) { c.Holder = "node-b" })
	b.journal.mu.Lock()
	for i := range maxJournalNames {
		b.journal.names[fmt.Sprint(i)] = journalName{}
	}
	b.journal.mu.Unlock()
	if b.Lookup(blockRel(5)) {
		t.Fatal("absent key answered present")
	}
	if !b.Lookup(blockRel(0)) {
		t.Fatal("block written behind answered absent")
	}
	if listings, _ := layoutCalls(dir); listings == 0 {
		t.Fatal("no listing past the journal's cap")
	}
	if got := b.Stats().JournalFallbacks; got != 2 {
		t.Fatalf("%d fallbacks counted, want 2", got)
	}
}

// TestJournalRecordsUnrecordedBlocks: a block with a record the key
// authenticates but in no log (its writer's append failed) is absent to the
// journal until the lease holder's walk records it in its own log; a block
// put there without the key (no record, or one sealed with another key) is
// never recorded.
func TestJournalRecordsUnrecordedBlocks(t *testing.T) {
	root := t.TempDir()
	writeLog(t, root, keyHolder(testKey, "other"), journalRecord{true, 10, spreadRel(1)})
	putBlock(t, root, testKey, blockRel(0), blockData(0, testBlock))
	putBlock(t, root, []byte("a key the replicas do not hold"), blockRel(1), blockData(1, testBlock))
	putBlock(t, root, nil, blockRel(2), blockData(2, testBlock))
	b, _, clock := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.Holder = "node-b" })
	if b.Lookup(blockRel(0)) {
		t.Fatal("a block no log records answered present")
	}
	holder, _, _ := newTestLevel(t, NewOSDir(root), root, func(c *Config) { c.Capacity = 1 << 40 })
	eventually(t, "the walk's record in the holder's log", func() bool {
		log, _ := os.ReadFile(filepath.Join(root, holder.ownLog()))
		return strings.Contains(string(log), fmt.Sprintf(" %d %s ", testBlock, blockRel(0)))
	})
	log, _ := os.ReadFile(filepath.Join(root, holder.ownLog()))
	if strings.Contains(string(log), blockRel(1)) || strings.Contains(string(log), blockRel(2)) {
		t.Fatalf("the walk recorded a block without an authentic record:\n%s", log)
	}
	clock.Advance(time.Hour)
	if !b.Lookup(blockRel(0)) {
		t.Fatal("a block the walk recorded answered absent")
	}
	if b.Lookup(blockRel(1)) || b.Lookup(blockRel(2)) {
		t.Fatal("a block without an authentic record answered present")
	}
}

// putBlock puts a block straight into the shared directory with a record
// sealed with key (none if nil), and no log line.
func putBlock(t *testing.T, root string, key []byte, rel string, data []byte) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if key != nil {
		setSealed(t, root, rel, keyHolder(key, "writer").sealedRecordOf(t, rel, data))
	}
}
