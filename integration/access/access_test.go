package access_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/integration/engineio"
	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestPrivateToEngineUID mounts as root for an engine user, with
// --allow-other so that other users may try: the engine stores, lists,
// reads, matches and stats; another user can do none of it, and the store
// holds the engine's files with owner-only modes.
func TestPrivateToEngineUID(t *testing.T) {
	engine, other := newUser(t, "eng"), newUser(t, "oth")
	dir := sharedDir(t)
	helper, kvtierfs := binaries(t, dir)
	store := filepath.Join(dir, "store")
	if err := os.Mkdir(store, 0o755); err != nil {
		t.Fatal(err)
	}
	d := mounttest.Start(t, mounttest.Options{Store: store, Mountpoint: filepath.Join(dir, "mnt"),
		Args: []string{"--allow-other", "--engine-uid", strconv.Itoa(engine.uid)}})
	if opts := mountOptions(t, d.Mountpoint); !strings.Contains(opts, "allow_other") {
		t.Fatalf("--allow-other: mount options %s", opts)
	}

	hash := hashOf(1)
	block := filepath.Join(d.Mountpoint, tierDir, hash[:3], hash[3:5]+"_g0", hash+".bin")
	if out, ok := helperAs(engine, helper, "store", d.Mountpoint, hash); !ok {
		t.Fatalf("the engine's uid cannot store: %s", out)
	}
	stats := d.Path(ctlabi.Dir, ctlabi.StatsFile)
	for _, op := range [][]string{{"list", d.Mountpoint}, {"list", filepath.Dir(block)}, {"read", block}, {"read", stats}} {
		if out, ok := helperAs(engine, helper, op...); !ok {
			t.Errorf("the engine's uid: %s %s: %s", op[0], op[1], out)
		}
	}
	if out, ok := helperAs(engine, helper, "match", d.Mountpoint, hash); !ok || !strings.Contains(out, `"hit_chunks":1`) {
		t.Errorf("the engine's uid: match: %s", out)
	}
	if out, ok := as(engine, nil, kvtierfs, "stat", d.Mountpoint); !ok || !strings.Contains(out, "1 block,") {
		t.Errorf("the engine's uid: kvtierfs stat: %s", out)
	}

	for _, op := range [][]string{{"list", d.Mountpoint}, {"list", filepath.Dir(block)}, {"read", block}, {"read", stats},
		{"match", d.Mountpoint, hash}} {
		if out, ok := helperAs(other, helper, op...); ok || !strings.Contains(out, "permission denied") {
			t.Errorf("another user: %s %s: %s (want permission denied)", op[0], op[1], out)
		}
	}
	if out, ok := as(other, nil, kvtierfs, "stat", d.Mountpoint); ok || !strings.Contains(out, "permission denied") ||
		!strings.Contains(out, "--engine-uid") {
		t.Errorf("another user: kvtierfs stat: %s (want a permission error naming --engine-uid)", out)
	}

	// The store itself: the root, every directory and file the engine's, owner-only.
	err := filepath.Walk(store, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if int(st.Uid) != engine.uid || fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: owner %d, mode %v; want uid %d, no group or other access", p, st.Uid, fi.Mode(), engine.uid)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(store, tierDir, hash[:3], hash[3:5]+"_g0", hash+".bin")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("stored block: %v, %v; want mode 0600", fi, err)
	}
}

// TestTierFiguresOnlyForEngine: with --allow-other every local user can
// statfs the mount; only the engine's uid and root learn the tier's size
// and usage from it (main answered every user the tier's figures and the
// store filesystem's file counts), as only they may read stats.json.
func TestTierFiguresOnlyForEngine(t *testing.T) {
	engine, other := newUser(t, "eng"), newUser(t, "oth")
	dir := sharedDir(t)
	helper, _ := binaries(t, dir)
	store := filepath.Join(dir, "store")
	if err := os.Mkdir(store, 0o755); err != nil {
		t.Fatal(err)
	}
	d := mounttest.Start(t, mounttest.Options{Store: store, Mountpoint: filepath.Join(dir, "mnt"),
		Args: []string{"--allow-other", "--engine-uid", strconv.Itoa(engine.uid), "--capacity", "64MiB"}})
	if out, ok := helperAs(engine, helper, "store", d.Mountpoint, hashOf(1)); !ok {
		t.Fatalf("the engine's uid cannot store: %s", out)
	}
	counts := func(out string) (blocks, free, files uint64) {
		var avail, ffree, frsize uint64
		if _, err := fmt.Sscanf(out, "blocks %d free %d avail %d files %d ffree %d frsize %d", &blocks, &free, &avail, &files, &ffree, &frsize); err != nil {
			t.Fatalf("statfs: %q: %v", out, err)
		}
		return blocks * frsize, free * frsize, files + ffree
	}
	out, ok := helperAs(engine, helper, "statfs", d.Mountpoint)
	if !ok {
		t.Fatalf("the engine's uid: statfs: %s", out)
	}
	if size, free, _ := counts(out); size != 64<<20 || size-free < rowBytes {
		t.Errorf("the engine's uid: statfs %s; want 64 MiB, at least a row used", out)
	}
	out, ok = helperAs(other, helper, "statfs", d.Mountpoint)
	if !ok {
		t.Fatalf("another user: statfs: %s", out)
	}
	if size, free, files := counts(out); size != 0 || free != 0 || files != 0 {
		t.Errorf("another user: statfs %s; want no counts", out)
	}
	var root syscall.Statfs_t
	if err := syscall.Statfs(d.Mountpoint, &root); err != nil || int64(root.Blocks)*root.Frsize != 64<<20 {
		t.Errorf("root: statfs %+v, %v; want the tier's 64 MiB", root, err)
	}
}

