//go:build kvtierfs_liar

package rowsync

// ackCRCFlip makes a daemon built with -tags kvtierfs_liar acknowledge every
// row it receives with a wrong CRC32C (it still writes the row): the lying
// peer of the multi-node fault tests (integration/multinode). No release is
// built with this tag.
const ackCRCFlip = 1
