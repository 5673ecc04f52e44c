package lookupbudget

import (
	"fmt"
	"testing"
	"time"
)

// clock is a manual clock for the budget.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time            { return c.now }
func (c *clock) advance(d time.Duration)   { c.now = c.now.Add(d) }
func newBudget(rows int, c *clock) *Budget { b := New(Options{Now: c.Now}); b.SetRows(rows); return b }
func hash(chain string, chunk int) string  { return fmt.Sprintf("%s-%04d", chain, chunk) }
func key(group int, chain string, chunk int) Key {
	return Key{Tier: "t", Group: group, Hash: hash(chain, chunk)}
}

// upstreamBatch looks a chain of n stored chunks up as vLLM's first step
// does: group 0 ascending over every key, then each other group from the
// end. It returns which chunks answered present, per group.
func upstreamBatch(b *Budget, thread uint32, chain string, n, groups int) [][]bool {
	out := make([][]bool, groups)
	out[0] = make([]bool, n)
	for c := 0; c < n; c++ {
		out[0][c] = b.Answer(key(0, chain, c), thread, true)
	}
	for g := 1; g < groups; g++ {
		out[g] = make([]bool, n)
		for c := n - 1; c >= 0; c-- {
			out[g][c] = b.Answer(key(g, chain, c), thread, true)
		}
	}
	return out
}

func presentRange(answers []bool) (first, count int) {
	first = -1
	for c, p := range answers {
		if p {
			if first < 0 {
				first = c
			}
			count++
		}
	}
	return first, count
}

func noteGroups(b *Budget, groups int) {
	for g := range groups {
		b.NoteGroup("t", g)
	}
}

func TestPrefixThatFitsIsUnchanged(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := newBudget(124, c)
	noteGroups(b, 2)
	// Both groups' keys fit in the rows: every key answers present.
	got := upstreamBatch(b, 1, "a", 50, 2)
	for g := range got {
		if _, n := presentRange(got[g]); n != 50 {
			t.Errorf("group %d: %d of 50 present, want all", g, n)
		}
	}
	// The prefix fits, its window group's keys do not all: the prefix and
	// the window group's last chunks answer present, which is the hit the
	// walk finds without the budget (a window group needs its last chunks).
	c.advance(10 * time.Second)
	got = upstreamBatch(b, 1, "b", 100, 2)
	if first, n := presentRange(got[0]); first != 0 || n != 100 {
		t.Errorf("prefix group: %d present from %d, want all 100", n, first)
	}
	if first, n := presentRange(got[1]); first+n != 100 || n < DefaultWindowRows {
		t.Errorf("window group: %d present from %d, want at least the last %d", n, first, DefaultWindowRows)
	}
	if st := b.Stats(); st.ChainsCapped != 0 || st.Promised > 124 {
		t.Errorf("stats %+v: want nothing capped, at most 124 rows promised", st)
	}
}

func TestLongPrefixCappedBelowRowsWithWindow(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := newBudget(124, c)
	noteGroups(b, 2)
	got := upstreamBatch(b, 1, "a", 170, 2)
	if first, n := presentRange(got[0]); first != 0 || n != 120 {
		t.Errorf("prefix group: %d present from %d, want 120 from 0 (124 rows - 4 for the window group)", n, first)
	}
	if first, n := presentRange(got[1]); first != 116 || n != 4 {
		t.Errorf("window group: %d present from %d, want the 4 chunks 116..119 before the cap", n, first)
	}
	st := b.Stats()
	if st.ChainsCapped != 1 || st.LastCap != 120 || st.KeysWithheld != 50+166 || st.Promised != 124 {
		t.Errorf("stats %+v: want 1 chain capped at 120, 216 keys withheld, 124 rows promised", st)
	}
}

func TestFullAttentionAloneGetsEveryRow(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := newBudget(124, c)
	noteGroups(b, 1)
	if first, n := presentRange(upstreamBatch(b, 1, "a", 273, 1)[0]); first != 0 || n != 124 {
		t.Errorf("%d present from %d, want 124 from 0", n, first)
	}
}

func TestAbsentKeyEndsPrefix(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := newBudget(124, c)
	noteGroups(b, 1)
	for i := range 3 {
		b.Answer(key(0, "a", i), 1, true)
	}
	if b.Answer(key(0, "a", 3), 1, false) {
		t.Fatal("an absent key answered present")
	}
	if b.Answer(key(0, "a", 4), 1, true) {
		t.Error("a key past the prefix's first miss answered present: the walk never loads it, its row is wasted")
	}
}

