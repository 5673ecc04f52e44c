package rowsync

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// holdFirstCommit makes the next row commit wait until release; held is
// closed once that commit is waiting. Later commits run at once. Call it
// before starting the Server: the hook is restored after the Server closed,
// and the commit released before.
func holdFirstCommit(t *testing.T) (held <-chan struct{}, release func()) {
	t.Helper()
	waiting, released := make(chan struct{}), make(chan struct{})
	var taken atomic.Bool
	commit := commitRow
	commitRow = func(c *rowCommit, extents []Extent) {
		if !taken.Swap(true) {
			close(waiting)
			<-released
		}
		commit(c, extents)
	}
	t.Cleanup(func() { commitRow = commit })
	var once sync.Once
	release = func() { once.Do(func() { close(released) }) }
	return waiting, release
}

// filledRegion returns a region whose rows all hold data already, so that a
// row a test expects unchanged would show any write.
func filledRegion(t *testing.T) *Region {
	r := shmRegion(t, testRows, testRowBytes)
	for i := range testRows {
		fillHalf(r.Row(i), uint64(1000+i))
	}
	return r
}

// TestMirrorPeerUpOnlyOnceAFailedLanesCommitIsOver: a row whose commit had
// begun when its lane failed at the deadline lands after its load failed.
// The peer must not count up again before that commit is over, or the
// engine's next use of the row, mirrored over another lane, is overwritten
// by it (DESIGN "Lanes").
func TestMirrorPeerUpOnlyOnceAFailedLanesCommitIsOver(t *testing.T) {
	held, release := holdFirstCommit(t)
	dst := filledRegion(t)
	s := startServer(t, "127.0.0.1:0", testSecret, dst)
	t.Cleanup(release)
	src := shmRegion(t, testRows, testRowBytes)
	for i := range testRows {
		fillHalf(src.Row(i), uint64(i+1))
	}
	m, err := NewMirror(MirrorConfig{Peers: []string{s.Addr().String()}, Secret: testSecret,
		Deadline: 300 * time.Millisecond, Lanes: 2, Logf: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	waitFor(t, "peer up", m.Healthy)

	// Lanes are picked in turn: 1, 0, 1.
	stale := bytes.Clone(src.Row(2))
	if err := m.MirrorRow(context.Background(), src, 2, stale); err == nil { // lane 1, its commit held
		t.Fatal("a row whose commit was held past the deadline was acknowledged")
	}
	<-held
	fresh := src.Row(2)
	fillHalf(fresh, 99)
	freshErr := make(chan error, 1)
	go func() {
		// The engine reuses the row as soon as the peer is up.
		for !m.Healthy() {
			time.Sleep(time.Millisecond)
		}
		freshErr <- m.MirrorRow(context.Background(), src, 2, bytes.Clone(fresh)) // lane 0
	}()
	time.Sleep(300 * time.Millisecond) // room for the peer to be up and the fresh row to land, were they let
	release()
	if err := <-freshErr; err != nil {
		t.Fatalf("the fresh row: %v", err)
	}
	if err := m.MirrorRow(context.Background(), src, 3, bytes.Clone(src.Row(3))); err != nil { // lane 1
		t.Fatalf("a row after the release: %v", err)
	}
	if !bytes.Equal(dst.Row(2), fresh) {
		t.Errorf("the peer's row does not hold the fresh row (stale: %v)", bytes.Equal(dst.Row(2), stale))
	}
}
