package diagnose

import (
	"fmt"
	"sync"
	"time"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

const tierA, tierB = "ModelA_0123456789ab_r0", "ModelB_0123456789ab_r0"

// chunkKey is the block key of chunk i of a tier's group.
func chunkKey(tier string, group, chunk int) block.Ref {
	return block.Name{Tier: tier, Group: group, Hash: fmt.Sprintf("%064x", chunk+1)}.Ref()
}

func chunkKeys(tier string, group, n int) []block.Ref {
	keys := make([]block.Ref, n)
	for i := range keys {
		keys[i] = chunkKey(tier, group, i)
	}
	return keys
}

// fakeClock is an injectable clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