// TestMetricsPortHeldByAnotherUser: another local user binds the metrics
// port before the daemon starts. The daemon must not start beside it (the
// user's server would answer the scrapes); it fails before it mounts,
// naming the uid that holds the port (main said only "address already in
// use", after indexing the store).
func TestMetricsPortHeldByAnotherUser(t *testing.T) {
	squatter := newUser(t, "sq")
	helper, _ := binaries(t, sharedDir(t))
	addr := startHelperAs(t, squatter, helper, "listen", "127.0.0.1:0")
	mnt := filepath.Join(t.TempDir(), "mnt")
	log, err := mounttest.Run("mount", mnt, "--store", t.TempDir(), "--metrics-addr", addr)
	if err == nil {
		mounttest.Run("umount", mnt)
		t.Fatalf("the daemon started on %s, which uid %d holds:\n%s", addr, squatter.uid, log)
	}
	if want := fmt.Sprintf("held by uid %d (%s), another user", squatter.uid, squatter.name); !strings.Contains(log, want) {
		t.Errorf("the daemon's error does not say %q:\n%s", want, log)
	}
	if strings.Contains(log, "store indexed") {
		t.Errorf("the daemon indexed the store before it tried the port:\n%s", log)
	}
}

// TestListenPortHeldByAnotherUser: another local user binds the port of
// --listen (where peers send mirrored rows) before the daemon starts, on
// the loopback address while the daemon asks for the wildcard. The daemon
// must fail before it indexes the store, naming the uid that holds the
// port (main said only "address already in use", after indexing).
func TestListenPortHeldByAnotherUser(t *testing.T) {
	squatter := newUser(t, "sq")
	helper, _ := binaries(t, sharedDir(t))
	held := startHelperAs(t, squatter, helper, "listen", "127.0.0.1:0")
	_, port, err := net.SplitHostPort(held)
	if err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(t.TempDir(), "mnt")
	log, err := mounttest.Run("mount", mnt, "--store", t.TempDir(), "--metrics-addr", "", "--listen", "0.0.0.0:"+port, "--secret-file", secret)
	if err == nil {
		mounttest.Run("umount", mnt)
		t.Fatalf("the daemon started with --listen on port %s, which uid %d holds:\n%s", port, squatter.uid, log)
	}
	if want := fmt.Sprintf("held by uid %d (%s), another user", squatter.uid, squatter.name); !strings.Contains(log, want) {
		t.Errorf("the daemon's error does not say %q:\n%s", want, log)
	}
	if strings.Contains(log, "store indexed") {
		t.Errorf("the daemon indexed the store before it tried the port:\n%s", log)
	}
}

// TestEngineRegionsMapped gives one shm region to the engine's uid and one
// to another user: with --engine-uid the daemon maps the engine's and
// ignores the other (tiers/shm maps root's and the engine's files only).
func TestEngineRegionsMapped(t *testing.T) {
	engine, other := newUser(t, "eng"), newUser(t, "oth")
	prefix := fmt.Sprintf("/dev/shm/kvtier-access-%d", os.Getpid())
	for name, u := range map[string]testUser{"engine": engine, "other": other} {
		region, err := engineio.CreateRegion(prefix+"-"+name+".mmap", 2, rowBytes)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { region.Close() })
		if err := os.Chown(region.Path, u.uid, u.gid); err != nil {
			t.Fatal(err)
		}
	}
	d := mounttest.Start(t, mounttest.Options{ShmGlob: prefix + "-*.mmap",
		Args: []string{"--allow-other", "--engine-uid", strconv.Itoa(engine.uid)}})
	st := d.Stats()
	if len(st.Primary.Regions) != 1 || st.Primary.Regions[0].Path != prefix+"-engine.mmap" {
		t.Errorf("regions mapped: %+v, want the engine's only", st.Primary.Regions)
	}
	if len(st.Primary.Ignored) != 1 || st.Primary.Ignored[0].Path != prefix+"-other.mmap" {
		t.Errorf("regions ignored: %+v, want the other user's", st.Primary.Ignored)
	}
}

