package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/fusefs"
	"github.com/kvtierfs/kvtierfs/fusefs/ctlabi"
	"github.com/kvtierfs/kvtierfs/tiers/shared"
)

// TestSharedFlags: the contract's flags parse into the level's config, the
// negative bound is split between the kernel and the level, and bad values
// are refused.
func TestSharedFlags(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "shared.key")
	if err := os.WriteFile(keyFile, []byte("the replicas' shared key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parseMountFlags([]string{"/mnt/x", "--store", t.TempDir(), "--shared", "/shared", "--shared-key-file", keyFile, "--shared-capacity", "10GiB",
		"--shared-admit", "looked-up", "--shared-rate", "64MiB", "--shared-queue", "512MiB", "--shared-negative-ttl", "3s",
		"--shared-timeout", "1s", "--shared-lease-ttl", "30s"})
	if err != nil {
		t.Fatal(err)
	}
	s := c.shared
	if s.Dir != "/shared" || s.Capacity != 10<<30 || s.Admit != shared.AdmitLookedUp || s.Rate != 64<<20 || s.QueueBytes != 512<<20 ||
		s.Timeout != time.Second || s.LeaseTTL != 30*time.Second || string(s.Key) != "the replicas' shared key" {
		t.Fatalf("config %+v", s)
	}
	if c.sharedKernelNegative+s.NegativeTTL != 3*time.Second || c.sharedKernelNegative > fusefs.DefaultNegativeTimeout {
		t.Fatalf("negative bound split %s + %s, want 3s in all", c.sharedKernelNegative, s.NegativeTTL)
	}
	for _, bad := range [][]string{{"--shared-admit", "some"}, {"--shared-rate", "0"}, {"--shared-timeout", "0s"}} {
		if _, err := parseMountFlags(append([]string{"/mnt/x", "--store", t.TempDir(), "--shared", "/shared", "--shared-key-file", keyFile}, bad...)); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	// No key, or a key others can read: refused.
	if _, err := parseMountFlags([]string{"/mnt/x", "--store", t.TempDir(), "--shared", "/shared"}); err == nil || !strings.Contains(err.Error(), "--shared-key-file") {
		t.Errorf("--shared without a key: %v", err)
	}
	os.Chmod(keyFile, 0o644)
	if _, err := parseMountFlags([]string{"/mnt/x", "--store", t.TempDir(), "--shared", "/shared", "--shared-key-file", keyFile}); err == nil {
		t.Error("a world-readable key file accepted")
	}
}

// TestPrintShared: stat's shared section names the state, queue and lease.
func TestPrintShared(t *testing.T) {
	var out bytes.Buffer
	printShared(&out, &ctlabi.Shared{Dir: "/shared", QueueBlocks: 2, LeaseHolder: "node-b", CapacityBytes: 1 << 30})
	for _, want := range []string{"/shared, UNREACHABLE", "2 blocks", "held by node-b", "of 1.0 GiB"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("missing %q in:\n%s", want, out.String())
		}
	}
}

// TestSharedDisjoint: a shared directory inside the store or the mountpoint is refused.
func TestSharedDisjoint(t *testing.T) {
	if err := checkSharedDisjoint("/nvme/store/shared", "/mnt/kv", "/nvme/store"); err == nil {
		t.Error("a shared directory inside the store accepted")
	}
	if err := checkSharedDisjoint("/mnt", "/mnt/kv", "/nvme/store"); err == nil {
		t.Error("a shared directory holding the mountpoint accepted")
	}
	if err := checkSharedDisjoint("/gluster/kv", "/mnt/kv", "/nvme/store"); err != nil {
		t.Error(err)
	}
}
