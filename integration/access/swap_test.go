package access_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestSwappedStoreDirectoryLeadsNowhere is issue 24's first attack: the
// engine's uid, which owns the store tree, makes T through the mount, then
// in the store moves T away and puts a link to a root-owned directory in its
// place. Through the mount's cached T it then tries every operation the root
// daemon runs for it (chmod 04777, truncate, create, write, unlink, rename,
// mkdir, mknod, symlink, link, listing): none may reach the root's
// directory, whose files keep their modes, sizes and names. Also with a
// daemon whose kernel answers openat2 with ENOSYS (a seccomp filter, as in
// some sandboxes), where the store walks its paths itself.
func TestSwappedStoreDirectoryLeadsNowhere(t *testing.T) {
	t.Run("openat2", func(t *testing.T) { swapAttack(t, false) })
	t.Run("without-openat2", func(t *testing.T) { swapAttack(t, true) })
}

// swapAttack is TestSwappedStoreDirectoryLeadsNowhere against one daemon.
func swapAttack(t *testing.T, withoutOpenat2 bool) {
	engine := newUser(t, "swp")
	dir := sharedDir(t)
	var wrapper []string
	if withoutOpenat2 {
		helper, _ := binaries(t, dir)
		wrapper = []string{"env", helperEnv + "=1", helper, "without-openat2"}
	}
	store := filepath.Join(dir, "store")
	if err := os.Mkdir(store, 0o755); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(dir, "rootdir")
	if err := os.Mkdir(victim, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]os.FileMode{"tool": 0o755, "keep": 0o644, "big": 0o644} {
		if err := os.WriteFile(filepath.Join(victim, name), []byte("root's own bytes\n"), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(victim, name), mode); err != nil {
			t.Fatal(err)
		}
	}
	before := snapshot(t, victim)

	d := mounttest.Start(t, mounttest.Options{Store: store, Mountpoint: filepath.Join(dir, "mnt"), Wrapper: wrapper,
		Args: []string{"--allow-other", "--engine-uid", strconv.Itoa(engine.uid)}})
	// One directory per attack, so that each reaches the daemon through a
	// directory the kernel still holds as the engine's.
	attacks := []string{
		"chmod 04777 %s/tool",
		"truncate -s 0 %s/big",
		"echo forged > %s/keep",
		"echo planted > %s/new",
		"rm %s/keep",
		"mv %[1]s/tool %[1]s/moved",
		"mkdir %s/sub",
		"mkfifo %s/fifo",
		"ln -s /etc/shadow %s/link",
		"ln %[1]s/big %[1]s/hard",
		"ls -a %s",
	}
	var setup, attack []string
	for i, op := range attacks {
		name := "T" + strconv.Itoa(i)
		mnt := d.Path(name)
		// Made through the mount: the kernel holds the directory and
		// its files as the engine's (so that a chmod or truncate reaches
		// the daemon while their attributes are cached).
		setup = append(setup, "mkdir "+mnt, "echo own > "+mnt+"/tool", "echo own > "+mnt+"/big",
			"echo own > "+mnt+"/keep", "ls -l "+mnt+" > /dev/null")
		// The swap, in the store, then the attack through the mount.
		attack = append(attack, "mv "+store+"/"+name+" "+store+"/"+name+".o", "ln -s "+victim+" "+store+"/"+name,
			fmt.Sprintf(op, mnt))
	}
	if out, ok := as(engine, nil, "sh", "-c", strings.Join(setup, " && ")); !ok {
		t.Fatalf("the engine's uid cannot work in its mount: %s", out)
	}
	out, _ := as(engine, nil, "sh", "-c", strings.Join(attack, "; "))
	t.Logf("attacks through swapped directories:\n%s", out)
	for _, name := range []string{"tool", "big", "keep"} {
		if strings.Contains(out, "\n"+name+"\n") {
			t.Errorf("the mount listed the root's directory through the link: %s", out)
		}
	}

	if after := snapshot(t, victim); after != before {
		t.Errorf("the root's directory changed through the mount:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// The engine's own files, moved away, are untouched too.
	for i := range attacks {
		for _, name := range []string{"tool", "big", "keep"} {
			var st syscall.Stat_t
			p := filepath.Join(store, "T"+strconv.Itoa(i)+".o", name)
			if err := syscall.Lstat(p, &st); err != nil || st.Mode&0o7000 != 0 || st.Size == 0 {
				t.Errorf("%s: %v, mode %o, size %d", p, err, st.Mode, st.Size)
			}
		}
	}
}

// snapshot describes every name in dir: type, mode, owner, size, xattrs.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range entries {
		var st syscall.Stat_t
		p := filepath.Join(dir, e.Name())
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		xattrs := make([]byte, 1024)
		n, _ := syscall.Listxattr(p, xattrs)
		b.WriteString(e.Name() + " mode=" + strconv.FormatUint(uint64(st.Mode), 8) + " uid=" + strconv.Itoa(int(st.Uid)) +
			" size=" + strconv.FormatInt(st.Size, 10) + " xattrs=" + strconv.Quote(string(xattrs[:max(n, 0)])) + "\n")
	}
	return b.String()
}