// TestPrivateByDefault checks the defaults: no allow_other, and an engine
// uid other than the mounting user's refused without --allow-other.
func TestPrivateByDefault(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	if opts := mountOptions(t, d.Mountpoint); strings.Contains(opts, "allow_other") {
		t.Errorf("mounted with %s; allow_other only with --allow-other", opts)
	}
	out, err := mounttest.Run("mount", filepath.Join(t.TempDir(), "mnt"), "--store", t.TempDir(), "--engine-uid", "4242")
	if err == nil || !strings.Contains(out, "--allow-other") {
		t.Errorf("--engine-uid of another user without --allow-other: %v\n%s", err, out)
	}
}

// TestHardLinkToBlockRefused links a published block and a block tmp file
// being written under other names: both are refused (EPERM), the block is
// unchanged, and links between other files still work.
func TestHardLinkToBlockRefused(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{})
	tier, err := engineio.OpenTier(d.Mountpoint)
	if err != nil {
		t.Fatal(err)
	}
	region, err := engineio.CreateRegion(fmt.Sprintf("/dev/shm/kvtier-test-link-%d.mmap", os.Getpid()), 1, rowBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	engineio.FillPattern(region.Row(0), 7)
	block := tier.BlockPath(tierDir, 0, hashOf(7))
	if _, err := tier.Store(block, region.Row(0)); err != nil {
		t.Fatal(err)
	}
	tmp := block + "_123.tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for target, link := range map[string]string{
		block: d.Path(tierDir, "copy-of-block"),
		tmp:   d.Path(tierDir, "copy-of-tmp"),
	} {
		if err := os.Link(target, link); !errors.Is(err, syscall.EPERM) {
			t.Errorf("link %s → %s: %v, want EPERM", target, link, err)
		}
		if _, err := os.Lstat(link); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists after a refused link: %v", link, err)
		}
	}
	if err := tier.Load(block, region.Row(0)); err != nil {
		t.Fatalf("loading the block after the refused links: %v", err)
	}
	plain := d.Path(tierDir, "config.json")
	if err := os.WriteFile(plain, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(plain, plain+".link"); err != nil {
		t.Errorf("link between plain files: %v", err)
	}
}

// TestMatchFloodBounded floods .kvtier/match as the field did (issue 11:
// +130-200 MiB and 11-15 s of CPU per 6 MiB request, kept for good):
// requests of tens of thousands of one-key groups, then many valid requests
// of new tiers. The oversized ones are refused naming the limit, and the
// daemon's RSS grows by less than floodRSSBound.
func TestMatchFloodBounded(t *testing.T) {
	const floodRSSBound = 128 << 20
	d := mounttest.Start(t, mounttest.Options{})
	match := d.Path(ctlabi.Dir, ctlabi.MatchFile)
	before := vmRSS(t, d.Pid())
	for r := range 2 {
		var request strings.Builder
		fmt.Fprintf(&request, `{"tier":"flood%d","groups":[`, r)
		for g := 0; request.Len() < 3<<20; g++ {
			if g > 0 {
				request.WriteByte(',')
			}
			fmt.Fprintf(&request, `{"group":%d,"kind":"full","keys":["%016x"]}`, g, g)
		}
		request.WriteString("]}")
		if answer := matchRaw(t, match, request.String()); !strings.Contains(answer, "groups (limit") {
			t.Errorf("a request of tens of thousands of groups: answer %.200s, want it refused naming the limit", answer)
		}
	}
	for r := range 300 {
		var request strings.Builder
		fmt.Fprintf(&request, `{"tier":"valid%d","groups":[`, r)
		for g := range 64 {
			if g > 0 {
				request.WriteByte(',')
			}
			fmt.Fprintf(&request, `{"group":%d,"kind":"sliding","tail":1,"acc":1,"keys":["%016x","%016x"]}`, g, g, g+1)
		}
		request.WriteString("]}")
		if answer := matchRaw(t, match, request.String()); !strings.Contains(answer, `"hit_chunks":0`) {
			t.Fatalf("valid request %d: answer %.200s", r, answer)
		}
	}
	after := vmRSS(t, d.Pid())
	t.Logf("daemon RSS %d MiB before the flood, %d MiB after", before>>20, after>>20)
	if after-before > floodRSSBound {
		t.Errorf("the match flood grew the daemon by %d MiB, bound %d MiB", (after-before)>>20, floodRSSBound>>20)
	}
	if !d.Running() {
		t.Fatal("the daemon died during the flood")
	}
}

