package rowsync

import (
	"errors"
	"io/fs"
	"strings"
	"testing"
)

func TestParseMode(t *testing.T) {
	for s, want := range map[string]Mode{"auto": ModeAuto, "on": ModeOn, "off": ModeOff} {
		if m, err := ParseMode(s); err != nil || m != want || m.String() != s {
			t.Errorf("ParseMode(%q) = %v, %v", s, m, err)
		}
	}
	_, err := ParseMode("yes")
	if err == nil || err.Error() != `replicated-KV mode "yes": want auto, on or off` {
		t.Errorf("ParseMode(yes) = %v", err)
	}
	var m Mode
	if err := m.Set("off"); err != nil || m != ModeOff {
		t.Errorf("Set(off) = %v, mode %v", err, m)
	}
	if err := m.Set("ON"); err == nil || m != ModeOff {
		t.Errorf("Set(ON) = %v, mode %v", err, m)
	}
}

func TestGateAuto(t *testing.T) {
	var logged []string
	g := NewGate(ModeAuto, func(format string, args ...any) { logged = append(logged, format) })
	if g.Allowed() {
		t.Fatal("auto allows mirroring before any evidence")
	}
	g.NoteSample("k1", 0x1234, 0x1234, "nodeB:7470")
	g.NoteSample("k2", 0x5678, 0x5678, "nodeB:7470")
	if !g.Allowed() {
		t.Fatal("auto refuses mirroring after identical samples")
	}
	if s := g.Snapshot(); s.Samples != 2 || s.Mismatches != 0 || s.DecidedBy != "2 identical store samples" || s.Mode != "auto" {
		t.Errorf("snapshot %+v", s)
	}
	g.NoteSample("k3", 0x1111, 0x2222, "nodeB:7470")
	g.NoteSample("k4", 0x3333, 0x3333, "nodeB:7470")
	if g.Allowed() {
		t.Fatal("auto still mirrors after a mismatch")
	}
	s := g.Snapshot()
	if s.Samples != 3 || s.Mismatches != 1 || !strings.Contains(s.DecidedBy, `store sample "k3": row CRC32C 00001111 here, 00002222 on nodeB:7470`) {
		t.Errorf("snapshot %+v", s)
	}
	if len(logged) != 2 {
		t.Errorf("logged %q, want the enabling and the disabling", logged)
	}
}

func TestGateFlags(t *testing.T) {
	on, off := NewGate(ModeOn, nil), NewGate(ModeOff, nil)
	on.NoteSample("k", 1, 2, "p")
	off.NoteSample("k", 1, 1, "p")
	if !on.Allowed() || off.Allowed() {
		t.Errorf("on allowed %v, off allowed %v", on.Allowed(), off.Allowed())
	}
	if s := on.Snapshot(); s.DecidedBy != "flag --replicated-kv=on" || s.Mismatches != 1 || !strings.Contains(s.FirstMismatch, "not replicated") {
		t.Errorf("on: %+v", s)
	}
}

func TestGateSampling(t *testing.T) {
	g := NewGate(ModeAuto, nil)
	taken := 0
	for range 10 * sampleEvery {
		if g.WantSample() {
			taken++
			if taken <= firstSamples {
				g.NoteSample("k", 1, 1, "p")
			}
		}
	}
	if want := firstSamples + 10; taken != want {
		t.Errorf("sampled %d of %d stores, want %d", taken, 10*sampleEvery, want)
	}
}

// memoryNotes is Notes in memory, as the store's root xattrs across a restart.
type memoryNotes map[string][]byte

func (m memoryNotes) ReadNote(name string) ([]byte, error) {
	v, ok := m[name]
	if !ok {
		return nil, fs.ErrNotExist
	}
	return v, nil
}

func (m memoryNotes) WriteNote(name string, value []byte) error {
	m[name] = append([]byte(nil), value...)
	return nil
}

// TestGateRemembersAcrossRestart samples on one gate, then starts another
// on the same notes, as a restarted daemon: auto allows mirroring at once,
// and a mismatch seen before a restart still forbids it.
func TestGateRemembersAcrossRestart(t *testing.T) {
	notes := memoryNotes{}
	first := NewGate(ModeAuto, nil)
	if err := first.Remember(notes); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("remembering from empty notes: %v, want fs.ErrNotExist", err)
	}
	first.NoteSample("k1", 7, 7, "peer")
	first.NoteSample("k2", 8, 8, "peer")

	restarted := NewGate(ModeAuto, nil)
	if restarted.Allowed() {
		t.Fatal("a fresh gate allows mirroring before any sample")
	}
	if err := restarted.Remember(notes); err != nil {
		t.Fatal(err)
	}
	if snap := restarted.Snapshot(); !snap.Allowed || snap.Samples != 2 || !strings.Contains(snap.DecidedBy, "before a restart") {
		t.Fatalf("after a restart on 2 identical samples: %+v, want mirroring allowed on them", snap)
	}

	restarted.NoteSample("k3", 1, 2, "peer")
	again := NewGate(ModeAuto, nil)
	if err := again.Remember(notes); err != nil {
		t.Fatal(err)
	}
	if snap := again.Snapshot(); snap.Allowed || snap.Mismatches != 1 || !strings.Contains(snap.DecidedBy, "k3") {
		t.Fatalf("after a restart on a mismatch: %+v, want mirroring off naming it", snap)
	}

	notes[evidenceNote] = []byte("not json")
	if err := NewGate(ModeAuto, nil).Remember(notes); err == nil || !strings.Contains(err.Error(), "decoding") {
		t.Fatalf("a garbled note: %v", err)
	}
}
