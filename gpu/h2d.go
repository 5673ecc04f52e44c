package gpu

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"syscall"
	"time"
)

// EngineRowBytes is the size of one shm row of the field setup (DeepSeek-V4-Flash,
// TP=2, 8 blocks per chunk): the row size MeasureH2D is meant to run with.
const EngineRowBytes = 8_601_600

// H2DConfig describes one MeasureH2D run.
type H2DConfig struct {
	RowBytes int    // bytes per row (EngineRowBytes for the engine's rows)
	Rows     int    // rows in each source
	Batch    int    // rows per CopyRows call
	Passes   int    // timed passes over all rows, after one untimed warm-up pass
	ShmPath  string // shm file for the registered source; default /dev/shm/kvtier-h2d-<pid>.mmap
}

// H2DRate is the measured host→device rate from one kind of source memory.
type H2DRate struct {
	Bytes   int64   // bytes copied in the timed passes
	Seconds float64 // time those copies took
	GBps    float64 // Bytes / Seconds / 1e9
}

// H2DReport is the result of MeasureH2D.
type H2DReport struct {
	Backend         string // the backend's Describe
	Config          H2DConfig
	RegisterSeconds float64 // time Register took for the whole shm region
	Registered      H2DRate // from the registered shm region
	Pinned          H2DRate // from AllocPinned (cudaMallocHost) memory
	Pageable        H2DRate // from ordinary Go memory
	Ratio           float64 // Registered.GBps / Pinned.GBps; the goal is ≥ 0.90
}

// String formats the report for humans, one figure a line.
func (r H2DReport) String() string {
	var s strings.Builder
	c := r.Config
	fmt.Fprintf(&s, "H2D %s\n  %d rows × %d B, batch %d rows (%.1f MB per CopyRows), %d passes\n",
		r.Backend, c.Rows, c.RowBytes, c.Batch, float64(c.Batch*c.RowBytes)/1e6, c.Passes)
	fmt.Fprintf(&s, "  register %.1f MB shm region: %.3f s\n", float64(c.Rows*c.RowBytes)/1e6, r.RegisterSeconds)
	for _, line := range []struct {
		name string
		rate H2DRate
	}{{"registered shm", r.Registered}, {"pinned (cudaMallocHost)", r.Pinned}, {"pageable", r.Pageable}} {
		fmt.Fprintf(&s, "  %-24s %7.2f GB/s  (%d B in %.3f s)\n", line.name, line.rate.GBps, line.rate.Bytes, line.rate.Seconds)
	}
	fmt.Fprintf(&s, "  registered/pinned        %7.3f  (goal ≥ 0.90)\n", r.Ratio)
	return s.String()
}

