package main

import (
	"os"
	"runtime/debug"

	"github.com/kvtierfs/kvtierfs/fusefs/core"
)

// memoryOverhead is what the daemon may hold beyond --staging-bytes: the
// verified buffers of open loads (at most core.DefaultMaxBytes), up to
// 256 MiB of free block buffers, and 256 MiB for the Go runtime, the index,
// FUSE request buffers and the peer channel.
const memoryOverhead = core.DefaultMaxBytes + 512<<20

// limitMemory sets the Go runtime's memory limit to the staging budget plus
// memoryOverhead, so the collector returns memory before the daemon grows
// past what its flags allow; GOMEMLIMIT in the environment wins. It returns
// the limit set, or 0 when the environment's is kept.
func limitMemory(stagingBytes int64) int64 {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0
	}
	limit := stagingBytes + memoryOverhead
	debug.SetMemoryLimit(limit)
	return limit
}
