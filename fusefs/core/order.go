package core

import (
	"errors"
	"syscall"

	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/disk"
)

// localThenShared is the one order of every read of block rel, a load's or
// staging's: the local store first; when it lacks the block (ENOENT) and a
// shared level is set, the shared level, which fetches and verifies the
// block into the store. local is called with nil first and, after a fetch,
// with the bytes the fetch read (nil when a concurrent fetch of the block
// read them), which the caller then owns; a failed fetch is returned as is.
func localThenShared[T any](rel string, level Fetcher, local func(fetched []byte) (T, error)) (T, error) {
	v, err := local(nil)
	if level == nil || !errors.Is(err, syscall.ENOENT) {
		return v, err
	}
	fetched, err := level.Fetch(rel)
	if err != nil {
		var none T
		return none, err
	}
	return local(fetched)
}

// StagingFetch is how staging reads a block ahead (a staging.Fetch): from
// the store or, when only the shared level holds it, from the bytes its
// fetch read and verified (kept locally first), so staging streams a chain
// from the shared store as it does from the disk; the store is read again
// only when a concurrent fetch of the block read them. level is nil
// without a shared level.
func StagingFetch(store *disk.Store, level Fetcher) func(block.Ref) ([]byte, error) {
	return func(ref block.Ref) ([]byte, error) {
		return localThenShared(ref.Rel, level, func(fetched []byte) ([]byte, error) {
			if fetched != nil {
				return fetched, nil
			}
			return store.ReadBlock(ref.Rel)
		})
	}
}
