package disk

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// This file is a block's publication (DESIGN.md "The store"), within the
// engine's RENAME. A tmp written through the daemon is recorded, then
// placed: its digest (summed as the daemon wrote it) checked against vLLM's
// CRC32C xattr and recorded on the tmp, then the tmp renamed in the store
// and indexed, proven from the start. A passthrough tmp is placed, then
// proven: it checks the tmp holds a whole row, marks the file pending,
// renames it in the store and indexes it; then it learns the block's digest
// (from the engine's row, which the engine leaves alone until its rename
// returns, or from the file), checks vLLM's CRC32C xattr, records the digest
// and clears the mark, and only then replies. A load that finds the block
// meanwhile waits for the proof (PinBlock, Digest); a block whose proof
// fails is dropped before any load reads it, and its rename fails.

// pendingXattr marks a block file renamed into place whose digest is not
// recorded yet. It holds the kernel's boot id and the block's store-relative
// name (pendingMark): at the next mount, a marked file of the same boot at
// that name still holds what was written (only the daemon stopped), so its
// digest is taken from its bytes; a marked file of an earlier boot may have
// been torn by the machine's crash, and one found under another name (copied
// with its xattrs, say into another rank's tier) was never written for it:
// both are left unproven.
const pendingXattr = block.ReservedXattrPrefix + "pending"

// bootIDPath holds the kernel's random id of the current boot.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// readBootID reads the current boot's id; an error leaves it empty, and
// then no pending mark is ever taken for this boot's.
func readBootID() []byte {
	id, err := os.ReadFile(bootIDPath)
	if err != nil {
		return nil
	}
	return bytes.TrimSpace(id)
}

// proof is the outcome of a block's proof: done is closed once err is set
// (nil when the block's digest is recorded).
type proof struct {
	done chan struct{}
	err  error
}

// Publish renames a tmp file over its block atomically, indexes it, and
// proves and records its digest (prove) before it returns; a load that
// finds the block meanwhile waits for that. Readers see the whole old
// block, the whole new one, or ENOENT. A block whose proof fails is gone
// when Publish returns its error (EIO for bytes that disagree with vLLM's
// CRC32C xattr, as vLLM's own load would have found).
//
// It works on the descriptor the tmp was written through, never on what the
// tmp's name points to now: the rename (within the block's directory, opened
// without following links) happens only while the tmp's name names that
// same file, checked again after the rename. A tmp swapped for a link or
// another file is refused, and whatever was renamed in its place is removed.
func (s *Store) Publish(tmpRel, destRel string) error {
	b, err := s.publish(tmpRel, destRel)
	if err != nil {
		return err
	}
	s.tell(Event{Kind: Published, Rel: destRel, Size: b.size})
	return nil
}

// publish is Publish without telling the listeners.
func (s *Store) publish(tmpRel, destRel string) (*entry, error) {
	t, name, err := s.publishedTmp(tmpRel, destRel)
	if err != nil {
		return nil, err
	}
	phase := time.Now()
	if err := t.awaitRelease(tmpRel); err != nil {
		return nil, err
	}
	s.TimePhase(PhaseReleaseWait, phase)
	t.mu.Lock()
	f, unmarked, err := t.wholeRow(tmpRel)
	if err != nil {
		t.mu.Unlock()
		return nil, err
	}
	recorded := s.recordBeforeRename(t, f, name)
	b, err := s.place(t, f, unmarked, tmpRel, destRel, name, recorded)
	if err != nil {
		t.mu.Unlock()
		return nil, err
	}
	if recorded != nil {
		stored := t.storedMapping(b.size)
		s.mu.Lock()
		s.retireTmpLocked(t, b, stored, true)
		s.mu.Unlock()
		t.mu.Unlock()
		return b, nil
	}
	// The proof releases the tmp's mutex.
	s.prove(t, b)
	if err := b.proof.err; err != nil {
		return nil, refusal(tmpRel, err)
	}
	return b, nil
}

