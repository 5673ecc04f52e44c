//go:build !kvtierfs_liar

package rowsync

// ackCRCFlip is XORed into the CRC32C of every row a Server acknowledges:
// zero, except in a build with the tag kvtierfs_liar (liar_on.go).
const ackCRCFlip = 0