// MeasureH2D measures host→device copy bandwidth of b for rows of cfg.RowBytes,
// batched cfg.Batch rows per CopyRows call, from three sources of the same
// size: a /dev/shm file mapped and registered with b.Register (as the engine's
// region would be), pinned memory from b.AllocPinned, and pageable memory.
// Passes interleave the sources so that drift affects each alike. Every
// source's last batch is checked on the device with Fingerprint.
func MeasureH2D(b Backend, cfg H2DConfig) (H2DReport, error) {
	report := H2DReport{Backend: b.Describe(), Config: cfg}
	if cfg.RowBytes <= 0 || cfg.Rows <= 0 || cfg.Batch <= 0 || cfg.Batch > cfg.Rows || cfg.Passes <= 0 {
		return report, fmt.Errorf("gpu: invalid H2D config %+v: need positive sizes and Batch ≤ Rows", cfg)
	}
	if cfg.ShmPath == "" {
		cfg.ShmPath = fmt.Sprintf("/dev/shm/kvtier-h2d-%d.mmap", os.Getpid())
		report.Config.ShmPath = cfg.ShmPath
	}
	size := cfg.Rows * cfg.RowBytes
	region, unmap, err := createShm(cfg.ShmPath, size)
	if err != nil {
		return report, err
	}
	defer unmap()

	pattern := make([]byte, cfg.RowBytes)
	rand.NewChaCha8([32]byte{'k', 'v', 't', 'i', 'e', 'r'}).Read(pattern)
	fillRows(region, pattern, 0)
	start := time.Now()
	registered, err := b.Register(region)
	if err != nil {
		return report, err
	}
	defer registered.Release()
	report.RegisterSeconds = time.Since(start).Seconds()
	pinned, err := b.AllocPinned(size)
	if err != nil {
		return report, err
	}
	defer pinned.Release()
	fillRows(pinned.Bytes(), pattern, 1)
	pageable := make([]byte, size)
	fillRows(pageable, pattern, 2)

	dev, err := b.Alloc(cfg.Batch * cfg.RowBytes)
	if err != nil {
		return report, err
	}
	defer dev.Free()

	sources := []struct {
		src  []byte
		rate *H2DRate
	}{{region, &report.Registered}, {pinned.Bytes(), &report.Pinned}, {pageable, &report.Pageable}}
	for pass := 0; pass <= cfg.Passes; pass++ {
		for _, s := range sources {
			elapsed, last, err := copyPass(b, dev, s.src, cfg)
			if err != nil {
				return report, err
			}
			if pass == 0 {
				continue // warm-up
			}
			s.rate.Bytes += int64(size)
			s.rate.Seconds += elapsed.Seconds()
			if pass < cfg.Passes {
				continue
			}
			if err := verifyBatch(b, dev, s.src[last.Src:last.Src+last.Len]); err != nil {
				return report, err
			}
		}
	}
	for _, s := range sources {
		s.rate.GBps = float64(s.rate.Bytes) / s.rate.Seconds / 1e9
	}
	report.Ratio = report.Registered.GBps / report.Pinned.GBps
	return report, nil
}

// copyPass copies every row of src to dev, cfg.Batch rows per CopyRows call,
// and returns the time taken and the host range of the last batch.
func copyPass(b Backend, dev DeviceBuffer, src []byte, cfg H2DConfig) (time.Duration, RowCopy, error) {
	rows := make([]int, 0, cfg.Batch)
	var last RowCopy
	start := time.Now()
	for first := 0; first < cfg.Rows; first += cfg.Batch {
		rows = rows[:0]
		for r := first; r < min(first+cfg.Batch, cfg.Rows); r++ {
			rows = append(rows, r)
		}
		if err := b.CopyRows(dev, src, RowSlots(cfg.RowBytes, 0, cfg.RowBytes, rows)); err != nil {
			return 0, last, err
		}
		last = RowCopy{Src: first * cfg.RowBytes, Len: len(rows) * cfg.RowBytes}
	}
	return time.Since(start), last, nil
}

// verifyBatch checks that dev starts with want, by fingerprint.
func verifyBatch(b Backend, dev DeviceBuffer, want []byte) error {
	got, err := b.Fingerprint(dev, 0, len(want))
	if err != nil {
		return err
	}
	if exp := FingerprintHost(want); got != exp {
		return fmt.Errorf("gpu: H2D verification failed: device fingerprint %#016x, host %#016x", got, exp)
	}
	return nil
}

// fillRows fills buf with rows of pattern, each row stamped in its first 8
// bytes with tag and its row number, so rows and sources all differ.
func fillRows(buf, pattern []byte, tag uint32) {
	for row := 0; len(buf) > 0; row++ {
		n := copy(buf, pattern)
		if n >= 8 {
			binary.LittleEndian.PutUint64(buf, uint64(tag)<<32|uint64(row))
		}
		buf = buf[n:]
	}
}

// createShm creates the file path (it must not exist) of size bytes and maps
// it shared; unmap unmaps it and removes the file.
func createShm(path string, size int) (region []byte, unmap func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("gpu: shm region: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(int64(size)); err != nil {
		os.Remove(path)
		return nil, nil, fmt.Errorf("gpu: shm region: %w", err)
	}
	region, err = syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		os.Remove(path)
		return nil, nil, fmt.Errorf("gpu: shm region: mmap %s: %w", path, err)
	}
	return region, func() {
		syscall.Munmap(region)
		os.Remove(path)
	}, nil
}