// refusal is the rename's error for a proof that failed: bytes vLLM's
// loader would refuse are EIO.
func refusal(tmpRel string, err error) error {
	var mismatch *vllmMismatch
	var malformed *vllmMalformed
	switch {
	case errors.As(err, &mismatch):
		return newError("rename", tmpRel, syscall.EIO, "%v: not published", err)
	case errors.As(err, &malformed):
		return newError("rename", tmpRel, syscall.EIO, "%v: not published (vLLM's loader would refuse it)", err)
	}
	return err
}

// Size is an indexed block's size, known from its placement on: unlike
// Digest it does not wait for the block's proof.
func (s *Store) Size(rel string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.blocks[rel]
	if b == nil {
		return 0, false
	}
	return b.size, true
}

// publishedTmp checks the names of a publication and finds the tmp it publishes.
func (s *Store) publishedTmp(tmpRel, destRel string) (*tmpFile, block.Name, error) {
	kind, name := block.Parse(destRel)
	if kind != block.File {
		return nil, name, newError("rename", destRel, syscall.EINVAL, "not a block name")
	}
	if path.Dir(tmpRel) != path.Dir(destRel) {
		return nil, name, newError("rename", tmpRel, syscall.EXDEV,
			"a block is published from a tmp file in its own directory, not from %s", path.Dir(tmpRel))
	}
	s.mu.Lock()
	t, ok := s.tmps[tmpRel]
	s.mu.Unlock()
	if !ok {
		return nil, name, newError("rename", tmpRel, syscall.EINVAL, "not a tmp file written through this mount")
	}
	return t, name, nil
}

// recordBeforeRename records the digest of a tmp written through the
// daemon on the tmp itself, before its rename: the daemon summed the bytes
// it wrote, so nothing is left to prove once the block has its name, and it
// is placed proven (no pending mark, no proof after the rename). nil leaves
// the block to be placed pending and proven after its rename: a passthrough
// tmp, or a digest or record that failed here (the proof then fails alike
// and drops the block, as a refusal at the rename does). The caller holds
// t.mu.
func (s *Store) recordBeforeRename(t *tmpFile, f *os.File, name block.Name) *block.Digest {
	if t.passthrough {
		return nil
	}
	d, _, err := s.digestOf(t, f)
	if err != nil {
		return nil
	}
	phase := time.Now()
	defer s.TimePhase(PhaseRecord, phase)
	if err := writeDigest(f, name, d); err != nil {
		return nil
	}
	return &d
}

// place renames a released tmp (f, allocating unmarked, from wholeRow) over
// its block and indexes the block: proven, when its digest was recorded
// before (recordBeforeRename), else pending its proof. The caller holds
// t.mu.
func (s *Store) place(t *tmpFile, f *os.File, unmarked int64, tmpRel, destRel string, name block.Name, recorded *block.Digest) (*entry, error) {
	physical, err := s.physicalAtRename(f, unmarked, destRel, recorded != nil)
	if err != nil {
		return nil, err
	}
	phase := time.Now()
	defer s.TimePhase(PhaseRenameat, phase)
	dirfd, err := s.openDir(destRel)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dirfd)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fitsLocked(t, tmpRel, destRel, name, physical); err != nil {
		return nil, err
	}
	if err := s.renameLocked(t, dirfd, tmpRel, destRel); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	var seen fileState
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		s.cfg.Logger.Warn("reading a published block's times", "path", s.Path(destRel), "err", err)
	} else {
		seen = stateOf(&st)
	}
	// Sealed, the tmp takes no more bytes: what it held is the block's now,
	// even if its writer has not closed it yet.
	t.sealed = true
	if _, had := s.tmps[tmpRel]; had {
		s.countUnderLocked(tmpRel, -1)
	}
	delete(s.tmps, tmpRel)
	t.untracked = true
	s.used -= t.allocated
	b := &entry{rel: destRel, name: name, size: t.size, physical: physical, times: timesOf(&st), seen: seen,
		digest: block.Digest{Size: t.size}, lastUse: s.nowNano(), present: true}
	if recorded != nil {
		b.digest = *recorded
	} else {
		b.proof = &proof{done: make(chan struct{})}
	}
	if old := s.blocks[destRel]; old != nil {
		b.lastLookup, b.prefix = old.lastLookup, old.prefix
		s.replaceInPrefixLocked(old, b)
		s.dropLocked(old)
	}
	s.insertLocked(b)
	s.counters.Writes.Add(1)
	return b, nil
}

