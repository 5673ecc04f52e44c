package engine

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/kvtierfs/kvtierfs/gpu"
)

// maxGPUBatchRows bounds the rows one CopyRows call moves, and so the device
// buffer each rank allocates.
const maxGPUBatchRows = 32

// worker is one TP rank: it writes its KV into its slot of rows of its node's
// region (GPU→CPU stores) and loads that slot of rows into its GPU (CPU→GPU).
type worker struct {
	rank      int
	node      *node
	slotOff   int
	slotBytes int
	rowBytes  int
	// kvRank is the rank whose KV this worker holds: -1 for MLA, where all
	// ranks hold the same bytes.
	kvRank  int
	backend gpu.Backend
	// source is the node's region as the backend copies from it.
	source []byte
	device gpu.DeviceBuffer
}

// gpuStage owns the backends, region registrations and device buffers of the
// workers.
type gpuStage struct {
	backends      map[int]gpu.Backend
	registrations []gpu.HostMemory
	buffers       []gpu.DeviceBuffer
	notes         []string
}

// newWorkers opens a backend per device, registers each node's region once and
// gives each rank a device buffer. The ranks are spread evenly over the nodes;
// rank r's slot is its local GPU index % world size (DESIGN §2).
func newWorkers(cfg Config, nodes []*node) (_ []*worker, _ *gpuStage, err error) {
	stage := &gpuStage{backends: map[int]gpu.Backend{}}
	defer func() {
		if err != nil {
			stage.close()
		}
	}()
	perNode := cfg.WorldSize / cfg.Nodes
	slotBytes := cfg.SlotBytes()
	batch := min(cfg.Rows, maxGPUBatchRows)
	registered := make(map[int][]byte) // node → registered region memory
	var workers []*worker
	for rank := 0; rank < cfg.WorldSize; rank++ {
		device := cfg.GPUDevices[rank%len(cfg.GPUDevices)]
		backend, ok := stage.backends[device]
		if !ok {
			var note string
			if backend, note, err = gpu.Open(cfg.GPU, device); err != nil {
				return nil, nil, err
			}
			stage.backends[device] = backend
			stage.notes = append(stage.notes, note)
		}
		n := nodes[rank/perNode]
		source, ok := registered[n.index]
		if !ok {
			mem, err := backend.Register(n.region.Bytes())
			if err != nil {
				return nil, nil, fmt.Errorf("rank %d: registering node %d's region: %w", rank, n.index, err)
			}
			stage.registrations = append(stage.registrations, mem)
			source = mem.Bytes()
			registered[n.index] = source
		}
		buf, err := backend.Alloc(batch * slotBytes)
		if err != nil {
			return nil, nil, fmt.Errorf("rank %d: device buffer: %w", rank, err)
		}
		stage.buffers = append(stage.buffers, buf)
		w := &worker{
			rank:      rank,
			node:      n,
			slotOff:   (rank % perNode) % cfg.WorldSize * slotBytes,
			slotBytes: slotBytes,
			rowBytes:  cfg.RowBytes,
			kvRank:    -1,
			backend:   backend,
			source:    source,
			device:    buf,
		}
		if cfg.KV == KVGQA {
			w.kvRank = rank
		}
		workers = append(workers, w)
	}
	return workers, stage, nil
}

// describe says which backends the workers use, for the report.
func (s *gpuStage) describe() string {
	names := make([]string, 0, len(s.backends))
	for device, b := range s.backends {
		names = append(names, fmt.Sprintf("%s:%d", b.Name(), device))
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

// close frees the device buffers, releases the registrations and closes the
// backends.
func (s *gpuStage) close() error {
	var errs []error
	for _, b := range s.buffers {
		errs = append(errs, b.Free())
	}
	for _, r := range s.registrations {
		errs = append(errs, r.Release())
	}
	for _, b := range s.backends {
		errs = append(errs, b.Close())
	}
	return errors.Join(errs...)
}

// kvSource returns the KV source of block on this worker's rank.
func (w *worker) kvSource(block blockKey) kvSource {
	return kvSource{block: block, rank: w.kvRank}
}

// storeKV writes the KV of blocks[i] into this rank's slot of rows[i] and
// records its fingerprint (once per block for MLA).
func (w *worker) storeKV(rows []int, blocks []blockKey, kv *kvIndex) {
	for i, row := range rows {
		slot := w.node.region.Row(row)[w.slotOff : w.slotOff+w.slotBytes]
		src := w.kvSource(blocks[i])
		fillKV(slot, src)
		if w.kvRank >= 0 || w.rank == 0 {
			kv.record(src, slot)
		}
	}
}

// loadKV copies this rank's slot of rows into its GPU, batch by batch, and
// reports for each row whether the GPU holds the KV of blocks[i] for this rank.
func (w *worker) loadKV(rows []int, blocks []blockKey, kv *kvIndex) ([]bool, error) {
	right := make([]bool, len(rows))
	batch := w.device.Len() / w.slotBytes
	for first := 0; first < len(rows); first += batch {
		last := min(first+batch, len(rows))
		copies := gpu.RowSlots(w.rowBytes, w.slotOff, w.slotBytes, rows[first:last])
		if err := w.backend.CopyRows(w.device, w.source, copies); err != nil {
			return nil, fmt.Errorf("rank %d: CPU→GPU load: %w", w.rank, err)
		}
		for i := first; i < last; i++ {
			got, err := w.backend.Fingerprint(w.device, (i-first)*w.slotBytes, w.slotBytes)
			if err != nil {
				return nil, fmt.Errorf("rank %d: fingerprint: %w", w.rank, err)
			}
			want, ok := kv.expected(w.kvSource(blocks[i]))
			right[i] = ok && got == want
		}
	}
	return right, nil
}

// onEveryRank runs fn for every worker in parallel and joins their errors.
func onEveryRank(workers []*worker, fn func(w *worker) error) error {
	errs := make([]error, len(workers))
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Go(func() { errs[i] = fn(w) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
