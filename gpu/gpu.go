package gpu

import (
	"errors"
	"fmt"
	"slices"
)

// Backend is the CPU→GPU load stage: it copies rows of host memory (normally
// the engine's shm region) into device memory, fingerprints device memory and
// copies it back. Its methods are safe for concurrent use until Close.
type Backend interface {
	// Name is the backend's kind: "cuda" or "host".
	Name() string
	// Describe says which device the backend drives, for logs and reports.
	Describe() string
	// FingerprintMethod says how Fingerprint is computed (on the device by a
	// kernel, or by a device→host copy and a host hash) and, for a fallback, why.
	FingerprintMethod() string
	// Register pins region for DMA (cudaHostRegister) until the returned
	// HostMemory is released; region must stay mapped until then. Where the
	// device cannot register host memory the region is used as pageable
	// memory, and where it reads host memory through the host's page tables
	// (unified memory: GH200, GB10) registration populates without pinning;
	// Describe says which (planHostMemory).
	Register(region []byte) (HostMemory, error)
	// AllocPinned allocates n bytes of page-locked host memory (cudaMallocHost).
	AllocPinned(n int) (HostMemory, error)
	// Alloc allocates n bytes of device memory.
	Alloc(n int) (DeviceBuffer, error)
	// CopyRows copies src[c.Src:c.Src+c.Len] to dst at c.Dst for every c,
	// spread over the device's copy streams, and returns once all are done.
	// src may be registered, pinned or pageable memory; destinations must not
	// overlap.
	CopyRows(dst DeviceBuffer, src []byte, copies []RowCopy) error
	// Fingerprint returns the kvtier-fp1 fingerprint (see FingerprintHost) of
	// the n bytes of buf at off.
	Fingerprint(buf DeviceBuffer, off, n int) (uint64, error)
	// CopyBack copies len(dst) bytes of src at off into dst.
	CopyBack(dst []byte, src DeviceBuffer, off int) error
	// Close releases the backend's streams and kernels. Free buffers and release
	// host memory first.
	Close() error
}

// HostMemory is host memory pinned by a Backend (registered or allocated).
type HostMemory interface {
	// Bytes is the memory; it is valid until Release.
	Bytes() []byte
	// Release unpins registered memory or frees allocated memory. Calling it
	// again does nothing.
	Release() error
}

// DeviceBuffer is device memory allocated by a Backend's Alloc.
type DeviceBuffer interface {
	// Len is the buffer's size in bytes.
	Len() int
	// Free releases the memory. Calling it again does nothing.
	Free() error
}

// RowCopy is one host→device copy of CopyRows: Len bytes from offset Src of
// the host memory to offset Dst of the device buffer.
type RowCopy struct {
	Src, Dst, Len int
}

// RowSlots returns the copies that place bytes [slotOff, slotOff+slotLen) of
// each listed row of a region of rowBytes-sized rows side by side in a device
// buffer: row rows[i]'s slot lands at i*slotLen. Whole rows are
// RowSlots(rowBytes, 0, rowBytes, rows).
func RowSlots(rowBytes, slotOff, slotLen int, rows []int) []RowCopy {
	copies := make([]RowCopy, len(rows))
	for i, row := range rows {
		copies[i] = RowCopy{Src: row*rowBytes + slotOff, Dst: i * slotLen, Len: slotLen}
	}
	return copies
}

// The values of --gpu.
const (
	KindAuto = "auto"
	KindCUDA = "cuda"
	KindHost = "host"
)

// Environment variables that override the shared library names tried by the
// CUDA backend (a path or a name for dlopen).
const (
	EnvCUDART = "KVTIERFS_CUDART"
	EnvNVRTC  = "KVTIERFS_NVRTC"
)

// Open returns the backend that --gpu kind names, on CUDA device ordinal
// device. "cuda" fails if the CUDA runtime cannot be loaded or the device is
// not usable; "auto" then falls back to the host backend. note says which
// backend was chosen and, for a fallback, why; log it.
func Open(kind string, device int) (b Backend, note string, err error) {
	switch kind {
	case KindHost:
		b = NewHost()
	case KindCUDA:
		if b, err = openCUDA(device); err != nil {
			return nil, "", err
		}
	case KindAuto:
		if b, err = openCUDA(device); err != nil {
			b = NewHost()
			return b, fmt.Sprintf("--gpu auto: CUDA not usable, using the host backend: %v", err), nil
		}
	default:
		return nil, "", fmt.Errorf("gpu: invalid --gpu value %q: want %s, %s or %s", kind, KindAuto, KindCUDA, KindHost)
	}
	return b, fmt.Sprintf("--gpu %s: %s", kind, b.Describe()), nil
}

// errClosed is returned by a backend's methods after Close.
var errClosed = errors.New("gpu: backend is closed")

// checkRange reports whether [off, off+n) lies within a buffer of size size.
func checkRange(what string, off, n, size int) error {
	if off < 0 || n < 0 || off > size || n > size-off {
		return fmt.Errorf("gpu: %s range [%d, %d+%d) outside its %d bytes", what, off, off, n, size)
	}
	return nil
}

// checkCopies validates copies for a source of srcLen and a destination of
// dstLen bytes: every range in bounds, lengths positive, destinations disjoint.
func checkCopies(copies []RowCopy, srcLen, dstLen int) error {
	for i, c := range copies {
		if c.Len <= 0 {
			return fmt.Errorf("gpu: copy %d has length %d", i, c.Len)
		}
		if err := checkRange(fmt.Sprintf("copy %d source", i), c.Src, c.Len, srcLen); err != nil {
			return err
		}
		if err := checkRange(fmt.Sprintf("copy %d destination", i), c.Dst, c.Len, dstLen); err != nil {
			return err
		}
	}
	sorted := slices.SortedFunc(slices.Values(copies), func(a, b RowCopy) int { return a.Dst - b.Dst })
	for i := 1; i < len(sorted); i++ {
		if prev := sorted[i-1]; sorted[i].Dst < prev.Dst+prev.Len {
			return fmt.Errorf("gpu: copies overlap at destination offset %d", sorted[i].Dst)
		}
	}
	return nil
}

// CUDAError is a failed CUDA, driver API or NVRTC call, with the library's own
// error string.
type CUDAError struct {
	Call    string // the failed call, e.g. "cudaHostRegister"
	Code    int    // its status code
	Message string // the library's error string for Code
}

func (e *CUDAError) Error() string {
	return fmt.Sprintf("gpu: %s: %s (error %d)", e.Call, e.Message, e.Code)
}
