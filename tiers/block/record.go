package block

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// RecordXattr is the xattr that holds a block's digest record beside its
// bytes, so the bytes of the block file are exactly the engine's row.
const RecordXattr = "user.kvtierfs.crc32c"

// ReservedXattrPrefix is the xattr namespace the store owns; the mount hides it.
const ReservedXattrPrefix = "user.kvtierfs."

// VLLMChecksumXattr is the CRC32C vLLM itself may set on a block's tmp file
// before the rename (opt-in, vLLM PR #57912).
const VLLMChecksumXattr = "user.vllm.kv_crc32c"

// Digest records (RecordXattr). Four formats were shipped:
//
//	v0 (the first release only; refused now, so its blocks are unproven):
//	    crc (4) | size (8)
//	v1 (unbound, written before the record named its block):
//	    size (8) | crc (4) | count (1) | count × (offset (4) | value (8))
//	v2 (bound to its block's group and hash):
//	    0x02 | group (8) | hash length (1) | hash (lowercase hex) | v1 body
//	v3 (bound to its tier too, with the chunk CRCs; written now):
//	    0x03 | group (8) | hash length (1) | hash | tier length (1) | tier |
//	    v1 body | chunk count (2) | count × chunk crc (4)
//
// All integers are big endian. A v1 record starts with the top byte of the
// size, which is 0 for any real block, so the first byte tells them apart. A
// v3 record's chunk count is 0 (no chunk CRCs) or the block's ChunkCount, and
// its chunk CRCs combine to its CRC.
const (
	recordV2 = 0x02
	recordV3 = 0x03
	// v1BodyMin is the size of a v1 body with no sample.
	v1BodyMin = 13
	// maxTierLen is the longest tier directory name.
	maxTierLen = 255
	// MaxRecordBytes bounds the encoding of any record.
	MaxRecordBytes = 1 + 8 + 1 + MaxHashLen + 1 + maxTierLen + v1BodyMin + 12*maxSamples + 2 + 4*MaxChunks
)

// Binding is the block a digest record belongs to: its tier (the
// `<model>_<digest>_r<rank>` directory, opaque), its KV group and its hash, as
// the block's name spells them. Binding the record to the name means a block
// file replaced by another block's bytes and record, or copied with its
// record from another tier (another rank's), is refused. Tier is empty for a
// v2 record, which predates the tier binding.
type Binding struct {
	Tier  string
	Group uint64
	Hash  string
}

// Binding is the binding of the name's digest record.
func (n Name) Binding() Binding {
	return Binding{Tier: n.Tier, Group: uint64(n.Group), Hash: n.Hash}
}

// Fits reports whether a record bound to b belongs to the block named n: the
// same hash and group, and the same tier unless the record predates the tier
// binding (v2), which the reader then binds to the tier it found it under.
func (b Binding) Fits(n Name) bool {
	return b.Hash == n.Hash && b.Group == uint64(n.Group) && (b.Tier == "" || b.Tier == n.Tier)
}

// MarshalRecord encodes the digest as a v3 record bound to b.
func (d Digest) MarshalRecord(b Binding) ([]byte, error) {
	if b.Hash == "" || len(b.Hash) > MaxHashLen {
		return nil, fmt.Errorf("digest record for hash %q: want 1 to %d characters", b.Hash, MaxHashLen)
	}
	if b.Tier == "" || len(b.Tier) > maxTierLen {
		return nil, fmt.Errorf("digest record for tier %q: want 1 to %d bytes", b.Tier, maxTierLen)
	}
	if len(d.Samples) > maxSamples {
		return nil, fmt.Errorf("digest with %d samples, at most %d", len(d.Samples), maxSamples)
	}
	if err := d.checkChunks(); err != nil {
		return nil, err
	}
	rec := []byte{recordV3}
	rec = binary.BigEndian.AppendUint64(rec, b.Group)
	rec = append(rec, byte(len(b.Hash)))
	rec = append(rec, b.Hash...)
	rec = append(rec, byte(len(b.Tier)))
	rec = append(rec, b.Tier...)
	rec = d.appendV1(rec)
	rec = binary.BigEndian.AppendUint16(rec, uint16(len(d.Chunks)))
	for _, c := range d.Chunks {
		rec = binary.BigEndian.AppendUint32(rec, c)
	}
	return rec, nil
}

