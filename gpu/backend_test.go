package gpu

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// testRowBytes is a small row (page multiple plus an odd slot layout) that
// keeps tests fast; the engine's 8.6 MB rows are used by MeasureH2D runs.
const testRowBytes = 3 * 4096

func TestRowSlots(t *testing.T) {
	got := RowSlots(100, 10, 30, []int{4, 0, 7})
	want := []RowCopy{{Src: 410, Dst: 0, Len: 30}, {Src: 10, Dst: 30, Len: 30}, {Src: 710, Dst: 60, Len: 30}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("RowSlots = %v, want %v", got, want)
	}
}

// TestLoadRowsFromRegisteredShm is the engine model's use: register a shm
// region, load a batch of rows (out of order) and a batch of row slots, and
// check the device's fingerprints against the host's and the bytes copied back.
func TestLoadRowsFromRegisteredShm(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b Backend) {
		const rows = 10
		region := newShmRegion(t, rows*testRowBytes)
		fillRandom(region, 10)
		reg, err := b.Register(region)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := reg.Release(); err != nil {
				t.Errorf("Release: %v", err)
			}
		}()
		if &reg.Bytes()[0] != &region[0] {
			t.Fatal("Registration.Bytes is not the registered region")
		}
		dev := alloc(t, b, rows*testRowBytes)

		load := []int{7, 2, 9, 0}
		if err := b.CopyRows(dev, region, RowSlots(testRowBytes, 0, testRowBytes, load)); err != nil {
			t.Fatal(err)
		}
		for i, row := range load {
			want := region[row*testRowBytes : (row+1)*testRowBytes]
			checkDevice(t, b, dev, i*testRowBytes, want)
		}

		// Slot 1 of 3 (an offset that is no multiple of 8 exercises unaligned reads).
		const slotOff, slotLen = 4096 + 3, 4096 - 5
		if err := b.CopyRows(dev, region, RowSlots(testRowBytes, slotOff, slotLen, []int{1, 5})); err != nil {
			t.Fatal(err)
		}
		checkDevice(t, b, dev, 0, region[testRowBytes+slotOff:testRowBytes+slotOff+slotLen])
		checkDevice(t, b, dev, slotLen, region[5*testRowBytes+slotOff:5*testRowBytes+slotOff+slotLen])
		checkDevice(t, b, dev, 1, region[testRowBytes+slotOff+1:testRowBytes+slotOff+1+777])
		checkDevice(t, b, dev, 5, nil)
	})
}

// TestLoadFromPinnedAndPageable checks that CopyRows takes any host memory.
func TestLoadFromPinnedAndPageable(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b Backend) {
		pinned, err := b.AllocPinned(2 * testRowBytes)
		if err != nil {
			t.Fatal(err)
		}
		defer pinned.Release()
		if len(pinned.Bytes()) != 2*testRowBytes {
			t.Fatalf("AllocPinned gave %d bytes, want %d", len(pinned.Bytes()), 2*testRowBytes)
		}
		fillRandom(pinned.Bytes(), 20)
		pageable := make([]byte, 2*testRowBytes)
		fillRandom(pageable, 21)
		dev := alloc(t, b, 2*testRowBytes)
		for _, src := range [][]byte{pinned.Bytes(), pageable} {
			if err := b.CopyRows(dev, src, RowSlots(testRowBytes, 0, testRowBytes, []int{1, 0})); err != nil {
				t.Fatal(err)
			}
			checkDevice(t, b, dev, 0, src[testRowBytes:])
			checkDevice(t, b, dev, testRowBytes, src[:testRowBytes])
		}
	})
}

// TestFingerprintLargeRange covers a range larger than the fallback's staging
// buffer and many kernel blocks: two engine rows and a ragged tail.
func TestFingerprintLargeRange(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b Backend) {
		src := make([]byte, 2*EngineRowBytes+5)
		fillRandom(src[:1<<20], 30)
		for off := 1 << 20; off < len(src); off += 1 << 20 {
			copy(src[off:], src[:1<<20])
			src[off] ^= byte(off >> 20) // make the repeated MiBs differ
		}
		dev := alloc(t, b, len(src))
		if err := b.CopyRows(dev, src, []RowCopy{{Src: 0, Dst: 0, Len: len(src)}}); err != nil {
			t.Fatal(err)
		}
		checkDevice(t, b, dev, 0, src)
	})
}