// physicalAtRename is what a tmp's file allocates as it becomes a block.
// A file whose digest is not recorded yet is marked pending first, and if
// the mark fit in the inode, one filesystem block more is counted for the
// record its proof writes: the rename is where a full store says ENOSPC.
func (s *Store) physicalAtRename(f *os.File, unmarked int64, rel string, recorded bool) (int64, error) {
	if !recorded {
		phase := time.Now()
		defer s.TimePhase(PhasePending, phase)
		if err := s.markPending(f, rel); err != nil {
			return 0, err
		}
	}
	_, physical, err := fileSize(f)
	if err == nil && !recorded && physical == unmarked {
		physical += s.fsBlock
	}
	return physical, err
}

// wholeRow checks that a released tmp can become a block: not published or
// refused already, a positive multiple of the page size, and (written
// through the daemon) every byte written. It settles the tmp's size: a
// passthrough tmp's is its file's, and a daemon-path file is extended to
// the size its writes reached. physical is what the file allocates. The
// caller holds t.mu.
func (t *tmpFile) wholeRow(tmpRel string) (f *os.File, physical int64, err error) {
	switch {
	case t.sealed:
		return nil, 0, newError("rename", tmpRel, syscall.ENOENT, "tmp file was already published")
	case t.refused:
		return nil, 0, newError("rename", tmpRel, syscall.EINVAL, "a write to this tmp file was refused: it does not hold a whole row")
	case t.file == nil:
		return nil, 0, newError("rename", tmpRel, syscall.ENOENT, "tmp file was removed")
	}
	f = t.file
	size, physical, err := fileSize(f)
	if err != nil {
		return nil, 0, err
	}
	if t.passthrough {
		t.size = size
	}
	if t.size == 0 || t.size%int64(block.PageSize) != 0 {
		return nil, 0, newError("rename", tmpRel, syscall.EINVAL,
			"block size %d is not a positive multiple of the page size %d", t.size, block.PageSize)
	}
	if !t.passthrough && !t.coversAll() {
		return nil, 0, newError("rename", tmpRel, syscall.EINVAL,
			"bytes of this tmp file were never written (a write was refused or skipped): it does not hold a whole row")
	}
	if size < t.size {
		if err := f.Truncate(t.size); err != nil {
			return nil, 0, err
		}
	}
	return f, physical, nil
}

// markPending marks a file about to become the block rel as pending its
// proof (pendingXattr).
func (s *Store) markPending(f *os.File, rel string) error {
	if len(s.bootID) == 0 {
		return nil
	}
	return unix.Fsetxattr(int(f.Fd()), pendingXattr, s.pendingMark(rel), 0)
}

// pendingMark is the pending mark of the block rel in this boot: the boot id
// and the name, apart by a NUL (neither holds one).
func (s *Store) pendingMark(rel string) []byte {
	return append(append(append([]byte(nil), s.bootID...), 0), rel...)
}

