package gpu

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
)

// envRequireCUDA makes CUDA-backend tests fail instead of skip when no device is
// usable: set it on the accelerator machine so a broken backend cannot pass as
// a skipped one.
const envRequireCUDA = "KVTIERFS_REQUIRE_CUDA"

// backendCase opens one backend under test.
type backendCase struct {
	name string
	open func(tb testing.TB) Backend
}

// testBackends returns the host backend, the CUDA backend on every device, and
// the CUDA backend with NVRTC hidden (the fallback fingerprint) on device 0.
// CUDA cases skip, with the reason, when no device is usable.
func testBackends() []backendCase {
	cases := []backendCase{{"host", func(testing.TB) Backend { return NewHost() }}}
	count, err := DeviceCount()
	if err == nil && count == 0 {
		err = errors.New("the CUDA runtime reports no device")
	}
	if err != nil {
		return append(cases, backendCase{"cuda", func(tb testing.TB) Backend {
			skipNoCUDA(tb, err)
			return nil
		}})
	}
	for device := range count {
		cases = append(cases, backendCase{fmt.Sprintf("cuda%d", device), func(tb testing.TB) Backend {
			return openCUDAForTest(tb, device)
		}})
	}
	return append(cases, backendCase{"cuda0-hostfingerprint", func(tb testing.TB) Backend {
		tb.Setenv(EnvNVRTC, "/nonexistent/libnvrtc-kvtier-test.so")
		return openCUDAForTest(tb, 0)
	}})
}

// forEachBackend runs f as a subtest on every backend of testBackends.
func forEachBackend(t *testing.T, f func(t *testing.T, b Backend)) {
	for _, c := range testBackends() {
		t.Run(c.name, func(t *testing.T) {
			b := c.open(t)
			t.Cleanup(func() {
				if err := b.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			f(t, b)
		})
	}
}

// openCUDAForTest opens the CUDA backend on device or skips the test.
func openCUDAForTest(tb testing.TB, device int) Backend {
	tb.Helper()
	b, err := openCUDA(device)
	if err != nil {
		skipNoCUDA(tb, err)
	}
	tb.Logf("%s; fingerprint: %s", b.Describe(), b.FingerprintMethod())
	return b
}

func skipNoCUDA(tb testing.TB, err error) {
	tb.Helper()
	if os.Getenv(envRequireCUDA) != "" {
		tb.Fatalf("%s is set but CUDA is not usable: %v", envRequireCUDA, err)
	}
	tb.Skipf("SKIP CUDA-backend test: no usable CUDA device: %v", err)
}

var shmFiles atomic.Int64

// shmPath returns a fresh /dev/shm/kvtier-test-* path, removed when t ends.
func shmPath(t *testing.T) string {
	t.Helper()
	path := fmt.Sprintf("/dev/shm/kvtier-test-%d-%d", os.Getpid(), shmFiles.Add(1))
	t.Cleanup(func() { os.Remove(path) })
	return path
}

// newShmRegion maps a fresh shm file of size bytes, unmapped and removed when t ends.
func newShmRegion(t *testing.T, size int) []byte {
	t.Helper()
	region, unmap, err := createShm(shmPath(t), size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unmap)
	return region
}

// fillRandom fills p with bytes determined by seed.
func fillRandom(p []byte, seed uint64) {
	for i := range p {
		seed = mix64(seed + fpGamma)
		p[i] = byte(seed >> 56)
	}
}
