//go:build cgo && cuda

package gpu

/*
#cgo LDFLAGS: -ldl
#include "cudaload.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// Library names tried in order, unless the environment variable names one.
var (
	cudartNames = []string{"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}
	nvrtcNames  = []string{"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2"}
	driverNames = []string{"libcuda.so.1", "libcuda.so"}
)

// stagingBytes is the pinned buffer of the fallback fingerprint (a multiple of 8).
const stagingBytes = 8 << 20

// tables caches resolved entry-point tables by library handle; the libraries
// stay loaded for the life of the process (unloading the CUDA runtime is unsafe).
var tables struct {
	sync.Mutex
	byHandle map[unsafe.Pointer]unsafe.Pointer
}

// loadLibrary dlopens the first of names that loads (only $env if it is set)
// and resolves its entry points into a C table of size bytes.
func loadLibrary(what, env string, names []string, size C.size_t,
	resolve func(lib, table unsafe.Pointer) *C.char) (unsafe.Pointer, error) {
	override := ""
	if env != "" {
		override = os.Getenv(env)
	}
	if override != "" {
		names = []string{override}
	}
	var failures []string
	var lib unsafe.Pointer
	for _, name := range names {
		cname := C.CString(name)
		var msg *C.char
		lib = C.kvt_dlopen(cname, &msg)
		C.free(unsafe.Pointer(cname))
		if lib != nil {
			break
		}
		failures = append(failures, C.GoString(msg))
		C.free(unsafe.Pointer(msg))
	}
	if lib == nil {
		hint := ""
		switch {
		case override != "":
			hint = fmt.Sprintf(" named by %s", env)
		case env != "":
			hint = fmt.Sprintf(" (set %s to its path if it is installed elsewhere)", env)
		}
		return nil, fmt.Errorf("gpu: cannot load %s%s: %s", what, hint, strings.Join(failures, "; "))
	}
	tables.Lock()
	defer tables.Unlock()
	if table, ok := tables.byHandle[lib]; ok {
		return table, nil
	}
	table := C.calloc(1, size)
	if missing := resolve(lib, table); missing != nil {
		C.free(table)
		return nil, fmt.Errorf("gpu: %s lacks %s", what, C.GoString(missing))
	}
	if tables.byHandle == nil {
		tables.byHandle = make(map[unsafe.Pointer]unsafe.Pointer)
	}
	tables.byHandle[lib] = table
	return table, nil
}

func loadCUDART() (*C.kvt_cudart, error) {
	t, err := loadLibrary("the CUDA runtime (libcudart)", EnvCUDART, cudartNames, C.sizeof_kvt_cudart,
		func(lib, table unsafe.Pointer) *C.char { return C.kvt_resolve_cudart(lib, (*C.kvt_cudart)(table)) })
	return (*C.kvt_cudart)(t), err
}

func loadDriver() (*C.kvt_driver, error) {
	t, err := loadLibrary("the CUDA driver API (libcuda)", "", driverNames, C.sizeof_kvt_driver,
		func(lib, table unsafe.Pointer) *C.char { return C.kvt_resolve_driver(lib, (*C.kvt_driver)(table)) })
	return (*C.kvt_driver)(t), err
}

func loadNVRTC() (*C.kvt_nvrtc, error) {
	t, err := loadLibrary("NVRTC (libnvrtc)", EnvNVRTC, nvrtcNames, C.sizeof_kvt_nvrtc,
		func(lib, table unsafe.Pointer) *C.char { return C.kvt_resolve_nvrtc(lib, (*C.kvt_nvrtc)(table)) })
	return (*C.kvt_nvrtc)(t), err
}

// cudaError turns a failed call into a *CUDAError carrying the library's own
// error string; it returns nil for success.
func cudaError(rt *C.kvt_cudart, drv *C.kvt_driver, nv *C.kvt_nvrtc, e C.kvt_err) error {
	if e.code == 0 {
		return nil
	}
	return &CUDAError{
		Call:    C.GoString(e.call),
		Code:    int(e.code),
		Message: C.GoString(C.kvt_error_string(rt, drv, nv, e)),
	}
}

// DeviceCount returns the number of CUDA devices, or an error saying why CUDA
// is not usable (library missing, no driver, no device).
func DeviceCount() (int, error) {
	rt, err := loadCUDART()
	if err != nil {
		return 0, err
	}
	var n C.int
	if err := cudaError(rt, nil, nil, C.kvt_device_count(rt, &n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// cudaBackend implements Backend on one CUDA device.
type cudaBackend struct {
	mu  sync.RWMutex // read-held by every operation, write-held by Close
	dev *C.kvt_dev   // nil after Close
	rt  *C.kvt_cudart
	drv *C.kvt_driver // nil when libcuda is missing
	nv  *C.kvt_nvrtc  // nil when NVRTC is missing

	description string
	fpMethod    string
	memory      hostMemoryPlan // how Register treats the region on this device

	fpMu    sync.Mutex      // serializes the scratch word and the staging buffer
	staging *cudaHostMemory // fallback fingerprint's pinned buffer; nil with a kernel
}

func openCUDA(device int) (Backend, error) {
	count, err := DeviceCount()
	if err != nil {
		return nil, err
	}
	if device < 0 || device >= count {
		return nil, fmt.Errorf("gpu: CUDA device %d requested, %d present", device, count)
	}
	rt, err := loadCUDART()
	if err != nil {
		return nil, err
	}
	d := (*C.kvt_dev)(C.calloc(1, C.sizeof_kvt_dev))
	d.rt = rt
	d.device = C.int(device)
	b := &cudaBackend{dev: d, rt: rt}
	if err := b.check(C.kvt_dev_init(d)); err != nil {
		b.Close()
		return nil, fmt.Errorf("%w (opening CUDA device %d)", err, device)
	}
	b.memory = planHostMemory(memoryAttrs{
		HostRegisterSupported: d.host_register_supported != 0,
		UsesHostPageTables:    d.uses_host_page_tables != 0,
		Integrated:            d.integrated != 0,
	})
	b.description = b.describe()
	if err := b.setupFingerprint(); err != nil {
		b.Close()
		return nil, fmt.Errorf("%w (opening CUDA device %d)", err, device)
	}
	return b, nil
}

func (b *cudaBackend) check(e C.kvt_err) error { return cudaError(b.rt, b.drv, b.nv, e) }

// describe names the device, its architecture and the CUDA versions.
func (b *cudaBackend) describe() string {
	d := b.dev
	name := "unnamed device"
	if drv, err := loadDriver(); err == nil {
		var buf [256]C.char
		if C.kvt_device_name(drv, d.device, &buf[0], C.int(len(buf))).code == 0 {
			name = C.GoString(&buf[0])
		}
	}
	version := func(v C.int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }
	return fmt.Sprintf("cuda device %d: %s (sm_%d%d, %d SMs; CUDA runtime %s, driver %s; %s)",
		d.device, name, d.cc_major, d.cc_minor, d.sms, version(d.runtime_version), version(d.driver_version), b.memory.note)
}

// setupFingerprint compiles and loads the fingerprint kernel; without NVRTC or
// the driver API it falls back to device→host copies and the host hash.
func (b *cudaBackend) setupFingerprint() error {
	err := b.loadKernel()
	if err == nil {
		var major, minor C.int
		C.kvt_nvrtc_version(b.nv, &major, &minor)
		b.fpMethod = fmt.Sprintf("device kernel %s (NVRTC %d.%d, sm_%d%d, cuLaunchKernel)",
			fingerprintKernelName, major, minor, b.dev.cc_major, b.dev.cc_minor)
		return nil
	}
	staging, serr := b.allocPinned(stagingBytes)
	if serr != nil {
		return serr
	}
	b.staging = staging
	b.fpMethod = fmt.Sprintf("device→host copy + host hash (no device kernel: %v)", err)
	return nil
}

func (b *cudaBackend) loadKernel() error {
	nv, err := loadNVRTC()
	if err != nil {
		return err
	}
	drv, err := loadDriver()
	if err != nil {
		return err
	}
	b.drv, b.nv = drv, nv
	src := C.CString(fingerprintKernelSource)
	defer C.free(unsafe.Pointer(src))
	file := C.CString(FingerprintName + ".cu")
	defer C.free(unsafe.Pointer(file))
	arch := C.CString(fmt.Sprintf("--gpu-architecture=sm_%d%d", b.dev.cc_major, b.dev.cc_minor))
	defer C.free(unsafe.Pointer(arch))
	var cubin, log *C.char
	var size C.size_t
	if err := b.check(C.kvt_compile(nv, src, file, arch, &cubin, &size, &log)); err != nil {
		if log != nil {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(C.GoString(log)))
			C.free(unsafe.Pointer(log))
		}
		return err
	}
	defer C.free(unsafe.Pointer(cubin))
	kernel := C.CString(fingerprintKernelName)
	defer C.free(unsafe.Pointer(kernel))
	return b.check(C.kvt_load_kernel(b.dev, drv, cubin, kernel))
}

func (b *cudaBackend) Name() string { return KindCUDA }

func (b *cudaBackend) Describe() string { return b.description }

func (b *cudaBackend) FingerprintMethod() string { return b.fpMethod }

// lock read-locks the backend and fails after Close; the caller must RUnlock.
func (b *cudaBackend) lock() error {
	b.mu.RLock()
	if b.dev == nil {
		b.mu.RUnlock()
		return errClosed
	}
	return nil
}

// cudaHostMemory is a region Register was given (registered with
// cudaHostRegister, or left pageable where the device cannot register) or
// memory pinned by cudaMallocHost.
type cudaHostMemory struct {
	owner  *cudaBackend
	mu     sync.Mutex
	bytes  []byte // nil once released
	kind   hostMemoryKind
	pinner runtime.Pinner // keeps a registered Go-heap region in place
}

// hostMemoryKind says what releasing a cudaHostMemory undoes.
type hostMemoryKind int

const (
	allocatedMemory  hostMemoryKind = iota // cudaMallocHost: cudaFreeHost
	registeredMemory                       // cudaHostRegister: cudaHostUnregister
	pageableMemory                         // the caller's, untouched: nothing
)

func (m *cudaHostMemory) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bytes
}

func (m *cudaHostMemory) Release() error {
	if err := m.owner.lock(); err != nil {
		return err
	}
	defer m.owner.mu.RUnlock()
	return m.release()
}

// release does Release's work; the caller holds the owner's lock.
func (m *cudaHostMemory) release() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.bytes == nil {
		return nil
	}
	p := unsafe.Pointer(unsafe.SliceData(m.bytes))
	var err error
	switch m.kind {
	case registeredMemory:
		err = m.owner.check(C.kvt_host_unregister(m.owner.dev, p))
		m.pinner.Unpin()
	case allocatedMemory:
		err = m.owner.check(C.kvt_free_host(m.owner.dev, p))
	}
	m.bytes = nil
	return err
}

func (b *cudaBackend) Register(region []byte) (HostMemory, error) {
	if err := b.lock(); err != nil {
		return nil, err
	}
	defer b.mu.RUnlock()
	if len(region) == 0 {
		return nil, errors.New("gpu: cannot register an empty region")
	}
	if !b.memory.register {
		return &cudaHostMemory{owner: b, bytes: region, kind: pageableMemory}, nil
	}
	m := &cudaHostMemory{owner: b, bytes: region, kind: registeredMemory}
	p := unsafe.SliceData(region)
	m.pinner.Pin(p)
	if err := b.check(C.kvt_host_register(b.dev, unsafe.Pointer(p), C.size_t(len(region)))); err != nil {
		m.pinner.Unpin()
		return nil, err
	}
	return m, nil
}

func (b *cudaBackend) AllocPinned(n int) (HostMemory, error) {
	if err := b.lock(); err != nil {
		return nil, err
	}
	defer b.mu.RUnlock()
	return b.allocPinned(n)
}

func (b *cudaBackend) allocPinned(n int) (*cudaHostMemory, error) {
	if n <= 0 {
		return nil, errors.New("gpu: allocation size must be positive")
	}
	var p unsafe.Pointer
	if err := b.check(C.kvt_malloc_host(b.dev, &p, C.size_t(n))); err != nil {
		return nil, err
	}
	return &cudaHostMemory{owner: b, bytes: unsafe.Slice((*byte)(p), n)}, nil
}

// cudaBuffer is device memory from cudaMalloc.
type cudaBuffer struct {
	owner *cudaBackend
	mu    sync.RWMutex
	ptr   uint64 // 0 once freed
	size  int
}

func (buf *cudaBuffer) Len() int { return buf.size }

func (buf *cudaBuffer) Free() error {
	if err := buf.owner.lock(); err != nil {
		return err
	}
	defer buf.owner.mu.RUnlock()
	buf.mu.Lock()
	defer buf.mu.Unlock()
	if buf.ptr == 0 {
		return nil
	}
	err := buf.owner.check(C.kvt_free(buf.owner.dev, C.uint64_t(buf.ptr)))
	buf.ptr = 0
	return err
}

func (b *cudaBackend) Alloc(n int) (DeviceBuffer, error) {
	if err := b.lock(); err != nil {
		return nil, err
	}
	defer b.mu.RUnlock()
	if n <= 0 {
		return nil, errors.New("gpu: allocation size must be positive")
	}
	var ptr C.uint64_t
	if err := b.check(C.kvt_malloc(b.dev, &ptr, C.size_t(n))); err != nil {
		return nil, err
	}
	return &cudaBuffer{owner: b, ptr: uint64(ptr), size: n}, nil
}

// buffer returns a live buffer of this backend, read-locked: the caller must
// call buf.mu.RUnlock.
func (b *cudaBackend) buffer(db DeviceBuffer) (*cudaBuffer, error) {
	buf, ok := db.(*cudaBuffer)
	if !ok || buf.owner != b {
		return nil, errors.New("gpu: device buffer does not belong to this CUDA backend")
	}
	buf.mu.RLock()
	if buf.ptr == 0 {
		buf.mu.RUnlock()
		return nil, errors.New("gpu: device buffer was freed")
	}
	return buf, nil
}

func (b *cudaBackend) CopyRows(dst DeviceBuffer, src []byte, copies []RowCopy) error {
	if err := b.lock(); err != nil {
		return err
	}
	defer b.mu.RUnlock()
	buf, err := b.buffer(dst)
	if err != nil {
		return err
	}
	defer buf.mu.RUnlock()
	if err := checkCopies(copies, len(src), buf.size); err != nil {
		return err
	}
	if len(copies) == 0 {
		return nil
	}
	var pinner runtime.Pinner
	defer pinner.Unpin()
	base := unsafe.SliceData(src)
	pinner.Pin(base)
	cc := make([]C.kvt_copy, len(copies))
	for i, c := range copies {
		cc[i] = C.kvt_copy{
			dst: C.uint64_t(buf.ptr + uint64(c.Dst)),
			src: C.uint64_t(uintptr(unsafe.Pointer(base)) + uintptr(c.Src)),
			len: C.uint64_t(c.Len),
		}
	}
	return b.check(C.kvt_copy_h2d(b.dev, &cc[0], C.int(len(cc))))
}

func (b *cudaBackend) Fingerprint(db DeviceBuffer, off, n int) (uint64, error) {
	if err := b.lock(); err != nil {
		return 0, err
	}
	defer b.mu.RUnlock()
	buf, err := b.buffer(db)
	if err != nil {
		return 0, err
	}
	defer buf.mu.RUnlock()
	if err := checkRange("fingerprint", off, n, buf.size); err != nil {
		return 0, err
	}
	b.fpMu.Lock()
	defer b.fpMu.Unlock()
	ptr := buf.ptr + uint64(off)
	if b.staging == nil {
		var sum C.uint64_t
		if err := b.check(C.kvt_fingerprint_sum(b.dev, C.uint64_t(ptr), C.uint64_t(n), &sum)); err != nil {
			return 0, err
		}
		return fingerprintFinish(uint64(sum), n), nil
	}
	var sum uint64
	for done := 0; done < n; {
		chunk := b.staging.bytes[:min(len(b.staging.bytes), n-done)]
		err := b.check(C.kvt_copy_d2h(b.dev, unsafe.Pointer(unsafe.SliceData(chunk)),
			C.uint64_t(ptr+uint64(done)), C.size_t(len(chunk))))
		if err != nil {
			return 0, err
		}
		sum += fingerprintSum(chunk, uint64(done/8))
		done += len(chunk)
	}
	return fingerprintFinish(sum, n), nil
}

func (b *cudaBackend) CopyBack(dst []byte, src DeviceBuffer, off int) error {
	if err := b.lock(); err != nil {
		return err
	}
	defer b.mu.RUnlock()
	buf, err := b.buffer(src)
	if err != nil {
		return err
	}
	defer buf.mu.RUnlock()
	if err := checkRange("copy-back", off, len(dst), buf.size); err != nil {
		return err
	}
	if len(dst) == 0 {
		return nil
	}
	return b.check(C.kvt_copy_d2h(b.dev, unsafe.Pointer(unsafe.SliceData(dst)),
		C.uint64_t(buf.ptr+uint64(off)), C.size_t(len(dst))))
}

func (b *cudaBackend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dev == nil {
		return nil
	}
	var errs []error
	if b.staging != nil {
		errs = append(errs, b.staging.release())
		b.staging = nil
	}
	errs = append(errs, b.check(C.kvt_dev_destroy(b.dev)))
	C.free(unsafe.Pointer(b.dev))
	b.dev = nil
	return errors.Join(errs...)
}
