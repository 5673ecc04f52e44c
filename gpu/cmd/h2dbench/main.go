// Command h2dbench measures the host→device bandwidth of the gpu load stage
// from a registered /dev/shm region, from pinned (cudaMallocHost) memory and
// from pageable memory, for engine-sized rows and several batch sizes.
//
//	h2dbench --gpu cuda --device 0 --rows 128 --batches 1,8,32 --passes 5
package main

import (
	"flag"
	"fmt"
	"log"
	"strconv"
	"strings"

	"github.com/kvtierfs/kvtierfs/gpu"
)

func main() {
	kind := flag.String("gpu", gpu.KindAuto, "backend: auto, cuda or host")
	device := flag.Int("device", 0, "CUDA device ordinal")
	rowBytes := flag.Int("row-bytes", gpu.EngineRowBytes, "bytes per row")
	rows := flag.Int("rows", 64, "rows in each source region")
	batches := flag.String("batches", "1,8,32", "comma-separated rows per CopyRows call")
	passes := flag.Int("passes", 5, "timed passes over all rows per source")
	shm := flag.String("shm", "", "shm file to create for the registered region (default /dev/shm/kvtier-h2d-<pid>.mmap)")
	flag.Parse()
	log.SetFlags(0)

	b, note, err := gpu.Open(*kind, *device)
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	fmt.Println(note)
	fmt.Println("fingerprint:", gpu.FingerprintName, "by", b.FingerprintMethod())
	for _, field := range strings.Split(*batches, ",") {
		batch, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil {
			log.Fatalf("h2dbench: --batches: %v", err)
		}
		report, err := gpu.MeasureH2D(b, gpu.H2DConfig{
			RowBytes: *rowBytes, Rows: *rows, Batch: batch, Passes: *passes, ShmPath: *shm,
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Print(report)
	}
}