// fitsLocked checks, under the store's lock, that the tmp is still the one
// the name holds, that the block has its tier's row size (a tier's only
// block may be replaced by one of another size), and makes room for what
// the file allocated (physical) beyond what the tmp counted.
func (s *Store) fitsLocked(t *tmpFile, tmpRel, destRel string, name block.Name, physical int64) error {
	if s.tmps[tmpRel] != t {
		return newError("rename", tmpRel, syscall.ENOENT, "tmp file was removed while being published")
	}
	if s.creating[tmpRel] {
		return newError("rename", tmpRel, syscall.EBUSY, "the tmp name is being created again while published: not published")
	}
	if want, ok := s.rowBytes[name.Tier]; ok && want != t.size {
		if old := s.blocks[destRel]; s.tierBlocks[name.Tier] > 1 || old == nil {
			return newError("rename", destRel, syscall.EINVAL,
				"block size %d differs from the %d-byte rows of the other blocks in %s", t.size, want, name.Tier)
		}
	}
	if extra := physical - t.allocated; extra > 0 {
		if err := s.makeRoomLocked(extra, destRel); err != nil {
			s.counters.NoSpace.Add(1)
			return err
		}
	}
	return nil
}

// renameLocked renames the tmp over its block while the tmp's name names the
// file written, and checks after the rename that the block's name does. The
// caller holds Store.mu.
func (s *Store) renameLocked(t *tmpFile, dirfd int, tmpRel, destRel string) error {
	tmpBase, destBase := path.Base(tmpRel), path.Base(destRel)
	if id, err := nameID(dirfd, tmpBase); err != nil || id != t.id {
		s.counters.PublishRefused.Add(1)
		return newError("rename", tmpRel, syscall.EPERM,
			"the tmp name no longer names the file written through the mount (replaced by a link or another file): not published")
	}
	if err := unix.Renameat(dirfd, tmpBase, dirfd, destBase); err != nil {
		return err
	}
	if id, err := nameID(dirfd, destBase); err != nil || id != t.id {
		// The tmp name was swapped between the check and the rename: what
		// now holds the block's name is not the block written.
		s.counters.PublishRefused.Add(1)
		if err := unix.Unlinkat(dirfd, destBase, 0); err != nil && err != unix.ENOENT {
			s.cfg.Logger.Error("removing the file renamed over a block in place of its tmp", "path", s.Path(destRel), "err", err)
		}
		if old := s.blocks[destRel]; old != nil {
			s.dropLocked(old)
			s.queueRemoval(destRel)
		}
		return newError("rename", tmpRel, syscall.EPERM,
			"the tmp name was replaced during the rename: not published, and the block is gone")
	}
	return nil
}

// prove learns a placed block's digest, checks it against vLLM's CRC32C
// xattr and records it, then ends the proof: a failure drops the block. It
// releases t.mu, taken by Publish, and the tmp's descriptor.
func (s *Store) prove(t *tmpFile, b *entry) {
	started := time.Now()
	s.readOnlyInMemory(t)
	f := t.file
	d, fromRow, err := s.digestOf(t, f)
	// The record and the stat that sees it are a change of the daemon's
	// own, as ownChange's are (changed.go).
	b.changing.Lock()
	if err == nil {
		phase := time.Now()
		if err = writeDigest(f, b.name, d); err == nil {
			err = clearPending(f)
		}
		s.TimePhase(PhaseRecord, phase)
	}
	var st unix.Stat_t
	if err == nil {
		err = unix.Fstat(int(f.Fd()), &st)
	}
	var stored []byte
	if err == nil {
		stored = t.storedMapping(b.size)
	}
	s.mu.Lock()
	if err == nil {
		// A load that pinned the block reads it against this digest, even
		// once the block was replaced or evicted.
		b.digest, b.unchecked = d, fromRow
		if s.blocks[b.rel] == b {
			s.settleLocked(b, st.Blocks*512)
			b.times, b.seen = timesOf(&st), stateOf(&st)
		}
	}
	s.retireTmpLocked(t, b, stored, err == nil)
	s.mu.Unlock()
	b.changing.Unlock()
	t.mu.Unlock()
	if err != nil {
		s.refuseProven(b, err)
	}
	b.proof.err = err
	close(b.proof.done)
	s.TimePhase(PhaseProof, started)
}

