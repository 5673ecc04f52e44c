package rowsync

import (
	"bytes"
	"strings"
	"testing"
)

func TestNewRegionGeometry(t *testing.T) {
	for _, tc := range []struct {
		size, rowBytes int
		want           string
	}{
		{size: 8192, rowBytes: 4096},
		{size: 8192, rowBytes: 3000, want: "not a whole number of 3000-byte rows"},
		{size: 0, rowBytes: 4096, want: "not a whole number"},
		{size: 4096, rowBytes: 0, want: "row size 0"},
		{size: 4096, rowBytes: -1, want: "row size -1"},
	} {
		r, err := NewRegion(make([]byte, tc.size), tc.rowBytes)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("NewRegion(%d, %d): %v", tc.size, tc.rowBytes, err)
		case tc.want == "" && (r.Rows() != tc.size/tc.rowBytes || r.RowBytes() != tc.rowBytes):
			t.Errorf("NewRegion(%d, %d): %d rows of %d", tc.size, tc.rowBytes, r.Rows(), r.RowBytes())
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("NewRegion(%d, %d) = %v, want error containing %q", tc.size, tc.rowBytes, err, tc.want)
		}
	}
}

func TestOpenRegion(t *testing.T) {
	odd := shmFile(t, 3*8192+1)
	if _, err := OpenRegion(odd, 8192); err == nil || !strings.Contains(err.Error(), "not a whole number of 8192-byte rows") {
		t.Errorf("OpenRegion(3 rows + 1 byte) = %v", err)
	}
	if _, err := OpenRegion(odd+".missing", 8192); err == nil {
		t.Error("OpenRegion(missing file) succeeded")
	}

	// Two mappings of one file see each other's writes.
	path := shmFile(t, 3*8192)
	a, b := openRegion(t, path, 8192), openRegion(t, path, 8192)
	copy(a.Row(2), "written through a")
	if !bytes.HasPrefix(b.Row(2), []byte("written through a")) {
		t.Error("row 2 differs between two mappings of one file")
	}
}
