//go:build !cgo

package diskbench

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/integration/engineio"
)

// nativeLoads is the loader of native.go for builds without cgo: the same
// loads (open, one readv, close with its error ignored) from goroutines
// locked to signal-free OS threads. Figures for BENCHMARKS.md come from
// the cgo build, whose loader has no Go scheduler between its threads.
func nativeLoads(paths []string, dest []byte, rowBytes, threads int, direct bool) (time.Duration, error) {
	flags := unix.O_RDONLY | unix.O_CLOEXEC
	if direct {
		flags |= unix.O_DIRECT
	}
	rows := len(dest) / rowBytes
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range threads {
		wg.Go(func() {
			engineio.OwnSignalFreeThread()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(paths) {
					return
				}
				row := dest[(i%rows)*rowBytes : (i%rows+1)*rowBytes]
				fd, err := unix.Open(paths[i], flags, 0)
				if err != nil {
					failed.Add(1)
					continue
				}
				n, err := unix.Readv(fd, [][]byte{row})
				unix.Close(fd)
				if err != nil || n != rowBytes {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if n := failed.Load(); n > 0 {
		return elapsed, fmt.Errorf("%d of %d loads failed", n, len(paths))
	}
	return elapsed, nil
}
