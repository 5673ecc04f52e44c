package fusefs

import (
	"context"
	"errors"

	"github.com/kvtierfs/kvtierfs/fusefs/core"
	"github.com/kvtierfs/kvtierfs/sync/rowsync"
)

// rowMirror is the peers as loads reach them; nil on a single node.
func (f *FS) rowMirror() core.Mirror {
	if f.sync == nil {
		return nil
	}
	return rowsync.NewLoadMirror(f.sync, f.syncRegions)
}

// sampleStore lets the replication gate compare a stored block's source row
// with the same row on every peer, while the engine still holds the row.
func (f *FS) sampleStore(ctx context.Context, rel string) {
	switch err := f.sampler.Sample(ctx, rel); {
	case errors.Is(err, rowsync.ErrSourceRowNotFound):
		f.logger.Debug("store not sampled: its source row was not found", "path", rel)
	case err != nil:
		f.logger.Warn("store sample for the replication gate failed", "path", rel, "err", err)
	}
}
