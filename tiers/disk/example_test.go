package disk_test

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// A block's store cycle, as the mount runs it for the engine: a tmp file
// beside the block's name, one write of the row, then the rename that
// publishes it with its digest.
func Example() {
	dir, _ := os.MkdirTemp("", "kvtierfs-example-")
	defer os.RemoveAll(dir)
	store, err := disk.Open(disk.Config{Dir: dir})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()

	const hash = "3fa90000000000000000000000000001"
	block := filepath.Join("DeepSeek_0123456789ab_r0", hash[:3], hash[3:5]+"_g0", hash+".bin")
	os.MkdirAll(filepath.Dir(store.Path(block)), 0o700) // the engine's makedirs
	tmp := block + "_0123456789.tmp"
	w, err := store.CreateTmp(tmp, syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY, 0o600)
	if err != nil {
		fmt.Println(err)
		return
	}
	row := make([]byte, 2*disk.PageSize)
	copy(row, "KV of one chunk")
	w.WriteAt(row, 0)
	w.Close()
	fmt.Println("before the rename:", store.Lookup(block, 0))
	if err := store.Publish(tmp, block); err != nil {
		fmt.Println(err)
		return
	}
	d, _ := store.Digest(block)
	fmt.Println("after the rename:", store.Lookup(block, 0), d.Size)
	// Output:
	// before the rename: false
	// after the rename: true 8192
}