// TestConcurrentLoads runs loads and fingerprints from several goroutines, as
// the engine's reader threads would.
func TestConcurrentLoads(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b Backend) {
		const workers, rows = 8, 16
		region := newShmRegion(t, rows*testRowBytes)
		fillRandom(region, 40)
		reg, err := b.Register(region)
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Release()
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			dev := alloc(t, b, 2*testRowBytes)
			wg.Go(func() {
				for i := range 20 {
					load := []int{(w + i) % rows, (w + 2*i + 1) % rows}
					if load[0] == load[1] {
						load = load[:1]
					}
					if err := b.CopyRows(dev, region, RowSlots(testRowBytes, 0, testRowBytes, load)); err != nil {
						errs <- err
						return
					}
					for j, row := range load {
						got, err := b.Fingerprint(dev, j*testRowBytes, testRowBytes)
						want := FingerprintHost(region[row*testRowBytes : (row+1)*testRowBytes])
						if err != nil || got != want {
							errs <- fmt.Errorf("worker %d row %d: fingerprint %#x, %v; want %#x", w, row, got, err, want)
							return
						}
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}

// TestBackendRejectsBadRequests checks the argument checks both backends share.
func TestBackendRejectsBadRequests(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b Backend) {
		src := make([]byte, 4*testRowBytes)
		dev := alloc(t, b, 2*testRowBytes)
		for _, c := range []struct {
			name   string
			copies []RowCopy
			want   string
		}{
			{"source past end", []RowCopy{{Src: 3*testRowBytes + 1, Dst: 0, Len: testRowBytes}}, "source range"},
			{"destination past end", []RowCopy{{Src: 0, Dst: testRowBytes + 1, Len: testRowBytes}}, "destination range"},
			{"negative offset", []RowCopy{{Src: -1, Dst: 0, Len: 10}}, "source range"},
			{"zero length", []RowCopy{{Src: 0, Dst: 0, Len: 0}}, "length 0"},
			{"overlapping destinations", []RowCopy{{Src: 0, Dst: 0, Len: 100}, {Src: 200, Dst: 99, Len: 10}}, "overlap"},
		} {
			if err := b.CopyRows(dev, src, c.copies); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: CopyRows error %v, want one containing %q", c.name, err, c.want)
			}
		}
		if _, err := b.Fingerprint(dev, testRowBytes, testRowBytes+1); err == nil {
			t.Error("Fingerprint past the end succeeded")
		}
		if err := b.CopyBack(make([]byte, 10), dev, 2*testRowBytes-9); err == nil {
			t.Error("CopyBack past the end succeeded")
		}
		if _, err := b.Register(nil); err == nil {
			t.Error("Register(nil) succeeded")
		}
		if _, err := b.Alloc(0); err == nil {
			t.Error("Alloc(0) succeeded")
		}

		foreign, err := NewHost().Alloc(16)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.CopyRows(foreign, src, []RowCopy{{Len: 8}}); err == nil || !strings.Contains(err.Error(), "does not belong") {
			t.Errorf("CopyRows into another backend's buffer: %v", err)
		}

		freed, err := b.Alloc(16)
		if err != nil {
			t.Fatal(err)
		}
		if err := freed.Free(); err != nil {
			t.Fatal(err)
		}
		if err := freed.Free(); err != nil {
			t.Errorf("second Free: %v", err)
		}
		if _, err := b.Fingerprint(freed, 0, 8); err == nil || !strings.Contains(err.Error(), "freed") {
			t.Errorf("Fingerprint of a freed buffer: %v", err)
		}
	})
}

// TestClosedBackend checks that a closed backend refuses work.
func TestClosedBackend(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b Backend) {
		dev := alloc(t, b, 64)
		if err := dev.Free(); err != nil {
			t.Fatal(err)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Alloc(64); err != errClosed {
			t.Errorf("Alloc after Close: %v, want %v", err, errClosed)
		}
	})
}

// alloc allocates a device buffer freed when t ends.
func alloc(t *testing.T, b Backend, n int) DeviceBuffer {
	t.Helper()
	dev, err := b.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	if dev.Len() != n {
		t.Fatalf("Alloc(%d).Len() = %d", n, dev.Len())
	}
	t.Cleanup(func() {
		if err := dev.Free(); err != nil && err != errClosed {
			t.Errorf("Free: %v", err)
		}
	})
	return dev
}

// checkDevice checks that dev holds want at off: by fingerprint (computed by the
// backend, against FingerprintHost) and by copying the bytes back.
func checkDevice(t *testing.T, b Backend, dev DeviceBuffer, off int, want []byte) {
	t.Helper()
	got, err := b.Fingerprint(dev, off, len(want))
	if err != nil {
		t.Fatal(err)
	}
	if exp := FingerprintHost(want); got != exp {
		t.Errorf("fingerprint of %d bytes at %d: device %#016x, host %#016x", len(want), off, got, exp)
	}
	back := make([]byte, len(want))
	if err := b.CopyBack(back, dev, off); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, want) {
		t.Errorf("bytes copied back from %d (%d bytes) differ from the source", off, len(want))
	}
}
