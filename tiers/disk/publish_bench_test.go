package disk

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkStoreSmallRows stores 256 KiB rows as 16 engine threads do, on
// the test's own directory (a real disk under go test), without FUSE:
// CreateTmp, one WriteAt, Close, Publish, each block in a directory of its
// own. It reports the median Publish and the medians of the store's phases
// (DESIGN.md "The store"), so a change to the publication can be compared
// inside the daemon: go test -run NONE -bench StoreSmallRows ./tiers/disk/
func BenchmarkStoreSmallRows(b *testing.B) {
	const writers = 16
	s := openStore(b, Config{Capacity: 1 << 40})
	row := pageData(1, 64)
	var next atomic.Int64
	publishes := make([][]time.Duration, writers)
	b.SetBytes(int64(len(row)))
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for {
				i := int(next.Add(1))
				if i > b.N {
					return
				}
				rel := blockRel(testTier, 0, hashHex(i, 64))
				if err := os.MkdirAll(filepath.Dir(s.Path(rel)), 0o755); err != nil {
					b.Error(err)
					return
				}
				tmp := tmpRelFor(rel, i)
				tw, err := s.CreateTmp(tmp, engineCreateFlags)
				if err == nil {
					_, err = tw.WriteAt(row, 0)
				}
				if err == nil {
					err = tw.Close()
				}
				started := time.Now()
				if err == nil {
					err = s.Publish(tmp, rel)
				}
				if err != nil {
					b.Error(err)
					return
				}
				publishes[w] = append(publishes[w], time.Since(started))
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	all := slices.Concat(publishes...)
	slices.Sort(all)
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)/2].Microseconds()), "publish-p50-µs")
	}
	for name, st := range s.PhaseStats() {
		b.ReportMetric(st.P50Micros, name+"-p50-µs")
	}
}