func TestRowsSharedBetweenBatchesAtOnce(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := newBudget(124, c)
	noteGroups(b, 2)
	first := upstreamBatch(b, 1, "a", 170, 2)
	second := upstreamBatch(b, 1, "b", 170, 2)
	_, na := presentRange(first[0])
	_, nb0 := presentRange(second[0])
	_, nb1 := presentRange(second[1])
	if na != 120 || nb0 != 0 || nb1 != 0 {
		t.Errorf("first %d, second %d+%d present: want 120, then nothing (every row promised)", na, nb0, nb1)
	}
	// The engine loads what the first batch took; a new batch of the
	// thread after that finds the rows again.
	for c := 0; c < 120; c++ {
		b.Loaded(key(0, "a", c))
	}
	b.Loaded(key(1, "a", 119))
	if st := b.Stats(); st.Promised != 3 {
		t.Errorf("after the loads %d rows promised, want the 3 window keys not loaded", st.Promised)
	}
	c.advance(2 * time.Second)
	third := upstreamBatch(b, 1, "c", 170, 2)
	if _, n := presentRange(third[0]); n != 120 {
		t.Errorf("a later batch got %d present, want 120", n)
	}
}

func TestAnswerHoldsWhileAskedAgain(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := newBudget(10, c)
	noteGroups(b, 1)
	upstreamBatch(b, 1, "a", 20, 1)
	// The engine walks again (another step) from another group order: a
	// withheld key stays withheld, a present one present.
	c.advance(100 * time.Millisecond)
	if b.Answer(key(0, "a", 15), 1, true) || !b.Answer(key(0, "a", 5), 2, true) {
		t.Error("an answer changed within the gap")
	}
	c.advance(DefaultPromiseTTL + time.Second) // promises and answers expired
	if !b.Answer(key(0, "a", 15), 3, true) {
		t.Error("a key withheld long ago is still withheld with every row free")
	}
}

func TestExemptTierAndUnknownRows(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := newBudget(0, c)
	if _, n := presentRange(upstreamBatch(b, 1, "a", 50, 1)[0]); n != 50 {
		t.Errorf("rows unknown: %d of 50 present, want all", n)
	}
	b.SetRows(10)
	b.Exempt("t")
	if _, n := presentRange(upstreamBatch(b, 1, "b", 50, 1)[0]); n != 50 {
		t.Errorf("exempt tier: %d of 50 present, want all", n)
	}
	if st := b.Stats(); st.KeysWithheld != 0 {
		t.Errorf("withheld %d keys, want none", st.KeysWithheld)
	}
}

