// Package testsys holds what the tests of several packages need of the
// system itself: real users, and changes that the kernel's change time
// records. It is for tests only; it imports the standard library and x/sys.
package testsys

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// NewUser creates a user with its own group, named prefix and this
// process's id so that parallel test binaries do not meet, and deletes it
// when the test ends. It needs root (useradd).
func NewUser(t testing.TB, prefix string) (name string, uid, gid int) {
	t.Helper()
	name = fmt.Sprintf("%s%d", prefix, os.Getpid()%100000)
	if out, err := exec.Command("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v\n%s", name, err, out)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	if uid, err = strconv.Atoi(u.Uid); err != nil {
		t.Fatal(err)
	}
	if gid, err = strconv.Atoi(u.Gid); err != nil {
		t.Fatal(err)
	}
	return name, uid, gid
}

// UntilChangeTimeMoves runs change, and again every millisecond until the
// change time of the file at path moved from what it was before: a kernel
// without fine-grained timestamps (before Linux 6.13) leaves it as it was
// for a change within the same tick of its coarse clock as the last one,
// which the daemon then cannot tell from its own (tiers/disk changed.go).
// change must be one that can be repeated.
func UntilChangeTimeMoves(t testing.TB, path string, change func()) {
	t.Helper()
	var before, after unix.Stat_t
	if err := unix.Stat(path, &before); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		change()
		if err := unix.Stat(path, &after); err != nil {
			t.Fatal(err)
		}
		if after.Ctim != before.Ctim {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the change time of %s stayed at %v through 10 s of changes", path, before.Ctim)
		}
	}
}
