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

// Digest records (RecordXattr). Three formats were shipped:
//
//	v0 (the first release only; refused now, so its blocks are unproven):
//	    crc (4) | size (8)
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
	// MaxRecordBytes bounds the encoding of any record.
	MaxRecordBytes = 1 + 8 + 1 + MaxHashLen + v1BodyMin + 12*maxSamples
)

// Binding is the block a digest record belongs to: its KV group and its
// hash, as the block's name spells them. Binding the record to the name means
// a block file replaced by another block's bytes and record is refused.
type Binding struct {
	Group uint64
	Hash  string
}

// Binding is the binding of the name's digest record.
func (n Name) Binding() Binding { return Binding{Group: uint64(n.Group), Hash: n.Hash} }

// MarshalRecord encodes the digest as a v2 record bound to b.
func (d Digest) MarshalRecord(b Binding) ([]byte, error) {
	if b.Hash == "" || len(b.Hash) > MaxHashLen {
		return nil, fmt.Errorf("digest record for hash %q: want 1 to %d characters", b.Hash, MaxHashLen)
	}
	if len(d.Samples) > maxSamples {
		return nil, fmt.Errorf("digest with %d samples, at most %d", len(d.Samples), maxSamples)
	}
	rec := []byte{recordV2}
	rec = binary.BigEndian.AppendUint64(rec, b.Group)
	rec = append(rec, byte(len(b.Hash)))
	rec = append(rec, b.Hash...)
	return d.appendV1(rec), nil
}

// UnmarshalRecord decodes a v1 or v2 record. bound is false for a v1 record,
// which names no block (b is then zero).
func UnmarshalRecord(rec []byte) (d Digest, b Binding, bound bool, err error) {
	if len(rec) == 0 {
		return Digest{}, Binding{}, false, errors.New("digest record is empty")
	}
	if rec[0] != recordV2 {
		err = d.decodeV1(rec)
		return d, Binding{}, false, err
	}
	if len(rec) < 10 {
		return Digest{}, Binding{}, false, fmt.Errorf("digest record of %d bytes is too short for its key", len(rec))
	}
	b.Group = binary.BigEndian.Uint64(rec[1:])
	n := int(rec[9])
	if n == 0 || n > MaxHashLen || len(rec) < 10+n {
		return Digest{}, Binding{}, false, fmt.Errorf("digest record of %d bytes names a hash of %d bytes", len(rec), n)
	}
	b.Hash = string(rec[10 : 10+n])
	if err := d.decodeV1(rec[10+n:]); err != nil {
		return Digest{}, Binding{}, false, err
	}
	return d, b, true, nil
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
