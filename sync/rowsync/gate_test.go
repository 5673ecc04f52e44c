package rowsync

import (
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
