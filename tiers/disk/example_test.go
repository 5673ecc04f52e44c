package disk_test

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/kvtierfs/kvtierfs/tiers/block"
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

	name := block.Name{Tier: "DeepSeek_0123456789ab_r0", Group: 0, Hash: "3fa90000000000000000000000000001"}
	rel, tmp := name.Path(), name.TmpPath("0123456789")
	os.MkdirAll(filepath.Dir(store.Path(rel)), 0o700) // the engine's makedirs
	w, err := store.CreateTmp(tmp, syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY)
	if err != nil {
		fmt.Println(err)
		return
	}
	row := make([]byte, 2*block.PageSize)
	copy(row, "KV of one chunk")
	w.WriteAt(row, 0)
	w.Close()
	fmt.Println("before the rename:", store.Lookup(rel, 0))
	if err := store.Publish(tmp, rel); err != nil {
		fmt.Println(err)
		return
	}
	d, _ := store.Digest(rel)
	fmt.Println("after the rename:", store.Lookup(rel, 0), d.Size/int64(block.PageSize), "pages")
	// Output:
	// before the rename: false
	// after the rename: true 2 pages
}