// settleLocked counts what a proven block's file allocates, in place of
// what its rename counted. It can only exceed that if the record took more
// than a block: room is made for it, or the excess is logged.
func (s *Store) settleLocked(b *entry, physical int64) {
	if extra := physical - b.physical; extra > 0 {
		if err := s.makeRoomLocked(extra, b.rel); err != nil {
			s.cfg.Logger.Warn("a proven block's record took more than its rename counted, and no room could be made",
				"path", s.Path(b.rel), "bytes", extra, "err", err)
		}
		if s.blocks[b.rel] != b {
			return // evicted to make that room
		}
	}
	s.totals.add(b, -1)
	s.used += physical - b.physical
	b.physical = physical
	s.totals.add(b, 1)
}

// digestOf learns a placed block's digest: a passthrough tmp's from the
// engine's row (or its file read back), a daemon-path tmp's from what its
// writes summed (or its file, written out of order). vLLM's CRC32C xattr,
// when set, must agree. fromRow is set when the file's bytes were never
// read. The caller holds t.mu.
func (s *Store) digestOf(t *tmpFile, f *os.File) (d block.Digest, fromRow bool, err error) {
	// What the proof reads leaves the access time as the write left it,
	// not later than the modification time, so the block's first load moves
	// it (times.go). The daemon owns the file or runs as root, so the flag
	// is granted.
	setFlag(int(f.Fd()), unix.O_NOATIME, true)
	var sealed written
	if t.passthrough {
		phase := time.Now()
		if sealed, err = s.sealPassthrough(t, f); err != nil {
			return d, false, err
		}
		s.TimePhase(PhaseProbe, phase)
	}
	phase := time.Now()
	defer s.TimePhase(PhaseChecksum, phase)
	// The checksum below reads the file buffered.
	if err := setDirect(int(f.Fd()), false); err != nil {
		return d, false, err
	}
	sum := &t.sum
	switch {
	case t.passthrough:
		sum = sealed.sum
	case !t.sequential || sum.Len() != t.size:
		if sum, err = fileSum(f, t.size); err != nil {
			return d, false, err
		}
	}
	if err := checkVLLMChecksum(f, sum.CRC()); err != nil {
		return d, false, err
	}
	if t.passthrough {
		d, err = block.NewDigest(sum, sealed.probe)
	} else {
		d, err = t.digest(f, sum)
	}
	return d, t.passthrough && sealed.fromRow, err
}

// vllmMismatch is a block whose bytes disagree with vLLM's CRC32C xattr.
type vllmMismatch struct{ want, got uint32 }

func (e *vllmMismatch) Error() string {
	return fmt.Sprintf("the engine's %s %08x does not match the bytes written (crc32c %08x)", block.VLLMChecksumXattr, e.want, e.got)
}

// vllmMalformed is a vLLM CRC32C xattr of another format than vLLM's.
type vllmMalformed struct{ err error }

func (e *vllmMalformed) Error() string { return e.err.Error() }

// checkVLLMChecksum checks the bytes' CRC32C against vLLM's xattr on f,
// if it has one: a value of another format than vLLM's is an error too
// (vLLM's loader would refuse it).
func checkVLLMChecksum(f *os.File, crc uint32) error {
	want, present, err := vllmChecksum(f)
	switch {
	case err != nil:
		return &vllmMalformed{err}
	case present && want != crc:
		return &vllmMismatch{want: want, got: crc}
	}
	return nil
}

// clearPending removes a proven block's pending mark.
func clearPending(f *os.File) error {
	if err := unix.Fremovexattr(int(f.Fd()), pendingXattr); err != nil && err != unix.ENODATA {
		return err
	}
	return nil
}

