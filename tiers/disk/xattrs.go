package disk

import "syscall"

// The xattrs of published blocks and of the tmp files written through the
// mount (vLLM's user.vllm.kv_crc32c among them) are read and written on the
// store's own descriptor of the file, never through its path, whose
// directories the engine's uid could swap for links.

// OnFile runs fn on the descriptor of a tracked tmp file, or of a published
// block pinned for the call, as a change of the daemon's own (ownChange); ok
// is false when rel is neither.
func (s *Store) OnFile(rel string, fn func(fd int) error) (ok bool, err error) {
	s.mu.Lock()
	t := s.tmps[rel]
	_, isBlock := s.blocks[rel]
	s.mu.Unlock()
	if t != nil {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.file == nil {
			return true, syscall.ENOENT
		}
		return true, fn(int(t.file.Fd()))
	}
	if !isBlock {
		return false, nil
	}
	r, err := s.PinBlock(rel)
	if err != nil {
		return true, err
	}
	defer r.Close()
	_, err = r.ownChange(fn)
	return true, err
}
