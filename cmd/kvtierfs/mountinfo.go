package main

import (
	"path/filepath"

	"github.com/kvtierfs/kvtierfs/fusefs/mountinfo"
)

// findMount returns the topmost mount at dir, or nil (it sees stale FUSE
// mounts that stat cannot reach).
func findMount(dir string) (*mountinfo.Mount, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	mounts, err := mountinfo.Read("self")
	if err != nil {
		return nil, err
	}
	at := mountinfo.At(mounts, abs)
	if len(at) == 0 {
		return nil, nil
	}
	return &at[len(at)-1], nil
}