func TestBoundedState(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := New(Options{Now: c.Now, MaxKeys: 64})
	b.SetRows(1 << 20)
	for thread := range uint32(3000) {
		for i := range 10 {
			b.Answer(key(0, fmt.Sprint(thread), i), thread, true)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.present)+len(b.withheld) > 64 || len(b.promises) > 64 || len(b.batches) > maxThreads {
		t.Errorf("state grew: %d answers, %d promises, %d batches", len(b.present)+len(b.withheld), len(b.promises), len(b.batches))
	}
}

func TestWritersAndOtherThreadsAreNotHeldToAnotherThreadsCap(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := newBudget(10, c)
	noteGroups(b, 1)
	upstreamBatch(b, 1, "a", 20, 1)
	// A store's existence check of a withheld key, from a writer thread
	// (it created a tmp file before), answers as the store says: no
	// rewrite of a block on disk.
	b.NoteIOThread(7)
	if !b.Answer(key(0, "a", 15), 7, true) {
		t.Error("a writer's existence check of a withheld key answered absent")
	}
	// Another thread's own batch decides afresh; its answer does not bind
	// the thread that was given the cap.
	if !b.Answer(key(0, "a", 16), 8, true) {
		t.Error("another thread's first lookup of a key withheld from thread 1 answered absent with its rows free")
	}
	if b.Answer(key(0, "a", 16), 1, true) {
		t.Error("thread 1 got a present answer for a key it was told absent")
	}
	// A thread that turns out to be a writer gives its promises back.
	b.NoteIOThread(8)
	if st := b.Stats(); st.Promised != 10 {
		t.Errorf("%d rows promised, want thread 1's 10", st.Promised)
	}
}

// The engine's walk skips the chunks its rows still hold (a primary-tier
// hit needs no lookup), but they take rows of the hit too.
func TestResidentChunksBeforeTheLookupsTakeRows(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := newBudget(40, c)
	upstreamBatch(b, 2, "a", 40, 1) // an earlier request teaches the chain
	for i := range 20 {
		b.Loaded(key(0, "a", i)) // loaded: in the engine's rows now
	}
	c.advance(2 * time.Second) // that request is done
	present := 0
	for i := 20; i < 60; i++ {
		if b.Answer(key(0, "a", i), 1, true) {
			present++
		}
	}
	if present != 20 {
		t.Errorf("%d looked-up chunks present after 20 resident ones, want 20 (40 rows)", present)
	}
	// Another chain's lookups are not charged for them.
	c.advance(10 * time.Second)
	present = 0
	for i := 20; i < 60; i++ {
		if b.Answer(key(0, "b", i), 2, true) {
			present++
		}
	}
	if present != 40 {
		t.Errorf("%d of another chain present, want 40", present)
	}
}

// The estimate of the engine's rows keeps the latest rows' worth of blocks
// of every tier and group, so it loses a long chain's older chunks while
// the engine still holds them; a chunk the walk skips takes a row all the
// same, unless the engine looked it up since its rows last took it.
func TestSkippedChunksChargedBeyondTheEstimate(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := newBudget(40, c)
	upstreamBatch(b, 2, "a", 40, 1) // an earlier request teaches the chain
	for i := range 20 {
		b.Loaded(key(0, "a", i))
	}
	for i := range 40 {
		b.NoteStore(Key{Tier: "other", Hash: hash("o", i)}) // pushes a out of the estimate
	}
	c.advance(2 * time.Second)
	present := 0
	for i := 20; i < 60; i++ {
		if b.Answer(key(0, "a", i), 1, true) {
			present++
		}
	}
	if present != 20 {
		t.Errorf("%d looked-up chunks present after 20 skipped ones, want 20 (40 rows)", present)
	}
	// The engine asks for a5 again: its rows lost it, so the walk back
	// from a20 meets a5, reaches no chain head, and charges nothing.
	c.advance(2 * time.Second)
	b.Answer(key(0, "a", 5), 3, true)
	c.advance(2 * time.Second)
	present = 0
	for i := 20; i < 60; i++ {
		if b.Answer(key(0, "a", i), 1, true) {
			present++
		}
	}
	if present != 40 {
		t.Errorf("%d looked-up chunks present once a5 was looked up, want 40 (a5's row is gone)", present)
	}
}

// vLLM main's walk skips the prefix chunks its rows hold, so its prefix
// lookups teach no link across them; its window group's scan from the end
// asks every chunk, and teaches the links the next request's walk back
// needs to charge the skipped chunks.
func TestWindowScanFromTheEndTeachesLinks(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := newBudget(20, c)
	noteGroups(b, 2)
	// a3..a7 are in the engine's rows: neither request asks their prefix keys.
	asked := []int{0, 1, 2}
	for i := 8; i < 30; i++ {
		asked = append(asked, i)
	}
	request := func(scan bool) (past int) {
		for _, i := range asked {
			if b.Answer(key(0, "a", i), 1, true) && i >= 8 {
				past++
			}
		}
		if scan {
			for i := 29; i >= 0; i-- {
				b.Answer(key(1, "a", i), 1, true)
			}
		}
		c.advance(2 * time.Second)
		return past
	}
	// 20 rows − 4 for the window group: 16, 3 before the gap.
	if past := request(true); past != 13 {
		t.Fatalf("first request: %d present past the gap, want 13 (no link across it yet)", past)
	}
	if past := request(false); past != 8 {
		t.Errorf("next request: %d present past the gap, want 8 (the 5 skipped chunks charged)", past)
	}
}

// A key looked up before it was stored, then again once it is, answers
// present: a miss before any present key ends no prefix.
func TestKeyStoredWhileLookedUp(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := newBudget(4, c)
	noteGroups(b, 1)
	if b.Answer(key(0, "a", 0), 1, false) {
		t.Fatal("absent answered present")
	}
	if !b.Answer(key(0, "a", 0), 1, true) {
		t.Error("the key, stored since, answered absent")
	}
}

// A thread that asks a key of its prefix again starts over: a miss of a
// block removed since does not end the prefix for the next keys it asks.
func TestThreadStartsOver(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := newBudget(4, c)
	noteGroups(b, 1)
	b.Answer(key(0, "a", 0), 1, true)
	b.Loaded(key(0, "a", 0))
	b.Answer(key(0, "a", 0), 1, false) // removed since
	if !b.Answer(key(0, "a", 1), 1, true) {
		t.Error("a key asked after a removed one answered absent")
	}
}

// A block the engine looks up is not in its rows (it looks up only what
// they lack), whatever its loads or stores said before.
func TestLookedUpIsNotResident(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := newBudget(2, c)
	noteGroups(b, 1)
	upstreamBatch(b, 2, "a", 2, 1) // teaches a1 follows a0
	b.Loaded(key(0, "a", 0))
	b.Loaded(key(0, "a", 1))
	c.advance(2 * time.Second)
	b.Answer(key(0, "a", 0), 3, true) // evicted since: the engine asks for it
	c.advance(2 * time.Second)
	if !b.Answer(key(0, "a", 1), 1, true) || !b.Answer(key(0, "a", 2), 1, true) {
		t.Error("a batch was charged for a block the engine looked up since it was loaded")
	}
}

// The lookup thread's next request (a new batch within the gap: it asks a
// key of the last batch's prefix again) decides the keys the last one was
// denied afresh: an absent answer held across requests cut every later
// request's prefix at the same chunk, and the stock walk, finding the
// keys after it present, lost its whole hit (the agent bench's 9 %).
func TestWithheldKeyDecidedAfreshInTheThreadsNextBatch(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := newBudget(10, c)
	noteGroups(b, 1)
	// Two requests of one step: the second gets what the first left.
	upstreamBatch(b, 1, "x", 6, 1)
	if _, n := presentRange(upstreamBatch(b, 1, "a", 20, 1)[0]); n != 4 {
		t.Fatalf("second request of the step: %d present, want the 4 rows left", n)
	}
	for i := range 6 {
		b.Loaded(key(0, "x", i))
	}
	for i := range 4 {
		b.Loaded(key(0, "a", i))
	}
	// The engine's rows lose x (another thread's lookup of it says so) and
	// a's next turn asks a again.
	c.advance(100 * time.Millisecond)
	upstreamBatch(b, 3, "x", 6, 1)
	if first, n := presentRange(upstreamBatch(b, 1, "a", 20, 1)[0]); first != 0 || n != 10 {
		t.Errorf("next request: %d present from %d, want 10 from 0 (chunks 4..9 were denied to the last request only)", n, first)
	}
}

// Another thread's present answer (a store's existence check of a block
// already on disk, from a thread that never wrote one) does not extend a
// capped batch: its prefix stays cut at the cap and its window group keeps
// to the window, or the stock walk finds a prefix with a gap and chunks
// past the cap that take the window's rows.
func TestOtherThreadsAnswerDoesNotPassTheCap(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := newBudget(14, c)
	noteGroups(b, 2)
	prefix := make([]bool, 30)
	for i := range 12 {
		prefix[i] = b.Answer(key(0, "a", i), 1, true)
	}
	if !b.Answer(key(0, "a", 20), 7, true) || !b.Answer(key(1, "a", 20), 7, true) {
		t.Fatal("a store thread's check of a stored block answered absent")
	}
	for i := 12; i < 30; i++ {
		prefix[i] = b.Answer(key(0, "a", i), 1, true)
	}
	if first, n := presentRange(prefix); first != 0 || n != 10 {
		t.Errorf("prefix group: %d present from %d, want 10 from 0 (14 rows - 4 for the window group)", n, first)
	}
	window := make([]bool, 30)
	for i := range 30 {
		window[i] = b.Answer(key(1, "a", i), 1, true)
	}
	if first, n := presentRange(window); first != 6 || n != 4 {
		t.Errorf("window group: %d present from %d, want the 4 chunks 6..9 before the cap", n, first)
	}
}

// Present entries of a tier the budget decides must not be cached by the
// kernel, from the start (rows come later); an exempt tier's may be.
func TestMustAskUntilExempt(t *testing.T) {
	c := &clock{now: time.Unix(1000, 0)}
	b := newBudget(0, c)
	if !b.MustAsk("t") {
		t.Error("a tier with no rows known yet may be cached: its entries would escape the budget once rows come")
	}
	b.SetRows(10)
	b.Exempt("t")
	if b.MustAsk("t") || !b.MustAsk("u") {
		t.Error("want only the exempt tier cacheable")
	}
}
