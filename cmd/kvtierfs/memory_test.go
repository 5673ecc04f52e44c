package main

import (
	"runtime/debug"
	"testing"
)

func TestLimitMemoryFollowsTheStagingBudget(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	t.Setenv("GOMEMLIMIT", "")
	if got := limitMemory(1 << 30); got != 1<<30+memoryOverhead || debug.SetMemoryLimit(-1) != got {
		t.Fatalf("limit %d, runtime limit %d; want %d", got, debug.SetMemoryLimit(-1), int64(1<<30+memoryOverhead))
	}
	t.Setenv("GOMEMLIMIT", "3GiB")
	if got := limitMemory(1 << 30); got != 0 {
		t.Fatalf("with GOMEMLIMIT set: limit %d, want the environment's (0)", got)
	}
}
