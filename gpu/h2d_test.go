package gpu

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
)

func TestMeasureH2D(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b Backend) {
		cfg := H2DConfig{RowBytes: 1<<20 + 4096, Rows: 6, Batch: 4, Passes: 2, ShmPath: shmPath(t)}
		report, err := MeasureH2D(b, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Log("\n" + report.String())
		wantBytes := int64(cfg.Rows * cfg.RowBytes * cfg.Passes)
		for name, rate := range map[string]H2DRate{"registered": report.Registered, "pinned": report.Pinned, "pageable": report.Pageable} {
			if rate.Bytes != wantBytes || rate.Seconds <= 0 || rate.GBps <= 0 {
				t.Errorf("%s: %+v, want %d bytes in a positive time", name, rate, wantBytes)
			}
		}
		if report.Ratio != report.Registered.GBps/report.Pinned.GBps {
			t.Errorf("ratio %v is not registered/pinned", report.Ratio)
		}
		if !strings.Contains(report.String(), "registered/pinned") {
			t.Error("report text lacks the ratio")
		}
		if _, err := os.Stat(cfg.ShmPath); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("MeasureH2D left %s behind (%v)", cfg.ShmPath, err)
		}
	})
}

func TestMeasureH2DRejectsBadConfig(t *testing.T) {
	for _, cfg := range []H2DConfig{
		{RowBytes: 4096, Rows: 2, Batch: 3, Passes: 1},
		{RowBytes: 0, Rows: 2, Batch: 1, Passes: 1},
		{RowBytes: 4096, Rows: 2, Batch: 1, Passes: 0},
	} {
		if _, err := MeasureH2D(NewHost(), cfg); err == nil {
			t.Errorf("MeasureH2D(%+v) succeeded", cfg)
		}
	}
}

// BenchmarkFingerprintRow fingerprints one engine row held by each backend
// (device kernel, device→host fallback, host).
func BenchmarkFingerprintRow(b *testing.B) {
	for _, c := range testBackends() {
		b.Run(c.name, func(b *testing.B) {
			backend := c.open(b)
			defer backend.Close()
			src := make([]byte, EngineRowBytes)
			fillRandom(src[:4096], 1)
			dev, err := backend.Alloc(EngineRowBytes)
			if err != nil {
				b.Fatal(err)
			}
			defer dev.Free()
			if err := backend.CopyRows(dev, src, []RowCopy{{Len: EngineRowBytes}}); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(EngineRowBytes)
			for b.Loop() {
				if _, err := backend.Fingerprint(dev, 0, EngineRowBytes); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
