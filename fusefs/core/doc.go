// Package core is the part of kvtierfs that decides, free of FUSE: what a
// block load must do before the engine may see its bytes. fusefs translates
// the kernel's requests into calls here and the answers back.
//
// The engine (DESIGN.md §2 of the shared design) sees the result of open()
// and of its one read of a row; it may ignore what close() returns. So a load
// is proven where the engine looks:
//
//   - Loads.Open pins the block and gets its bytes: from a row of the
//     engine's region that still holds the block (no disk read) or from
//     staging, both verified against the block's digest, or by starting a
//     read of the store that goes on after Open returns.
//   - Load.Read serves the bytes of one read request from that buffer once
//     they landed. The request that reaches the end of the block waits until
//     the whole block matched its digest; a block that does not is dropped
//     and that request fails (EIO), so the engine's read fails. On a
//     multi-node group the row the delivered requests landed in is found
//     while the read goes on and mirrored to every peer in the background;
//     the request that reaches the end returns only once every peer
//     acknowledged it. A peer that fails, stalls or answers another checksum
//     fails the read (EIO).
//   - Load.Flush repeats any failure for engines that honour close errors and
//     checks again that a mirrored row holds the block.
//   - Load.Release unpins the block and recycles its buffer.
//
// A load runs:
//
//	ref, _ := block.ParseRef("model_0123456789ab_r0/3fa/9c_g0/3fa9….bin")
//	l, err := loads.Open(ctx, ref)
//	data, err := l.Read(ctx, 0, 4<<20) // reply with data, then:
//	l.Delivered(0, int64(len(data)))
//	…
//	err = l.Flush() // the engine's close()
//	l.Release()     // the kernel's RELEASE
package core
