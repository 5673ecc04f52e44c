// Package block is what every part of kvtierfs agrees a KV block is, with no
// dependency on any of them: its name in the engine's tier layout (parsed and
// built, name.go), its digest and the record of it kept beside the block's
// bytes (digest.go, record.go), the CRC32C that proves the bytes (crc.go), and
// the page that sizes blocks and finds their zero runs (pages.go).
//
// The store (tiers/disk), the regions (tiers/shm), staging, mirroring
// (sync/rowsync) and the load path (fusefs/core) import it; the FUSE adapter
// parses a path once (Parse) and hands the typed Name on.
package block
