package core

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
)

// failingFetcher stands for a shared level that cannot fetch.
type failingFetcher struct{ err error }

func (f failingFetcher) Fetch(string) ([]byte, error) { return nil, f.err }

// TestStagingFetchOrder: staging reads the local store first and the shared
// level only for a block the store lacks; the bytes a fetch read are staged
// as they are, the store is read after a fetch that handed none, and a
// failed fetch fails the read.
func TestStagingFetchOrder(t *testing.T) {
	f := newFixture(t)
	localRel, localData := f.put(t, 1)
	missingRel, missingData := testBlock(2)
	handed := bytes.Clone(missingData)
	handed[0]++ // tells the fetch's bytes from a read of the store
	refusal := errors.New("shared store unreachable")
	for _, tc := range []struct {
		name  string
		rel   string
		level Fetcher
		want  []byte
		err   error
	}{
		{"local block, a level that must not be asked", localRel, failingFetcher{refusal}, localData, nil},
		{"missing block, no level", missingRel, nil, nil, syscall.ENOENT},
		{"missing block, fetch fails", missingRel, failingFetcher{refusal}, nil, refusal},
		{"missing block, the fetch's bytes", missingRel, importingFetcher{store: f.store, stored: missingData, handed: handed}, handed, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := StagingFetch(f.store, tc.level)(refOf(tc.rel))
			if !errors.Is(err, tc.err) || !bytes.Equal(got, tc.want) {
				t.Fatalf("got %d bytes (want equal: %v), err %v; want err %v", len(got), bytes.Equal(got, tc.want), err, tc.err)
			}
		})
	}
}

// TestStagingFetchReadsTheStoreAfterAnEmptyFetch: a fetch that kept the
// block but handed no bytes (a concurrent fetch read them) is followed by a
// read of the store.
func TestStagingFetchReadsTheStoreAfterAnEmptyFetch(t *testing.T) {
	f := newFixture(t)
	rel, data := testBlock(3)
	got, err := StagingFetch(f.store, importingFetcher{store: f.store, stored: data})(refOf(rel))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("got %d bytes (equal: %v), err %v; want the stored block", len(got), bytes.Equal(got, data), err)
	}
}
