package disk

import (
	"fmt"
	"path"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kvtierfs/kvtierfs/tiers/block"
	"github.com/kvtierfs/kvtierfs/tiers/internal/beneath"
)

// importSerial numbers the tmp files Import writes.
var importSerial atomic.Uint64

// Import publishes a block whose bytes come from elsewhere (the shared
// level, which verified them) through the store's own write path: a tmp file
// beside the block, written, then published, so capacity, digest and holes
// hold as for a block the engine stored. Its parent directories are created
// as the mount would create them. Its listeners hear Imported, not
// Published: the block came from the level a Published block goes to.
func (s *Store) Import(rel string, data []byte) error {
	kind, name := block.Parse(rel)
	if kind != block.File {
		return newError("import", rel, syscall.EINVAL, "not a block name")
	}
	if err := s.MakeDirs(path.Dir(rel)); err != nil {
		return err
	}
	tmp := name.TmpPath(fmt.Sprintf("kvtierfs-import-%d", importSerial.Add(1)))
	w, err := s.CreateTmp(tmp, unix.O_EXCL)
	if err != nil {
		return err
	}
	if _, err := w.WriteAt(data, 0); err != nil {
		w.Close()
		s.RemoveTmp(tmp)
		return err
	}
	if err := w.Close(); err != nil {
		s.RemoveTmp(tmp)
		return err
	}
	if _, err := s.publish(tmp, rel); err != nil {
		s.RemoveTmp(tmp)
		return err
	}
	s.tell(Event{Kind: Imported, Rel: rel})
	return nil
}

// MakeDirs creates the directories of relDir that are missing, beneath the
// root without following links, each private to the store's owner.
func (s *Store) MakeDirs(relDir string) error {
	parent := "."
	for _, comp := range strings.Split(path.Clean(relDir), "/") {
		if comp == "." || comp == "" {
			continue
		}
		pfd, err := beneath.Open(s.rootFD, parent, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		err = unix.Mkdirat(pfd, comp, PrivateDirMode)
		unix.Close(pfd)
		dir := path.Join(parent, comp)
		switch {
		case err == nil:
			fd, err := beneath.Open(s.rootFD, dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			if err != nil {
				return err
			}
			err = s.MakePrivate(fd, PrivateDirMode)
			unix.Close(fd)
			if err != nil {
				return err
			}
		case err != unix.EEXIST:
			return err
		}
		parent = dir
	}
	return nil
}
