package shm

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// dirent64 builds one struct linux_dirent64 record, padded to 8 bytes.
func dirent64(name string, typ uint8) []byte {
	reclen := (direntNameAt + len(name) + 1 + 7) &^ 7
	b := make([]byte, reclen)
	binary.NativeEndian.PutUint64(b, 42)
	binary.NativeEndian.PutUint16(b[direntReclenAt:], uint16(reclen))
	b[direntTypeAt] = typ
	copy(b[direntNameAt:], name)
	return b
}

func TestParseDirents(t *testing.T) {
	var buf []byte
	for _, r := range []struct {
		name string
		typ  uint8
	}{{".", unix.DT_DIR}, {"..", unix.DT_DIR}, {"a.mmap", unix.DT_REG}, {"d.mmap", unix.DT_DIR}, {"l.mmap", unix.DT_LNK}} {
		buf = append(buf, dirent64(r.name, r.typ)...)
	}
	got, err := parseDirents(buf, nil)
	want := []dirent{{"a.mmap", unix.DT_REG}, {"d.mmap", unix.DT_DIR}, {"l.mmap", unix.DT_LNK}}
	if err != nil || len(got) != len(want) {
		t.Fatalf("parsed %+v, %v; want %+v", got, err, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("entry %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	for _, bad := range [][]byte{buf[:len(buf)-3], buf[:direntNameAt-1], func() []byte {
		b := dirent64("x", unix.DT_REG)
		binary.NativeEndian.PutUint16(b[direntReclenAt:], direntNameAt-1)
		return b
	}()} {
		if _, err := parseDirents(bad, nil); err != unix.EIO {
			t.Fatalf("a record that does not fit: %v, want EIO", err)
		}
	}
}

// FuzzParseDirents: any reply parses or fails with EIO, never panics, and
// no name returned is empty, ".", ".." or holds a NUL.
func FuzzParseDirents(f *testing.F) {
	f.Add(dirent64("vllm_offload_1.mmap", unix.DT_REG))
	f.Add(append(dirent64("a", unix.DT_DIR), dirent64("b", unix.DT_LNK)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := parseDirents(b, nil)
		if err != nil && err != unix.EIO {
			t.Fatalf("error %v, want EIO or none", err)
		}
		for _, d := range got {
			if strings.IndexByte(d.name, 0) >= 0 || d.name == "" || d.name == "." || d.name == ".." {
				t.Fatalf("name %q", d.name)
			}
		}
	})
}

func TestSplitGlob(t *testing.T) {
	for _, c := range []struct{ glob, dir, pattern, err string }{
		{"/dev/shm/vllm_offload_*.mmap", "/dev/shm", "vllm_offload_*.mmap", ""},
		{"/dev/shm/r.mmap", "/dev/shm", "r.mmap", ""},
		{"r*.mmap", ".", "r*.mmap", ""},
		{"/dev/shm/*/r.mmap", "", "", "last component only"},
		{"/dev/shm/", "", "", "names a directory"},
		{"/dev/shm/[", "", "", "syntax error"},
	} {
		dir, pattern, err := splitGlob(c.glob)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: %v, want an error with %q", c.glob, err, c.err)
			}
			continue
		}
		if err != nil || dir != c.dir || pattern != c.pattern {
			t.Errorf("%q: %q %q %v, want %q %q", c.glob, dir, pattern, err, c.dir, c.pattern)
		}
	}
}

// Scan tells each kind of name apart from the directory's listing and the
// kernel's attributes: a regular file is examined, a directory, a link and
// a FIFO are not, and (as root) a file bind-mounted on a name is a mount
// point, which OpenFile refuses too. The FUSE server that never answers is
// integration/mount's TestShmGlobNeverWaitsOnAMountedServer.
func TestScanTellsKindsApart(t *testing.T) {
	dir := t.TempDir()
	p := func(name string) string { return filepath.Join(dir, name) }
	if err := os.WriteFile(p("file.mmap"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p("other.txt"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(p("dir.mmap"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(p("file.mmap"), p("link.mmap")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(p("fifo.mmap"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"file.mmap": "", "dir.mmap": reasonNotRegular, "link.mmap": reasonLink, "fifo.mmap": reasonNotRegular}
	if os.Geteuid() == 0 {
		source := filepath.Join(t.TempDir(), "source")
		if err := os.WriteFile(source, make([]byte, 8192), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p("bound.mmap"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(source, p("bound.mmap"), "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(p("bound.mmap"), unix.MNT_DETACH) })
		want["bound.mmap"] = reasonMountPoint
		var refused *RefusedError
		if f, _, _, err := OpenFile(p("bound.mmap"), unix.O_RDONLY); !errors.As(err, &refused) || refused.Reason != reasonMountPoint {
			if f != nil {
				f.Close()
			}
			t.Fatalf("OpenFile of a bind-mounted file: %v, want refused as a mount point", err)
		}
	}
	entries, err := Scan(filepath.Join(dir, "*.mmap"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(want) {
		t.Fatalf("entries %+v, want %d", entries, len(want))
	}
	for i, e := range entries {
		name := filepath.Base(e.Path)
		if i > 0 && entries[i-1].Path >= e.Path {
			t.Fatalf("entries not sorted: %+v", entries)
		}
		if reason, ok := want[name]; !ok || e.Reason != reason {
			t.Fatalf("%s: reason %q, want %q", name, e.Reason, reason)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(p("file.mmap"), &st); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if filepath.Base(e.Path) == "file.mmap" && (e.ID != FileID{Dev: st.Dev, Ino: st.Ino} || e.Size != 4096 || e.UID != st.Uid) {
			t.Fatalf("file entry %+v, want dev %d ino %d size 4096 uid %d", e, st.Dev, st.Ino, st.Uid)
		}
	}
	// EntryAt, which has no listing's d_type to go by, tells the same.
	dirFD, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dirFD)
	for _, e := range entries {
		name := filepath.Base(e.Path)
		got, err := EntryAt(dirFD, name)
		if e.Path = ""; err != nil || got != e {
			t.Errorf("EntryAt(%s) = %+v, %v; want %+v as Scan listed it", name, got, err, e)
		}
	}
	if got, err := EntryAt(dirFD, "gone.mmap"); err == nil {
		t.Errorf("EntryAt of a name that is not there = %+v, want an error", got)
	}
}
