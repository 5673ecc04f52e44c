package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Digest identifies a block's bytes without holding them: its size, its
// CRC32C and a few sampled 8-byte windows. The samples find the rows of a
// region that may hold the block; the CRC proves it.
type Digest struct {
	Size    int64
	CRC     uint32
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
	// maxCandidates bounds the rows checksummed for one block: a block whose
	// samples match more rows than this (an all-zero block) is not identified.
	maxCandidates = 4
)

// castagnoli is the CRC32C table, hardware accelerated by the standard library.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C is the checksum used throughout the store.
func CRC32C(p []byte) uint32 { return crc32.Checksum(p, castagnoli) }

// NewDigest samples a block of size bytes with checksum crc, reading windows
// through readAt. Samples favour non-zero windows, so that they tell rows
// apart even when most of a row is zero (the slots of other nodes).
func NewDigest(size int64, crc uint32, readAt func(off int64) (uint64, error)) (Digest, error) {
	d := Digest{Size: size, CRC: crc}
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
	d, _ := NewDigest(int64(len(p)), CRC32C(p), func(off int64) (uint64, error) {
		return binary.LittleEndian.Uint64(p[off:]), nil
	})
	return d
}

// samplesMatch reports whether row agrees with every sample.
func (d Digest) samplesMatch(row []byte) bool {
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

// MarshalBinary encodes the digest: size (8), crc (4), count (1), then
// offset (4) and value (8) per sample, big endian.
func (d Digest) MarshalBinary() ([]byte, error) {
	b := binary.BigEndian.AppendUint64(nil, uint64(d.Size))
	b = binary.BigEndian.AppendUint32(b, d.CRC)
	b = append(b, byte(len(d.Samples)))
	for _, s := range d.Samples {
		b = binary.BigEndian.AppendUint32(b, s.Off)
		b = binary.BigEndian.AppendUint64(b, s.Value)
	}
	return b, nil
}

// UnmarshalBinary decodes MarshalBinary's encoding, rejecting anything malformed.
func (d *Digest) UnmarshalBinary(b []byte) error {
	if len(b) < 13 {
		return errors.New("digest record too short")
	}
	n := int(b[12])
	if n > maxSamples || len(b) != 13+12*n {
		return fmt.Errorf("digest record of %d bytes with %d samples is malformed", len(b), n)
	}
	d.Size = int64(binary.BigEndian.Uint64(b))
	d.CRC = binary.BigEndian.Uint32(b[8:])
	d.Samples = make([]Sample, n)
	for i := range n {
		p := b[13+12*i:]
		d.Samples[i] = Sample{Off: binary.BigEndian.Uint32(p), Value: binary.BigEndian.Uint64(p[4:])}
		if d.Size < 8 || int64(d.Samples[i].Off) > d.Size-8 {
			return fmt.Errorf("digest sample offset %d outside a %d-byte block", d.Samples[i].Off, d.Size)
		}
	}
	return nil
}