// refuseProven drops a block whose proof failed, if its name still holds
// it: nothing read it, and no load will. A disagreement with vLLM's CRC32C
// counts as a checksum failure.
func (s *Store) refuseProven(b *entry, err error) {
	var mismatch *vllmMismatch
	if errors.As(err, &mismatch) {
		s.counters.ChecksumFailures.Add(1)
	}
	s.cfg.Logger.Error("block dropped after its rename: its bytes could not be proven", "path", s.Path(b.rel), "err", err)
	s.mu.Lock()
	dropped := s.blocks[b.rel] == b
	if dropped {
		s.dropLocked(b)
		if err := s.removeFile(b.rel); err != nil {
			s.cfg.Logger.Error("removing a block that failed its proof", "path", s.Path(b.rel), "err", err)
		}
	}
	s.mu.Unlock()
	if dropped {
		s.queueRemoval(b.rel)
	}
}

// pendingDigest proves, at mount, a block file left pending by a daemon that
// stopped before its proof: of this boot, its bytes are what was written and
// give its digest (vLLM's CRC32C, when set, must agree); of an earlier boot,
// nothing proves them; a mark taken for another name (the file was copied
// with its xattrs) proves nothing either. ok is false when the file is not
// pending; the caller records the digest, then clears the mark.
func (s *Store) pendingDigest(f *os.File, rel string, size int64) (d block.Digest, ok bool, err error) {
	want := s.pendingMark(rel)
	buf := make([]byte, len(want)+1)
	n, err := unix.Fgetxattr(int(f.Fd()), pendingXattr, buf)
	switch {
	case err == unix.ENODATA:
		return d, false, nil
	case err != nil && err != unix.ERANGE:
		return d, true, &unprovenError{reason: "reading its pending mark: " + err.Error()}
	case err == nil && len(s.bootID) > 0 && bytes.Equal(buf[:n], want):
	case err == nil && len(s.bootID) > 0 && bytes.HasPrefix(buf[:n], append(append([]byte(nil), s.bootID...), 0)):
		return d, true, &unprovenError{reason: "its pending mark was taken for another block (copied with its xattrs?)"}
	default:
		return d, true, &unprovenError{reason: "its rename was not proven before the machine restarted (its bytes may be torn)"}
	}
	sum, err := fileSum(f, size)
	if err != nil {
		return d, true, &unprovenError{reason: err.Error()}
	}
	if err := checkVLLMChecksum(f, sum.CRC()); err != nil {
		return d, true, &unprovenError{reason: err.Error()}
	}
	d, err = digestFile(f, sum)
	if err != nil {
		return d, true, &unprovenError{reason: err.Error()}
	}
	return d, true, nil
}

// storedMapping hands over the tmp's mapping of its file for keepStoredLocked:
// the one made when a passthrough tmp in memory was summed under its read
// lease, or, for a tmp written through the daemon under a write lease held
// since its creation, a new one. Either way the file's bytes are the
// digest's. Nil for a tmp that holds no lease.
func (t *tmpFile) storedMapping(size int64) []byte {
	stored := t.leaseMap
	t.leaseMap = nil
	if stored == nil && t.lease != nil {
		stored = mapLeased(t.lease, size)
	}
	return stored
}

// retireTmpLocked ends a published tmp under s.mu: its descriptor closes if
// the tmp was retired, stored becomes the block's proven mapping when proven
// and the store keeps it (else it is unmapped, and so is a mapping the tmp
// still holds), and the tmp's lease is given back.
func (s *Store) retireTmpLocked(t *tmpFile, b *entry, stored []byte, proven bool) {
	t.closeIfRetired()
	if t.leaseMap != nil {
		unix.Munmap(t.leaseMap)
		t.leaseMap = nil
	}
	if (!proven || !s.keepStoredLocked(t, b, stored)) && stored != nil {
		unix.Munmap(stored)
	}
	t.giveBackLeaseLocked()
}
