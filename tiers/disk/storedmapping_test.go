package disk

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// loadLikeTheMount loads block rel as fusefs/core does from a store in
// memory: its kept mapping as proven, else a new mapping checked, else a
// copy checked. atStore tells whether the bytes came proven by the block's
// store, so unchecked by this load.
func loadLikeTheMount(t *testing.T, s *Store, rel string) (got []byte, atStore bool, err error) {
	t.Helper()
	r, err := s.PinBlock(rel)
	if err != nil {
		return nil, false, err
	}
	defer r.Close()
	m, ok := r.Map()
	if !ok {
		buf := make([]byte, r.Size())
		if err := r.ReadInto(buf, nil); err != nil {
			return nil, false, err
		}
		return buf, false, nil
	}
	defer m.Release()
	if !m.Proven() {
		if err := r.VerifyMapped(m, func(int) {}); err != nil {
			return nil, false, err
		}
	} else if !m.Held() {
		t.Fatal("a kept mapping was handed out without its lease")
	}
	return bytes.Clone(m.Bytes()), m.ProvenAtStore(), nil
}

// TestBlockWrittenThroughTheDaemonIsProvenAtStore stores a block through
// the daemon on tmpfs: its tmp held a write lease from its creation, so the
// block is kept mapped from its store and its first load is served from
// that mapping with no check. The daemon's own opens of the block (the pin,
// its xattrs, its times) leave the lease alone.
func TestBlockWrittenThroughTheDaemonIsProvenAtStore(t *testing.T) {
	s := openMemoryStore(t)
	rel, data := blockRel("t", 0, hashHex(1, 64)), pageData(1, 64)
	putBlock(t, s, rel, data)
	if n := keptMappings(s); n != 1 {
		t.Fatalf("%d mappings kept after the store, want 1", n)
	}
	for load := range 2 {
		got, atStore, err := loadLikeTheMount(t, s, rel)
		if err != nil || !atStore || !bytes.Equal(got, data) {
			t.Fatalf("load %d: proven at store %v, same bytes %v, %v; want true, true, nil", load, atStore, bytes.Equal(got, data), err)
		}
		if _, err := s.ReadOnFile(rel, func(fd int) error {
			_, err := unix.Fgetxattr(fd, "user.vllm.kv_crc32c", make([]byte, 8))
			if err == unix.ENODATA {
				return nil
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.SetTimes(rel, unix.Timespec{Nsec: unix.UTIME_NOW}, unix.Timespec{Nsec: unix.UTIME_OMIT}); err != nil {
			t.Fatal(err)
		}
	}
	checkAccounting(t, s)
}

// TestChangeBetweenStoreAndLoadIsChecked changes a block's file in the
// store between its store and its first load, as the engine's uid can:
// another process writing a byte into it, truncating it, or a file renamed
// over its name. The change breaks the write lease (a rename breaks no
// lease, but the name no longer holds the file kept), so the load checks
// the file, fails with EIO and drops the block.
func TestChangeBetweenStoreAndLoadIsChecked(t *testing.T) {
	for _, change := range []string{"write", "truncate", "replace"} {
		t.Run(change, func(t *testing.T) {
			s := openMemoryStore(t)
			rel, data := blockRel("t", 0, hashHex(1, 64)), pageData(1, 64)
			putBlock(t, s, rel, data)
			p := s.Path(rel)
			var cmd *exec.Cmd
			switch change {
			case "write":
				cmd = exec.Command("sh", "-c", fmt.Sprintf(`printf '\377' | dd of=%s bs=1 seek=4096 conv=notrunc status=none`, p))
			case "truncate":
				// truncate(2) of the name, which opens nothing (coreutils'
				// truncate opens O_NONBLOCK, so the lease makes it fail
				// with EAGAIN instead).
				for _, size := range []int64{4096, int64(len(data))} {
					if err := unix.Truncate(p, size); err != nil {
						t.Fatal(err)
					}
				}
			case "replace":
				other := pageData(2, 64)
				if err := os.WriteFile(p+".other", other, 0o600); err != nil {
					t.Fatal(err)
				}
				cmd = exec.Command("mv", p+".other", p)
			}
			if cmd != nil {
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("%s: %v: %s", cmd, err, out)
				}
			}
			_, atStore, err := loadLikeTheMount(t, s, rel)
			if atStore {
				t.Fatal("the changed block was served from its store's mapping")
			}
			wantErrno(t, err, syscall.EIO, "loading the changed block")
			if s.Contains(rel) {
				t.Fatal("the changed block is still indexed")
			}
		})
	}
}

// TestTmpOpenedWhileWrittenIsCheckedAtLoad opens a tmp's store file while
// the daemon writes it: the open breaks the tmp's write lease (an open that
// does not wait fails with EWOULDBLOCK, so the lease was held), the store
// gives the lease back so that a waiting open goes on, and the block, once
// published, is not kept from its store: its first load checks it.
func TestTmpOpenedWhileWrittenIsCheckedAtLoad(t *testing.T) {
	s := openMemoryStore(t)
	rel, data := blockRel("t", 0, hashHex(1, 64)), pageData(1, 64)
	mkdirFor(t, s, rel)
	tmp := tmpRelFor(rel, 1)
	w, err := s.CreateTmp(tmp, engineCreateFlags)
	if err != nil {
		t.Fatal(err)
	}
	half := len(data) / 2
	if _, err := w.WriteAt(data[:half], 0); err != nil {
		t.Fatal(err)
	}
	if fd, err := unix.Open(s.Path(tmp), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err != unix.EWOULDBLOCK {
		unix.Close(fd)
		t.Fatalf("an open of the tmp that does not wait: %v, want EWOULDBLOCK (the tmp's write lease)", err)
	}
	reader, err := os.Open(s.Path(tmp))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	if _, err := w.WriteAt(data[half:], int64(half)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(tmp, rel); err != nil {
		t.Fatal(err)
	}
	if n := keptMappings(s); n != 0 {
		t.Fatalf("%d mappings kept from a store whose lease broke, want 0", n)
	}
	got, atStore, err := loadLikeTheMount(t, s, rel)
	if err != nil || atStore || !bytes.Equal(got, data) {
		t.Fatalf("first load: proven at store %v, same bytes %v, %v; want false, true, nil", atStore, bytes.Equal(got, data), err)
	}
	checkAccounting(t, s)
}
