package disk

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// Each run a rename reads back lies inside the file and inside its part, and
// holds the file's bytes; a run of zero pages is not telling.
func TestReadRunStaysInItsPart(t *testing.T) {
	var buffers blockBuffers
	buf := buffers.get(verifyPages * block.PageSize)
	direct := false
	for _, pages := range []int64{1, 2, 3, 8, 9, 23, 24, 25, 2048} {
		size := pages * page64
		data := make([]byte, size)
		for p := range pages {
			data[p*page64] = byte(p + 1) // every page non-zero, and told apart
		}
		f := tempFile(t, data)
		for i := 0; i < verifyRuns; i++ {
			for range 20 {
				got, telling, err := readRun(f, size, i, buf, &direct)
				if err != nil {
					t.Fatalf("%d pages, run %d: %v", pages, i, err)
				}
				if want := min(pages, verifyPages); int64(len(got)) != want || !telling {
					t.Fatalf("%d pages, run %d: %d pages read (telling %v), want %d", pages, i, len(got), telling, want)
				}
				for off, page := range got {
					if off < 0 || off+page64 > size || !bytes.Equal(page, data[off:off+page64]) {
						t.Fatalf("%d pages, run %d: page at %d is not the file's", pages, i, off)
					}
					partStart := pages * int64(i) / verifyRuns * page64
					partEnd := pages * int64(i+1) / verifyRuns * page64
					if partEnd-partStart >= verifyPages*page64 && (off < partStart || off >= partEnd) {
						t.Fatalf("%d pages, run %d: page at %d outside its part [%d, %d)", pages, i, off, partStart, partEnd)
					}
				}
			}
		}
	}
	zero := tempFile(t, make([]byte, 64*block.PageSize))
	if _, telling, err := readRun(zero, 64*page64, 1, buf, &direct); err != nil || telling {
		t.Fatalf("a run of zero pages: telling %v, err %v; want not telling", telling, err)
	}
}

// tempFile is a file holding data, open for reading.
func tempFile(t *testing.T, data []byte) *os.File {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tmp")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
