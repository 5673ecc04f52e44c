// Package rowsync keeps the engine's shm rows identical across the nodes of a
// tensor-parallel group when the disk tier promotes a block into one node's
// region (DESIGN.md §3, failure 2). It is the FUSE-free part of the sync layer
// (sync/): the filesystem calls it at a few points and maps its errors.
//
// The filesystem's call sequence, with n from Start:
//
//	lookup of a block:    answer "absent" unless n.ServeLoads()
//	rename of a store:    if n.WantStoreSample(), find the source row and
//	                      n.SampleStoredRow(ctx, region, row, key, crc); log an error, never fail
//	last READ of a load:  find the row the earlier READs filled, then
//	                      if n.MirrorBlock(ctx, region, row, block, crc, runs) != nil, fail the READ with EIO
//	stat and metrics:     n.Snapshot()
//
// MirrorBlock sends the verified block's non-zero pages to every peer's Server,
// which writes them into the same row of its own region, and returns nil
// only when every peer acknowledged the CRC32C of the whole row. Mirroring
// happens only while the replication Gate allows it, since copying a row is
// right only when KV is replicated across ranks (MLA).
//
// Peers authenticate each other with a Noise handshake keyed by the shared
// secret, which binds each node's identity and the direction of the
// connection (see auth.go); every frame after it (see wire.go) travels
// sealed in AES-GCM records (see channel.go), a row's bytes in records
// sealed once for every peer under a key of the row's own. A Server writes a row only
// once all of it has arrived and authenticated, and only at this node's own
// row size.
//
// Locking. A Region has no lock: its rows are shared memory that the engine
// writes from other processes, so every answer is read from the mapping
// anew. Counters are atomics. Gate.mu guards the gate's evidence. In a
// Mirror, peer.mu guards the peer's connection and state and is taken before
// link.mu, which guards a connection's pending requests and failure;
// link.writeMu serializes frames on the connection (the sending half of its
// channel) and is held for one whole frame, never together with the other
// two; the goroutine reading acknowledgements owns the receiving half.
// Server.mu guards the sets of connections and sessions and the inbound
// counters, and is never held while reading or writing a connection or
// waiting for a superseded one; rowGeometry.mu guards the accepted row size
// alone.
package rowsync