// matchRaw writes a request to the match file and reads the answer back.
func matchRaw(t *testing.T, path, request string) string {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(request); err != nil {
		t.Fatalf("writing a %d-byte request: %v", len(request), err)
	}
	answer := make([]byte, 1<<20)
	n, err := f.ReadAt(answer, 0)
	if n == 0 {
		t.Fatalf("reading the answer: %v", err)
	}
	return string(answer[:n])
}

// TestOtherFilesWithinCapacity fills a 1 GiB store with files outside the
// block layout: a 2 GiB fallocate is refused, a plain file stops at the
// capacity (ENOSPC), and removing it gives the room back to blocks.
func TestOtherFilesWithinCapacity(t *testing.T) {
	const capacity = 1 << 30
	d := mounttest.Start(t, mounttest.Options{Args: []string{"--capacity", "1GiB"}})
	big := d.Path("big")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, 2<<30)
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("fallocate of 2 GiB on a 1 GiB store: %v, want ENOSPC", err)
	}
	if used := mounttest.Allocated(t, d.Store); used > capacity {
		t.Errorf("the store holds %d MiB after the refused fallocate", used>>20)
	}

	plain := d.Path("plain")
	f, err = os.Create(plain)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 4<<20)
	for i := range chunk {
		chunk[i] = byte(i)
	}
	written := int64(0)
	for written <= 2*capacity {
		n, err := f.Write(chunk)
		written += int64(n)
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Errorf("writing a plain file: %v, want ENOSPC at the capacity", err)
			}
			break
		}
	}
	f.Close()
	if written > capacity {
		t.Errorf("a plain file took %d MiB of a 1 GiB store", written>>20)
	}
	if used := mounttest.Allocated(t, d.Store); used > capacity {
		t.Errorf("the store holds %d MiB after the plain file, capacity 1 GiB", used>>20)
	}
	if err := os.Remove(plain); err != nil {
		t.Fatal(err)
	}
	if free := d.Stats().Disk.FreeBytes; free < capacity/2 {
		t.Errorf("%d MiB free after removing the plain file", free>>20)
	}
}

// TestTrustedXattrNamesAreRootsOnly: the daemon lists a file's xattrs as
// root, and the kernel passes a FUSE server's list on as it is, so the
// trusted.* names (the replication note, trusted.kvtierfs.replication,
// which the engine's uid must neither read nor forge) reached the
// engine's uid for every file, and every other user for the mount root
// with --allow-other, where the store's own filesystem lists them to
// CAP_SYS_ADMIN only. They are listed to root alone; user.* names stay.
func TestTrustedXattrNamesAreRootsOnly(t *testing.T) {
	engine, other := newUser(t, "eng"), newUser(t, "oth")
	dir := sharedDir(t)
	helper, _ := binaries(t, dir)
	store := filepath.Join(dir, "store")
	if err := os.Mkdir(store, 0o755); err != nil {
		t.Fatal(err)
	}
	d := mounttest.Start(t, mounttest.Options{Store: store, Mountpoint: filepath.Join(dir, "mnt"),
		Args: []string{"--allow-other", "--engine-uid", strconv.Itoa(engine.uid)}})
	hash := hashOf(1)
	rel := filepath.Join(tierDir, hash[:3], hash[3:5]+"_g0", hash+".bin")
	if out, ok := helperAs(engine, helper, "store", d.Mountpoint, hash); !ok {
		t.Fatalf("the engine's uid cannot store: %s", out)
	}
	for _, p := range []string{store, filepath.Join(store, rel)} {
		for _, name := range []string{"trusted.kvtierfs.test", "user.keep"} {
			if err := syscall.Setxattr(p, name, []byte("x"), 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range []struct {
		who  testUser
		path string
	}{{engine, d.Mountpoint}, {engine, d.Path(rel)}, {other, d.Mountpoint}} {
		out, ok := helperAs(c.who, helper, "listxattr", c.path)
		if !ok || strings.Contains(out, "trusted.") || (c.who == engine && !strings.Contains(out, "user.keep")) {
			t.Errorf("%s lists the xattrs of %s as %q (ok %v); want user.keep, no trusted.* name", c.who.name, c.path, out, ok)
		}
	}
	for _, p := range []string{d.Mountpoint, d.Path(rel)} {
		names := make([]byte, 64<<10)
		n, err := syscall.Listxattr(p, names)
		if err != nil || !strings.Contains(string(names[:max(n, 0)]), "trusted.kvtierfs.test") {
			t.Errorf("root lists the xattrs of %s as %q (%v); want trusted.kvtierfs.test among them", p, names[:max(n, 0)], err)
		}
	}
}
