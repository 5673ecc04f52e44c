//go:build cgo && cuda

package gpu

import (
	"errors"
	"strings"
	"testing"
)

// TestMissingRuntimeFailsCleanly points the loader at a library that does not
// exist: cuda must fail naming it and dlopen's reason, auto must fall back.
func TestMissingRuntimeFailsCleanly(t *testing.T) {
	const missing = "/nonexistent/libcudart-kvtier-test.so.13"
	t.Setenv(EnvCUDART, missing)

	_, _, err := Open(KindCUDA, 0)
	if err == nil {
		t.Fatal("Open(cuda) with a missing runtime succeeded")
	}
	for _, want := range []string{missing, EnvCUDART, "cannot open shared object file"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := DeviceCount(); err == nil {
		t.Error("DeviceCount with a missing runtime succeeded")
	}

	b, note, err := Open(KindAuto, 0)
	if err != nil {
		t.Fatalf("Open(auto) with a missing runtime: %v", err)
	}
	defer b.Close()
	if b.Name() != KindHost || !strings.Contains(note, missing) {
		t.Errorf("Open(auto) = %s backend, note %q; want host and the missing library named", b.Name(), note)
	}
}

// TestRuntimeWithoutSymbolsFailsCleanly loads a library that is not the CUDA
// runtime: the error must name the first missing entry point.
func TestRuntimeWithoutSymbolsFailsCleanly(t *testing.T) {
	t.Setenv(EnvCUDART, "libc.so.6")
	_, _, err := Open(KindCUDA, 0)
	if err == nil || !strings.Contains(err.Error(), "lacks cudaGetErrorString") {
		t.Fatalf("Open(cuda) with libc as the runtime: %v, want an error naming cudaGetErrorString", err)
	}
}

// TestBadDeviceOrdinal asks for a device that cannot exist.
func TestBadDeviceOrdinal(t *testing.T) {
	if _, err := DeviceCount(); err != nil {
		skipNoCUDA(t, err)
	}
	_, _, err := Open(KindCUDA, 1000)
	if err == nil || !strings.Contains(err.Error(), "device 1000 requested") {
		t.Fatalf("Open(cuda, 1000): %v", err)
	}
}

// TestFingerprintMethod checks that the CUDA backend reports its method, that
// with NVRTC present it is the device kernel, and that hiding NVRTC gives the
// host-hash fallback with the reason.
func TestFingerprintMethod(t *testing.T) {
	b := openCUDAForTest(t, 0)
	method := b.FingerprintMethod()
	b.Close()
	if _, err := loadNVRTC(); err == nil && !strings.Contains(method, "device kernel "+fingerprintKernelName) {
		t.Errorf("NVRTC loads but the method is %q", method)
	}

	const missing = "/nonexistent/libnvrtc-kvtier-test.so"
	t.Setenv(EnvNVRTC, missing)
	b = openCUDAForTest(t, 0)
	defer b.Close()
	if m := b.FingerprintMethod(); !strings.Contains(m, "host hash") || !strings.Contains(m, missing) {
		t.Errorf("without NVRTC the method is %q", m)
	}
}

// TestCUDAErrorCarriesCUDAString checks that a failing CUDA call reports CUDA's
// own error string: an absurd allocation must fail with cudaMalloc's.
func TestCUDAErrorCarriesCUDAString(t *testing.T) {
	b := openCUDAForTest(t, 0)
	defer b.Close()
	_, err := b.Alloc(1 << 62)
	var cerr *CUDAError
	if !errors.As(err, &cerr) || cerr.Call != "cudaMalloc" || cerr.Message == "" || cerr.Code == 0 {
		t.Fatalf("Alloc(1<<62): %v, want a CUDAError from cudaMalloc", err)
	}
	t.Log(err)
}
