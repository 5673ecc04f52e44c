package shared

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"syscall"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// unique is a part of a name no other writer can have made ahead of this
// node (as a FIFO, a directory, a link): the holder and 64 random bits.
func (l *Level) unique() string {
	var b [8]byte
	rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return l.cfg.Holder + "-" + hex.EncodeToString(b[:])
}

// isNotSupported reports an errno meaning the filesystem keeps no xattrs.
func isNotSupported(err error) bool {
	return errors.Is(err, syscall.ENOTSUP) || errors.Is(err, syscall.EOPNOTSUPP)
}

// put writes a block into the shared directory: its bytes to a tmp file
// beside it, its sealed record (auth.go) in the xattr (or a sidecar written
// first), then the rename that publishes it. Runs on a bound worker.
func (l *Level) put(rel string, name block.Name, data []byte) error {
	rec, err := block.DigestOf(data).MarshalRecord(name.Binding())
	if err != nil {
		return err
	}
	sum := sha256.Sum256(data)
	sealed := l.sealRecord(rel, rec, sum[:])
	if err := l.dir.MkdirAll(path.Dir(rel)); err != nil {
		return err
	}
	// A vLLM-style tmp name: `<h>.bin_<writer>.tmp`.
	tmp := fmt.Sprintf("%s_%s.tmp", rel, l.unique())
	if err := l.dir.WriteFile(tmp, data); err != nil {
		l.dir.Remove(tmp)
		return err
	}
	if err := l.writeRecord(rel, tmp, sealed); err != nil {
		l.dir.Remove(tmp)
		return err
	}
	if err := l.dir.Rename(tmp, rel); err != nil {
		l.dir.Remove(tmp)
		return err
	}
	l.journalAdd(rel, int64(len(data)))
	return nil
}

// writeRecord sets the record on the block's tmp file, or writes the sidecar
// (tmp + rename) when the filesystem refuses xattrs.
func (l *Level) writeRecord(rel, tmp string, rec []byte) error {
	if !l.xattrsRefused.Load() {
		err := l.dir.SetXattr(tmp, recordXattr, rec)
		if err == nil || !isNotSupported(err) {
			return err
		}
		l.xattrsRefused.Store(true)
		l.cfg.Logger.Warn("the shared filesystem keeps no xattrs: block digests go to sidecar files", "dir", l.cfg.Dir, "suffix", sidecarSuffix)
	}
	sideTmp := tmp + sidecarSuffix + "_" + l.unique() + ".tmp"
	if err := l.dir.WriteFile(sideTmp, rec); err != nil {
		l.dir.Remove(sideTmp)
		return err
	}
	if err := l.dir.Rename(sideTmp, rel+sidecarSuffix); err != nil {
		l.dir.Remove(sideTmp)
		return err
	}
	return nil
}

// readRecord reads a shared block's sealed record from its xattr, else its
// sidecar; ok is false when it has neither.
func (l *Level) readRecord(rel string) (rec []byte, ok bool, err error) {
	if !l.xattrsRefused.Load() {
		rec, err := l.dir.GetXattr(rel, recordXattr)
		switch {
		case err == nil:
			return rec, true, nil
		case errors.Is(err, syscall.ENOENT):
			return nil, false, err
		case !isNotSupported(err) && !errors.Is(err, syscall.ENODATA):
			return nil, false, err
		}
	}
	rec, err = l.dir.ReadFile(rel+sidecarSuffix, maxSealedRecord)
	if errors.Is(err, syscall.ENOENT) {
		return nil, false, nil
	}
	return rec, err == nil, err
}

// verify checks a fetched block (its size, the CRC32C and the SHA-256
// computed while it was read) against its opened record.
func verify(d block.Digest, size int64, crc uint32, sum, want []byte) error {
	if size != d.Size {
		return fmt.Errorf("%d bytes, the record covers %d", size, d.Size)
	}
	if crc != d.CRC {
		return fmt.Errorf("crc32c %08x, recorded %08x", crc, d.CRC)
	}
	if !bytes.Equal(sum, want) {
		return fmt.Errorf("sha-256 %x, recorded %x", sum, want)
	}
	return nil
}

// authentic reports whether the block at rel carries a record the key
// authenticates, of size bytes; under the bound.
func (l *Level) authentic(rel string, name block.Name, size int64) bool {
	ok, _ := call(l.bound, func() (bool, error) {
		sealed, found, err := l.readRecord(rel)
		if err != nil || !found {
			return false, err
		}
		d, _, err := l.openRecord(rel, name, sealed)
		return err == nil && d.Size == size, nil
	})
	return ok
}
