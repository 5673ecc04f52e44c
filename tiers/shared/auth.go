package shared

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// Everything the level reads back from the shared directory is authenticated
// with HMAC-SHA256 under the key every replica holds (--shared-key-file;
// DESIGN.md "Threat model"): a block's record, each names journal line and
// log name, the eviction lease. A writer to the directory without the key
// can delete and replay what it finds there, but nothing it writes is
// taken for the level's own.

// MinKeyBytes is the shortest key the level takes.
const MinKeyBytes = 16

// maxBlockBytes bounds a block the level fetches: a row larger than the
// loads' budget (core.DefaultMaxBytes) could never be loaded anyway.
const maxBlockBytes = 1 << 30

// Domains keep the tags of different uses apart.
const (
	domainBlock = "kvtierfs shared block v1"
	domainLog   = "kvtierfs shared log v1"
	domainLine  = "kvtierfs shared journal line v1"
	domainLease = "kvtierfs shared lease v1"
)

// tagSize is an HMAC-SHA256 tag's size; sumSize a SHA-256's.
const (
	tagSize = sha256.Size
	sumSize = sha256.Size
)

// sealOverhead is what sealing adds to a block's record: the SHA-256 of its
// bytes and the tag.
const sealOverhead = sumSize + tagSize

// maxSealedRecord bounds a sealed record (xattr or sidecar).
const maxSealedRecord = block.MaxRecordBytes + sealOverhead

// errForged is a record, line or lease whose tag does not verify.
var errForged = errors.New("not authenticated by the shared key")

// tag is the HMAC-SHA256 of parts under the level's key, each part length-prefixed.
func (l *Level) tag(domain string, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, l.cfg.Key)
	writePart(m, []byte(domain))
	for _, p := range parts {
		writePart(m, p)
	}
	return m.Sum(nil)
}

func writePart(h hash.Hash, p []byte) {
	h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(p))))
	h.Write(p)
}

// sealRecord binds a block's record and the SHA-256 of its bytes to its path
// in the shared directory (tier, group, hash): record | sum | tag.
func (l *Level) sealRecord(rel string, rec, sum []byte) []byte {
	out := append(append([]byte{}, rec...), sum...)
	return append(out, l.tag(domainBlock, []byte(rel), rec, sum)...)
}

// openRecord checks a sealed record for the block at rel and returns its
// digest and the SHA-256 its bytes must have.
func (l *Level) openRecord(rel string, name block.Name, sealed []byte) (block.Digest, []byte, error) {
	if len(sealed) <= sealOverhead || len(sealed) > maxSealedRecord {
		return block.Digest{}, nil, fmt.Errorf("sealed record of %d bytes: %w", len(sealed), errForged)
	}
	rec, sum, got := sealed[:len(sealed)-sealOverhead], sealed[len(sealed)-sealOverhead:len(sealed)-tagSize], sealed[len(sealed)-tagSize:]
	if !hmac.Equal(got, l.tag(domainBlock, []byte(rel), rec, sum)) {
		return block.Digest{}, nil, fmt.Errorf("record of %s: %w", rel, errForged)
	}
	d, key, bound, err := block.UnmarshalRecord(rec)
	if err != nil {
		return block.Digest{}, nil, err
	}
	if !bound || key != name.Binding() {
		return block.Digest{}, nil, fmt.Errorf("digest record is bound to %+v, not to this block", key)
	}
	if d.Size <= 0 || d.Size > maxBlockBytes {
		return block.Digest{}, nil, fmt.Errorf("record of a %d-byte block: %w", d.Size, errTooLarge)
	}
	return d, sum, nil
}
