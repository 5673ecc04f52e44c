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

// Digest records (the store's xattr beside each block). Two formats exist:
//
//	v1 (unbound, written before the record named its block):
//	    size (8) | crc (4) | count (1) | count × (offset (4) | value (8))
//	v2 (bound to its block's name, written now):
//	    0x02 | group (8) | hash length (1) | hash (lowercase hex) | v1 body
//
// All integers are big endian. A v1 record starts with the top byte of the
// size, which is 0 for any real block, so the first byte tells them apart.
const (
	recordV2 = 0x02
	// v1BodyMin is the size of a v1 body with no sample.
	v1BodyMin = 13
	// maxKeyHash bounds the hash a v2 record names (the longest block name).
	maxKeyHash = 128
	// MaxRecordBytes bounds the encoding of any record.
	MaxRecordBytes = 1 + 8 + 1 + maxKeyHash + v1BodyMin + 12*maxSamples
)

// Key is the block a digest record belongs to: its KV group and its hash, as
// the block's name spells them. Binding the record to the name means a block
// file replaced by another block's bytes and record is refused.
type Key struct {
	Group uint64
	Hash  string
}

// MarshalRecord encodes the digest as a v2 record bound to key.
func (d Digest) MarshalRecord(key Key) ([]byte, error) {
	if key.Hash == "" || len(key.Hash) > maxKeyHash {
		return nil, fmt.Errorf("digest record for hash %q: want 1 to %d characters", key.Hash, maxKeyHash)
	}
	if len(d.Samples) > maxSamples {
		return nil, fmt.Errorf("digest with %d samples, at most %d", len(d.Samples), maxSamples)
	}
	b := []byte{recordV2}
	b = binary.BigEndian.AppendUint64(b, key.Group)
	b = append(b, byte(len(key.Hash)))
	b = append(b, key.Hash...)
	return d.appendV1(b), nil
}

// UnmarshalRecord decodes a record of either format. bound is false for a v1
// record, which names no block (key is then zero).
func UnmarshalRecord(b []byte) (d Digest, key Key, bound bool, err error) {
	if len(b) == 0 {
		return Digest{}, Key{}, false, errors.New("digest record is empty")
	}
	if b[0] != recordV2 {
		err = d.decodeV1(b)
		return d, Key{}, false, err
	}
	if len(b) < 10 {
		return Digest{}, Key{}, false, fmt.Errorf("digest record of %d bytes is too short for its key", len(b))
	}
	key.Group = binary.BigEndian.Uint64(b[1:])
	n := int(b[9])
	if n == 0 || n > maxKeyHash || len(b) < 10+n {
		return Digest{}, Key{}, false, fmt.Errorf("digest record of %d bytes names a hash of %d bytes", len(b), n)
	}
	key.Hash = string(b[10 : 10+n])
	if err := d.decodeV1(b[10+n:]); err != nil {
		return Digest{}, Key{}, false, err
	}
	return d, key, true, nil
}

// appendV1 appends the v1 encoding of the digest to b.
func (d Digest) appendV1(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(d.Size))
	b = binary.BigEndian.AppendUint32(b, d.CRC)
	b = append(b, byte(len(d.Samples)))
	for _, s := range d.Samples {
		b = binary.BigEndian.AppendUint32(b, s.Off)
		b = binary.BigEndian.AppendUint64(b, s.Value)
	}
	return b
}

// decodeV1 decodes a v1 body, rejecting anything malformed.
func (d *Digest) decodeV1(b []byte) error {
	if len(b) < v1BodyMin {
		return errors.New("digest record too short")
	}
	n := int(b[12])
	if n > maxSamples || len(b) != v1BodyMin+12*n {
		return fmt.Errorf("digest record of %d bytes with %d samples is malformed", len(b), n)
	}
	size := binary.BigEndian.Uint64(b)
	if size > 1<<56-1 {
		return fmt.Errorf("digest record of a %d-byte block is malformed", size)
	}
	d.Size = int64(size)
	d.CRC = binary.BigEndian.Uint32(b[8:])
	d.Samples = make([]Sample, n)
	for i := range n {
		p := b[v1BodyMin+12*i:]
		d.Samples[i] = Sample{Off: binary.BigEndian.Uint32(p), Value: binary.BigEndian.Uint64(p[4:])}
		if d.Size < 8 || int64(d.Samples[i].Off) > d.Size-8 {
			return fmt.Errorf("digest sample offset %d outside a %d-byte block", d.Samples[i].Off, d.Size)
		}
	}
	return nil
}