// Every kind of name the engine's uid makes through the mount (file,
// directory, FIFO, link, hard link) is its own in the store, as the
// store's defences assume.
func TestEveryNameMadeBelongsToEngine(t *testing.T) {
	engine := newUser(t, "own")
	dir := sharedDir(t)
	store := filepath.Join(dir, "store")
	if err := os.Mkdir(store, 0o755); err != nil {
		t.Fatal(err)
	}
	d := mounttest.Start(t, mounttest.Options{Store: store, Mountpoint: filepath.Join(dir, "mnt"),
		Args: []string{"--allow-other", "--engine-uid", strconv.Itoa(engine.uid)}})
	mnt := d.Path("T")
	script := "mkdir " + mnt + " && echo x > " + mnt + "/file && mkfifo " + mnt + "/fifo && ln -s file " + mnt +
		"/link && ln " + mnt + "/file " + mnt + "/hard && mkdir " + mnt + "/sub"
	if out, ok := as(engine, nil, "sh", "-c", script); !ok {
		t.Fatalf("the engine's uid making names through its mount: %s", out)
	}
	for _, name := range []string{"T", "T/file", "T/fifo", "T/link", "T/hard", "T/sub"} {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(store, name), &st); err != nil {
			t.Fatal(err)
		}
		if int(st.Uid) != engine.uid || int(st.Gid) != engine.gid {
			t.Errorf("store/%s: owner %d:%d, want the engine's %d:%d", name, st.Uid, st.Gid, engine.uid, engine.gid)
		}
	}
	if target, err := os.Readlink(d.Path("T", "link")); err != nil || target != "file" {
		t.Errorf("readlink through the mount: %q, %v", target, err)
	}
}

// TestHardLinkThroughStaleNode links a file the kernel still holds open
// after the store's name for it was given to another file (the engine's uid
// replaced it in the store), once by a link and once by a regular file: the
// call either links the file the kernel named or creates nothing. Main
// linked the store's new file and, for the link, answered EIO after
// creating it.
func TestHardLinkThroughStaleNode(t *testing.T) {
	store := t.TempDir()
	d := mounttest.Start(t, mounttest.Options{Store: store})
	for replacement, replace := range map[string]func(string) error{
		"symlink": func(p string) error { return os.Symlink("/etc/passwd", p) },
		"file":    func(p string) error { return os.WriteFile(p, []byte("another file\n"), 0o644) },
	} {
		t.Run(replacement, func(t *testing.T) {
			name := "held-" + replacement
			if err := os.WriteFile(d.Path(name), []byte("the held file\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			held, err := os.Open(d.Path(name))
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			if err := os.Rename(filepath.Join(store, name), filepath.Join(store, name+".moved")); err != nil {
				t.Fatal(err)
			}
			if err := replace(filepath.Join(store, name)); err != nil {
				t.Fatal(err)
			}
			link := name + ".link"
			// Linking the open descriptor names the kernel's node, whatever
			// its dentry's timeout.
			err = unix.Linkat(int(held.Fd()), "", unix.AT_FDCWD, d.Path(link), unix.AT_EMPTY_PATH)
			var linked, moved syscall.Stat_t
			lerr := syscall.Lstat(filepath.Join(store, link), &linked)
			if serr := syscall.Lstat(filepath.Join(store, name+".moved"), &moved); serr != nil {
				t.Fatal(serr)
			}
			switch {
			case err != nil && lerr == nil:
				t.Errorf("link failed (%v) but created store/%s (inode %d)", err, link, linked.Ino)
			case err == nil && (lerr != nil || linked.Ino != moved.Ino):
				t.Errorf("link succeeded, store/%s: %v, inode %d; want the held file's inode %d", link, lerr, linked.Ino, moved.Ino)
			}
			t.Logf("link through the stale node: %v", err)
		})
	}
}
