package mount_test

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestMetricsEndpoint scrapes the Prometheus endpoint of a mount that stored
// and loaded a block: the kvtierfs_ counters and histograms are there and count.
func TestMetricsEndpoint(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{Args: []string{"--metrics-addr", "127.0.0.1:0"}})
	tier := openTier(t, d)
	region := newRegion(t, 1)
	path := storeBlock(t, tier, region.Row(0), 1)
	if err := tier.Load(path, region.Row(0)); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`metrics=(http://\S+/metrics)`).FindStringSubmatch(d.Log())
	if m == nil {
		t.Fatalf("the daemon did not log its metrics address:\n%s", d.Log())
	}
	resp, err := http.Get(m[1])
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{"kvtierfs_writes_total 1", "kvtierfs_reads_total 1", "kvtierfs_read_bytes_total 262144",
		"kvtierfs_disk_blocks 1", "kvtierfs_lookup_seconds_bucket", "kvtierfs_read_seconds_count 1", "kvtierfs_write_seconds_count 1",
		"kvtierfs_checksum_failures_total 0",
		`kvtierfs_store_phase_seconds_count{phase="create"} 1`, `kvtierfs_store_phase_seconds_count{phase="rename"} 1`,
		`kvtierfs_store_phase_seconds_count{phase="rename_record"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if !strings.Contains(string(body), "go_goroutines") || !strings.Contains(string(body), "process_open_fds") {
		t.Error("metrics lack the daemon's own health (go_goroutines, process_open_fds)")
	}
	if strings.Contains(string(body), "promhttp_metric_handler_requests_total") {
		t.Error("metrics come from the global registry, not the mount's own")
	}
}

// TestStatfsAndOtherFiles checks df's numbers and that files outside the block
// layout (config.json, directories, listings) are stored as they come.
func TestStatfsAndOtherFiles(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{Args: []string{"--capacity", "64MiB"}})
	tier := openTier(t, d)
	region := newRegion(t, 1)
	storeBlock(t, tier, region.Row(0), 1)

	var st syscall.Statfs_t
	if err := syscall.Statfs(d.Mountpoint, &st); err != nil {
		t.Fatal(err)
	}
	total, free := int64(st.Blocks)*st.Bsize, int64(st.Bavail)*st.Bsize
	if total != 64<<20 || free > total-rowBytes || free < total-2*rowBytes {
		t.Fatalf("statfs: %d total, %d free; want 64 MiB total and one row used", total, free)
	}

	config := filepath.Join(d.Mountpoint, "TestModel_0123456789ab", "config.json")
	os.MkdirAll(filepath.Dir(config), 0o755)
	want := []byte(`{"model":"test","block_size":16}`)
	if err := os.WriteFile(config, want, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(config); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("config.json through the mount: %q %v", got, err)
	}
	if got, err := os.ReadFile(filepath.Join(d.Store, "TestModel_0123456789ab", "config.json")); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("config.json in the store: %q %v", got, err)
	}
	entries, err := os.ReadDir(filepath.Dir(tier.BlockPath(tierDir, 0, hashOf(1))))
	if err != nil || len(entries) != 1 || entries[0].Name() != hashOf(1)+".bin" {
		t.Fatalf("listing of a group directory: %v %v", entries, err)
	}
	root, _ := os.ReadDir(d.Mountpoint)
	for _, e := range root {
		if strings.HasPrefix(e.Name(), ".kvtierfs") {
			t.Fatalf("the store's own file %s shows in the mount", e.Name())
		}
	}
}
