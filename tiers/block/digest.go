package block

import "encoding/binary"

// Digest identifies a block's bytes without holding them: its size, its
// CRC32C, the CRC32C of each of its chunks (chunks.go) and a few sampled
// 8-byte windows. The samples find the rows of a region that may hold the
// block; the CRCs prove it, chunk by chunk. Chunks is nil for a block whose
// record predates them or that has more than MaxChunks: it is proven whole.
type Digest struct {
	Size    int64
	CRC     uint32
	Chunks  []uint32
	Samples []Sample
}

// Sample is the 8 bytes (little endian) of a block at an offset.
type Sample struct {
	Off   uint32
	Value uint64
}

const (
	// probeWindows is how many evenly spread windows are read to pick samples.
	probeWindows = 64
	// maxSamples is how many windows a digest keeps.
	maxSamples = 8
)

// NewDigest samples a block of size bytes whose CRCs sum summed, reading
// windows through readAt. Samples favour non-zero windows, so that they tell
// rows apart even when most of a row is zero (the slots of other nodes).
func NewDigest(sum *Sum, readAt func(off int64) (uint64, error)) (Digest, error) {
	size := sum.Len()
	d := Digest{Size: size, CRC: sum.CRC(), Chunks: sum.Chunks()}
	if size < 8 {
		return d, nil
	}
	var all, nonZero []Sample
	for _, off := range ProbeOffsets(size) {
		v, err := readAt(off)
		if err != nil {
			return d, err
		}
		s := Sample{Off: uint32(off), Value: v}
		all = append(all, s)
		if v != 0 {
			nonZero = append(nonZero, s)
		}
	}
	pool := all
	if len(nonZero) > 0 {
		pool = nonZero
	}
	k := min(maxSamples, len(pool))
	for j := range k {
		d.Samples = append(d.Samples, pool[j*len(pool)/k])
	}
	return d, nil
}

// ProbeOffsets lists the windows NewDigest reads for a block of size bytes,
// so that a writer can capture them as the bytes stream past.
func ProbeOffsets(size int64) []int64 {
	if size < 8 {
		return nil
	}
	var out []int64
	for i := range probeWindows {
		off := (size - 8) * int64(i) / (probeWindows - 1) &^ 7
		if len(out) == 0 || out[len(out)-1] != off {
			out = append(out, off)
		}
	}
	return out
}

// DigestOf computes the digest of bytes in memory.
func DigestOf(p []byte) Digest {
	var sum Sum
	sum.Write(p)
	d, _ := NewDigest(&sum, func(off int64) (uint64, error) {
		return binary.LittleEndian.Uint64(p[off:]), nil
	})
	return d
}

// SamplesMatch reports whether row has the digest's size and agrees with
// every sample: a row that may hold the block, for the CRC to prove.
func (d Digest) SamplesMatch(row []byte) bool {
	if int64(len(row)) != d.Size {
		return false
	}
	for _, s := range d.Samples {
		if binary.LittleEndian.Uint64(row[s.Off:]) != s.Value {
			return false
		}
	}
	return true
}
