package engine

import "container/list"

// primaryTier is the scheduler's view of the primary (CPU) tier: which block
// each row of the shm region holds, reference counts, and LRU order. A row is
// free (never used, or released without a block), pinned (refs > 0) or cached
// (holds a block, refs == 0, evictable in LRU order).
type primaryTier struct {
	holder   []blockKey // block held by each row; valid where holds[row]
	holds    []bool
	refs     []int
	byBlock  map[blockKey]int
	free     []int // free rows, in the order they became free
	lru      *list.List
	lruEntry []*list.Element
	// pinned is the number of rows with refs > 0, peakPinned its maximum: the
	// most rows requests held at once.
	pinned, peakPinned int
}

func newPrimaryTier(rows int) *primaryTier {
	p := &primaryTier{
		holder:   make([]blockKey, rows),
		holds:    make([]bool, rows),
		refs:     make([]int, rows),
		byBlock:  make(map[blockKey]int, rows),
		lru:      list.New(),
		lruEntry: make([]*list.Element, rows),
	}
	p.reset()
	return p
}

// reset forgets every row, as an engine restart does. No row may be pinned.
func (p *primaryTier) reset() {
	clear(p.byBlock)
	p.lru.Init()
	p.free = p.free[:0]
	for row := range p.holds {
		if p.refs[row] != 0 {
			panic("engine: primary tier reset with pinned rows")
		}
		p.holds[row], p.lruEntry[row] = false, nil
		p.free = append(p.free, row)
	}
}

// rows is the number of rows of the region.
func (p *primaryTier) rows() int { return len(p.holds) }

// find returns the row that holds block.
func (p *primaryTier) find(block blockKey) (int, bool) {
	row, ok := p.byBlock[block]
	return row, ok
}

// alloc returns a pinned row that holds no block: a free row, else the least
// recently used cached row, whose block is dropped. ok is false when every
// row is pinned.
func (p *primaryTier) alloc() (row int, ok bool) {
	switch {
	case len(p.free) > 0:
		row, p.free = p.free[0], p.free[1:]
	case p.lru.Len() > 0:
		row = p.lru.Remove(p.lru.Front()).(int)
		p.lruEntry[row] = nil
		delete(p.byBlock, p.holder[row])
		p.holds[row] = false
	default:
		return 0, false
	}
	p.refs[row] = 1
	p.countPin()
	return row, true
}

// assign records that the pinned row now holds block, replacing any other
// row's claim to it.
func (p *primaryTier) assign(row int, block blockKey) {
	if old, ok := p.byBlock[block]; ok && old != row {
		p.drop(old)
	}
	if p.holds[row] {
		delete(p.byBlock, p.holder[row])
	}
	p.holder[row], p.holds[row] = block, true
	p.byBlock[block] = row
}

// drop makes a row hold no block (its bytes are not that block's any more).
func (p *primaryTier) drop(row int) {
	if !p.holds[row] {
		return
	}
	delete(p.byBlock, p.holder[row])
	p.holds[row] = false
	if e := p.lruEntry[row]; e != nil {
		p.lru.Remove(e)
		p.lruEntry[row] = nil
		p.free = append(p.free, row)
	}
}

// pin takes a reference on a row, which keeps it from eviction.
func (p *primaryTier) pin(row int) {
	if e := p.lruEntry[row]; e != nil {
		p.lru.Remove(e)
		p.lruEntry[row] = nil
	}
	if p.refs[row] == 0 {
		p.countPin()
	}
	p.refs[row]++
}

func (p *primaryTier) countPin() {
	p.pinned++
	p.peakPinned = max(p.peakPinned, p.pinned)
}

// unpin releases a reference; the last one makes the row the most recently
// used cached row, or free if it holds no block.
func (p *primaryTier) unpin(row int) {
	p.refs[row]--
	if p.refs[row] == 0 {
		p.pinned--
	}
	switch {
	case p.refs[row] > 0:
	case p.holds[row]:
		p.lruEntry[row] = p.lru.PushBack(row)
	default:
		p.free = append(p.free, row)
	}
}

// touch makes a cached row holding block the most recently used.
func (p *primaryTier) touch(block blockKey) {
	row, ok := p.byBlock[block]
	if !ok || p.lruEntry[row] == nil {
		return
	}
	p.lru.MoveToBack(p.lruEntry[row])
}
