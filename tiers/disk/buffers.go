package disk

import (
	"sync"
	"unsafe"
)

// blockBuffers recycles the page-aligned buffers ReadBlock fills, one pool
// per page-rounded size. A fresh 8 MiB buffer costs page faults and zeroing
// on every fetch; a recycled one costs neither (on a two-core host, half-zero
// rows served from staging loaded at 0.88 of staging off with recycling,
// 0.82 without). Pooled buffers are dropped by the garbage collector when
// unused.
type blockBuffers struct {
	pools sync.Map // page-rounded size → *sync.Pool of []byte with that capacity
}

// get returns a page-aligned buffer of size bytes whose capacity is size
// rounded up to whole pages. Its contents are arbitrary.
func (b *blockBuffers) get(size int) []byte {
	pages := roundUpToPage(size)
	if p, ok := b.pools.Load(pages); ok {
		if buf, ok := p.(*sync.Pool).Get().([]byte); ok {
			return buf[:size]
		}
	}
	raw := make([]byte, pages+PageSize)
	skip := 0
	if rem := int(uintptr(unsafe.Pointer(unsafe.SliceData(raw))) % PageSize); rem != 0 {
		skip = PageSize - rem
	}
	return raw[skip : skip+size : skip+pages]
}

// put hands back a buffer get returned; nothing may use it afterwards.
func (b *blockBuffers) put(buf []byte) {
	pages := cap(buf)
	if pages == 0 || pages%PageSize != 0 {
		return
	}
	p, _ := b.pools.LoadOrStore(pages, &sync.Pool{})
	p.(*sync.Pool).Put(buf[:pages])
}

// roundUpToPage rounds n up to a multiple of PageSize.
func roundUpToPage(n int) int { return (n + PageSize - 1) / PageSize * PageSize }
