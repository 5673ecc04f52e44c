//go:build !bench

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBenchBuildOfAnotherUserIsRefused: root runs `kvtierfs bench` from a
// binary in a sticky world-writable directory (/tmp), where another user
// put a kvtierfs-bench beside it (there was none). Main exec'd it as root.
func TestBenchBuildOfAnotherUserIsRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("files of another uid need root")
	}
	const otherUID = 65534 // nobody
	checkBenchBuild := func(exe, bench string) error {
		f, err := openBenchBuild(exe, bench)
		if f != nil {
			f.Close()
		}
		return err
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o1777); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "kvtierfs")
	bench := exe + "-bench"
	for _, p := range []string{exe, bench} {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := checkBenchBuild(exe, bench); err != nil {
		t.Fatalf("root's own benchmark build beside root's binary: %v", err)
	}
	if err := os.Chown(bench, otherUID, otherUID); err != nil {
		t.Fatal(err)
	}
	if err := checkBenchBuild(exe, bench); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Fatalf("a benchmark build of uid %d beside root's binary: %v, want refused", otherUID, err)
	}
	if err := os.Chown(bench, 0, 0); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{exe, bench} {
		if err := os.Chmod(p, 0o775); err != nil { // a build under umask 002
			t.Fatal(err)
		}
	}
	if err := checkBenchBuild(exe, bench); err != nil {
		t.Fatalf("a group-writable benchmark build beside a group-writable binary: %v", err)
	}
	if err := os.Chmod(bench, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := checkBenchBuild(exe, bench); err == nil || !strings.Contains(err.Error(), "may write it") {
		t.Fatalf("a world-writable benchmark build: %v, want refused", err)
	}
	if err := os.Remove(bench); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(exe, bench); err != nil {
		t.Fatal(err)
	}
	if err := checkBenchBuild(exe, bench); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("a link as the benchmark build: %v, want refused", err)
	}
}
