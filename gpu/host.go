package gpu

import (
	"errors"
	"sync"
)

// hostBackend implements Backend over ordinary memory: "device" buffers are Go
// slices, copies are memmoves. It has the CUDA backend's semantics and checks,
// so code that runs on it runs unchanged on a GPU.
type hostBackend struct {
	mu     sync.RWMutex
	closed bool
}

// NewHost returns the host backend, which needs no GPU.
func NewHost() Backend { return &hostBackend{} }

func (h *hostBackend) Name() string { return KindHost }

func (h *hostBackend) Describe() string { return "host memory (no GPU)" }

func (h *hostBackend) FingerprintMethod() string { return "host: FingerprintHost over host memory" }

// hostMemory is host memory as the host backend hands it out: nothing to pin.
type hostMemory struct{ bytes []byte }

func (m *hostMemory) Bytes() []byte { return m.bytes }

func (m *hostMemory) Release() error { return nil }

func (h *hostBackend) Register(region []byte) (HostMemory, error) {
	if err := h.usable(); err != nil {
		return nil, err
	}
	if len(region) == 0 {
		return nil, errors.New("gpu: cannot register an empty region")
	}
	return &hostMemory{bytes: region}, nil
}

func (h *hostBackend) AllocPinned(n int) (HostMemory, error) {
	if err := h.usable(); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, errors.New("gpu: allocation size must be positive")
	}
	return &hostMemory{bytes: make([]byte, n)}, nil
}

// hostBuffer is the host backend's device memory.
type hostBuffer struct {
	owner *hostBackend
	mu    sync.RWMutex
	bytes []byte // nil once freed
	size  int
}

func (b *hostBuffer) Len() int { return b.size }

func (b *hostBuffer) Free() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.bytes = nil
	return nil
}

func (h *hostBackend) Alloc(n int) (DeviceBuffer, error) {
	if err := h.usable(); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, errors.New("gpu: allocation size must be positive")
	}
	return &hostBuffer{owner: h, bytes: make([]byte, n), size: n}, nil
}

// buffer returns the live bytes of a buffer of this backend, read-locked: the
// caller must call b.mu.RUnlock.
func (h *hostBackend) buffer(buf DeviceBuffer) (*hostBuffer, error) {
	b, ok := buf.(*hostBuffer)
	if !ok || b.owner != h {
		return nil, errors.New("gpu: device buffer does not belong to this host backend")
	}
	b.mu.RLock()
	if b.bytes == nil {
		b.mu.RUnlock()
		return nil, errors.New("gpu: device buffer was freed")
	}
	return b, nil
}

func (h *hostBackend) CopyRows(dst DeviceBuffer, src []byte, copies []RowCopy) error {
	if err := h.usable(); err != nil {
		return err
	}
	b, err := h.buffer(dst)
	if err != nil {
		return err
	}
	defer b.mu.RUnlock()
	if err := checkCopies(copies, len(src), b.size); err != nil {
		return err
	}
	for _, c := range copies {
		copy(b.bytes[c.Dst:c.Dst+c.Len], src[c.Src:c.Src+c.Len])
	}
	return nil
}

func (h *hostBackend) Fingerprint(buf DeviceBuffer, off, n int) (uint64, error) {
	if err := h.usable(); err != nil {
		return 0, err
	}
	b, err := h.buffer(buf)
	if err != nil {
		return 0, err
	}
	defer b.mu.RUnlock()
	if err := checkRange("fingerprint", off, n, b.size); err != nil {
		return 0, err
	}
	return FingerprintHost(b.bytes[off : off+n]), nil
}

func (h *hostBackend) CopyBack(dst []byte, src DeviceBuffer, off int) error {
	if err := h.usable(); err != nil {
		return err
	}
	b, err := h.buffer(src)
	if err != nil {
		return err
	}
	defer b.mu.RUnlock()
	if err := checkRange("copy-back", off, len(dst), b.size); err != nil {
		return err
	}
	copy(dst, b.bytes[off:])
	return nil
}

func (h *hostBackend) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	return nil
}

// usable returns errClosed after Close.
func (h *hostBackend) usable() error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.closed {
		return errClosed
	}
	return nil
}
