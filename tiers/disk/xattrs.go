package disk

import "syscall"

// The xattrs of published blocks and of the tmp files written through the
// mount (vLLM's user.vllm.kv_crc32c among them) are read and written on the
// store's own descriptor of the file, never through its path, whose
// directories the engine's uid could swap for links.

// ReadOnFile runs fn, which only reads, on the descriptor of a tracked tmp
// file or of a published block pinned for the call; ok is false when rel is
// neither.
func (s *Store) ReadOnFile(rel string, fn func(fd int) error) (ok bool, err error) {
	return s.onFile(rel, fn, func(r *Reader) error { return fn(int(r.file.Fd())) })
}

// ChangeOnFile runs fn, which changes the file (an xattr set or removed), as
// ReadOnFile does, and on a block as a change of the daemon's own
// (Reader.ownChange).
func (s *Store) ChangeOnFile(rel string, fn func(fd int) error) (ok bool, err error) {
	return s.onFile(rel, fn, func(r *Reader) error {
		_, err := r.ownChange(fn)
		return err
	})
}

// onFile runs onTmp on a tracked tmp file's descriptor, or onBlock on a
// published block pinned for the call.
func (s *Store) onFile(rel string, onTmp func(fd int) error, onBlock func(*Reader) error) (ok bool, err error) {
	s.mu.Lock()
	t := s.tmps[rel]
	_, isBlock := s.blocks[rel]
	s.mu.Unlock()
	if t != nil {
		return true, t.onFile(onTmp)
	}
	if !isBlock {
		return false, nil
	}
	r, err := s.PinBlock(rel)
	if err != nil {
		return true, err
	}
	defer r.Close()
	return true, onBlock(r)
}

// onFile runs fn on the tmp's descriptor while the store tracks it: ENOENT
// once it was published (its descriptor then is the block's, whose changes
// are ownChange's) or dropped.
func (t *tmpFile) onFile(fn func(fd int) error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.file == nil || t.untracked {
		return syscall.ENOENT
	}
	return fn(int(t.file.Fd()))
}
