// Package shm finds and maps the engine's shared offload regions
// (`/dev/shm/vllm_offload_<engine_id>.mmap`): files with no header holding
// rows × row_bytes, one block per row (DESIGN §2).
package shm

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	mmap "github.com/edsrzf/mmap-go"
)

// DefaultGlob matches vLLM's shared offload regions.
const DefaultGlob = "/dev/shm/vllm_offload_*.mmap"

// Region is one mapped shm region.
type Region struct {
	// Path is the region file.
	Path string
	// Size is its length in bytes.
	Size int64
	data mmap.MMap
}

// Bytes is the read-only mapping of the region.
func (r *Region) Bytes() []byte { return r.data }

// Info describes a region for stats: its geometry as inferred from the store's
// block size, and a warning when the two disagree.
type Info struct {
	Path     string `json:"path"`
	Size     int64  `json:"size_bytes"`
	Rows     int64  `json:"rows"`
	RowBytes int64  `json:"row_bytes"`
	Warning  string `json:"warning,omitempty"`
}

// Set tracks the regions that match a glob, mapping new ones and dropping
// vanished or resized ones at each Refresh.
type Set struct {
	glob string

	// mu guards regions: Refresh writes, the row searches read.
	mu      sync.RWMutex
	regions map[string]*Region
}

// NewSet returns a Set for the glob; call Refresh to map the regions.
func NewSet(glob string) (*Set, error) {
	if _, err := filepath.Match(glob, ""); err != nil {
		return nil, fmt.Errorf("--shm-glob %q: %w", glob, err)
	}
	return &Set{glob: glob, regions: make(map[string]*Region)}, nil
}

// Refresh maps regions that appeared and unmaps those that vanished or changed size.
func (s *Set) Refresh() error {
	paths, err := filepath.Glob(s.glob)
	if err != nil {
		return err
	}
	if !s.changed(paths) {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := make(map[string]bool, len(paths))
	var errs []error
	for _, p := range paths {
		seen[p] = true
		st, err := os.Stat(p)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		if r, ok := s.regions[p]; ok && r.Size == st.Size() {
			continue
		}
		s.unmapLocked(p)
		r, err := mapRegion(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.regions[p] = r
	}
	for p := range s.regions {
		if !seen[p] {
			s.unmapLocked(p)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("mapping shm regions: %v", errs)
	}
	return nil
}

// changed reports whether the regions matching the glob differ from the
// mapped ones, so that a Refresh with nothing to do never blocks readers.
func (s *Set) changed(paths []string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if len(paths) != len(s.regions) {
		return true
	}
	for _, p := range paths {
		r, ok := s.regions[p]
		st, err := os.Stat(p)
		if !ok || err != nil || st.Size() != r.Size {
			return true
		}
	}
	return false
}

// mapRegion maps a region file read-only.
func mapRegion(p string) (*Region, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	r := &Region{Path: p, Size: st.Size()}
	if r.Size == 0 {
		return r, nil
	}
	if r.data, err = mmap.Map(f, mmap.RDONLY, 0); err != nil {
		return nil, fmt.Errorf("mmap %s: %w", p, err)
	}
	return r, nil
}

func (s *Set) unmapLocked(p string) {
	if r, ok := s.regions[p]; ok {
		if r.data != nil {
			r.data.Unmap()
		}
		delete(s.regions, p)
	}
}

// Infos describes every region, inferring its row size from the block sizes
// found in the store (rowSizes); a region no block size divides is refused
// with a warning.
func (s *Set) Infos(rowSizes []int64) []Info {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Info, 0, len(s.regions))
	for _, r := range s.regions {
		out = append(out, describe(r, rowSizes))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// describe infers one region's geometry.
func describe(r *Region, rowSizes []int64) Info {
	info := Info{Path: r.Path, Size: r.Size}
	if len(rowSizes) == 0 {
		info.Warning = "row size unknown until the engine stores a block"
		return info
	}
	for _, rb := range rowSizes {
		if rb > 0 && r.Size > 0 && r.Size%rb == 0 {
			info.RowBytes, info.Rows = rb, r.Size/rb
			return info
		}
	}
	info.Warning = fmt.Sprintf("region of %d bytes is not a multiple of the block size %v: the engine and the store disagree on the row geometry; this region is not used", r.Size, rowSizes)
	return info
}

// Close unmaps every region.
func (s *Set) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := range s.regions {
		s.unmapLocked(p)
	}
}
