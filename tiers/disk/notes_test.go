package disk

import (
	"bytes"
	"errors"
	"io/fs"
	"strings"
	"testing"
)

// TestNotesSurviveReopen writes a note, reopens the store and reads it back;
// an unknown note and an oversized value are refused.
func TestNotesSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadNote("replication"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("reading a note never written: %v, want fs.ErrNotExist", err)
	}
	if err := s.WriteNote("replication", []byte(`{"samples":3}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteNote("replication", bytes.Repeat([]byte("x"), MaxNoteBytes+1)); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("an oversized note: %v", err)
	}
	s.Close()
	s, err = Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.ReadNote("replication")
	if err != nil || string(got) != `{"samples":3}` {
		t.Fatalf("the note after reopening: %q, %v", got, err)
	}
}