// UnmarshalRecord decodes a v1, v2 or v3 record. bound is false for a v1
// record, which names no block (b is then zero).
func UnmarshalRecord(rec []byte) (d Digest, b Binding, bound bool, err error) {
	if len(rec) == 0 {
		return Digest{}, Binding{}, false, errors.New("digest record is empty")
	}
	version := rec[0]
	if version != recordV2 && version != recordV3 {
		err = d.decodeV1(rec)
		return d, Binding{}, false, err
	}
	rest, ok := rec[1:], false
	var group []byte
	if group, rest, ok = take(rest, 8); !ok {
		return Digest{}, Binding{}, false, fmt.Errorf("digest record of %d bytes is too short for its key", len(rec))
	}
	b.Group = binary.BigEndian.Uint64(group)
	if b.Hash, rest, ok = takeString(rest, MaxHashLen); !ok {
		return Digest{}, Binding{}, false, fmt.Errorf("digest record of %d bytes names no hash of 1 to %d bytes", len(rec), MaxHashLen)
	}
	if version == recordV2 {
		if err := d.decodeV1(rest); err != nil {
			return Digest{}, Binding{}, false, err
		}
		return d, b, true, nil
	}
	if b.Tier, rest, ok = takeString(rest, maxTierLen); !ok {
		return Digest{}, Binding{}, false, fmt.Errorf("digest record of %d bytes names no tier", len(rec))
	}
	if len(rest) < v1BodyMin+2 {
		return Digest{}, Binding{}, false, errors.New("digest record too short")
	}
	body := v1BodyMin + 12*int(rest[12])
	if len(rest) < body+2 {
		return Digest{}, Binding{}, false, errors.New("digest record too short for its samples")
	}
	if err := d.decodeV1(rest[:body]); err != nil {
		return Digest{}, Binding{}, false, err
	}
	rest = rest[body:]
	n := int(binary.BigEndian.Uint16(rest))
	if len(rest) != 2+4*n {
		return Digest{}, Binding{}, false, fmt.Errorf("digest record with %d chunk CRCs has %d bytes for them", n, len(rest)-2)
	}
	if n > 0 {
		d.Chunks = make([]uint32, n)
		for i := range d.Chunks {
			d.Chunks[i] = binary.BigEndian.Uint32(rest[2+4*i:])
		}
	}
	if err := d.checkChunks(); err != nil {
		return Digest{}, Binding{}, false, err
	}
	return d, b, true, nil
}

// checkChunks refuses chunk CRCs that do not cover the block or do not
// combine to its CRC.
func (d Digest) checkChunks() error {
	if len(d.Chunks) == 0 {
		return nil
	}
	if n := ChunkCount(d.Size); len(d.Chunks) != n || n > MaxChunks {
		return fmt.Errorf("%d chunk CRCs for a %d-byte block", len(d.Chunks), d.Size)
	}
	var crc uint32
	for i, c := range d.Chunks {
		crc = CombineCRC32C(crc, c, min(ChunkSize, d.Size-int64(i)*ChunkSize))
	}
	if crc != d.CRC {
		return fmt.Errorf("chunk CRCs combine to %08x, the block's CRC32C is %08x", crc, d.CRC)
	}
	return nil
}

// take splits n bytes off p.
func take(p []byte, n int) (head, rest []byte, ok bool) {
	if len(p) < n {
		return nil, p, false
	}
	return p[:n], p[n:], true
}

// takeString splits a string of 1 to maxLen bytes, after its length byte, off p.
func takeString(p []byte, maxLen int) (s string, rest []byte, ok bool) {
	if len(p) == 0 {
		return "", p, false
	}
	n := int(p[0])
	if n == 0 || n > maxLen || len(p) < 1+n {
		return "", p, false
	}
	return string(p[1 : 1+n]), p[1+n:], true
}

// appendV1 appends the v1 encoding of the digest to rec.
func (d Digest) appendV1(rec []byte) []byte {
	rec = binary.BigEndian.AppendUint64(rec, uint64(d.Size))
	rec = binary.BigEndian.AppendUint32(rec, d.CRC)
	rec = append(rec, byte(len(d.Samples)))
	for _, s := range d.Samples {
		rec = binary.BigEndian.AppendUint32(rec, s.Off)
		rec = binary.BigEndian.AppendUint64(rec, s.Value)
	}
	return rec
}

// decodeV1 decodes a v1 body, rejecting anything malformed.
func (d *Digest) decodeV1(rec []byte) error {
	if len(rec) < v1BodyMin {
		return errors.New("digest record too short")
	}
	n := int(rec[12])
	if n > maxSamples || len(rec) != v1BodyMin+12*n {
		return fmt.Errorf("digest record of %d bytes with %d samples is malformed", len(rec), n)
	}
	size := binary.BigEndian.Uint64(rec)
	if size > 1<<56-1 {
		return fmt.Errorf("digest record of a %d-byte block is malformed", size)
	}
	d.Size = int64(size)
	d.CRC = binary.BigEndian.Uint32(rec[8:])
	d.Samples = make([]Sample, n)
	for i := range n {
		p := rec[v1BodyMin+12*i:]
		d.Samples[i] = Sample{Off: binary.BigEndian.Uint32(p), Value: binary.BigEndian.Uint64(p[4:])}
		if d.Size < 8 || int64(d.Samples[i].Off) > d.Size-8 {
			return fmt.Errorf("digest sample offset %d outside a %d-byte block", d.Samples[i].Off, d.Size)
		}
	}
	return nil
}

// ParseVLLMChecksum decodes a VLLMChecksumXattr value: the CRC32C of the
// block as four big-endian bytes, as vLLM PR #57912 writes it (io.py
// _store_block: crc32c(view).to_bytes(4, "big")) and checks it at a load
// (io.py _verify_checksum: a value of any other length is a mismatch).
func ParseVLLMChecksum(b []byte) (uint32, error) {
	if len(b) != 4 {
		return 0, fmt.Errorf("%s holds %d bytes; vLLM writes the CRC32C as 4 big-endian bytes", VLLMChecksumXattr, len(b))
	}
	return binary.BigEndian.Uint32(b), nil
}
