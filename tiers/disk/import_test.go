package disk

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// TestImport: a block imported from elsewhere is published through the
// write path (directories created private, digest recorded, capacity
// counted, zero pages left as holes); its listeners hear it Imported, and
// only the engine's own publishes Published.
func TestImport(t *testing.T) {
	s := openStore(t, Config{})
	var mu sync.Mutex
	var heard, imports []string
	s.Listen(func(e Event) {
		mu.Lock()
		defer mu.Unlock()
		switch e.Kind {
		case Published:
			heard = append(heard, e.Rel)
		case Imported:
			imports = append(imports, e.Rel)
		}
	})
	imported := blockRel("tier", 0, hashHex(1, 32))
	data := pageData(1, 4)
	clear(data[block.PageSize : 3*block.PageSize])
	if err := s.Import(imported, data); err != nil {
		t.Fatal(err)
	}
	if !s.Lookup(imported, 1) || !bytes.Equal(readBlock(t, s, imported), data) {
		t.Fatal("imported block not served")
	}
	checkRecord(t, s.Path(imported), data)
	if p := physicalOf(t, s.Path(imported)); p >= int64(len(data)) {
		t.Errorf("zero pages not left as holes: %d bytes allocated", p)
	}
	st, err := os.Stat(filepath.Dir(s.Path(imported)))
	if err != nil || st.Mode().Perm() != PrivateDirMode {
		t.Fatalf("imported block's directory: %v, mode %v", err, st.Mode())
	}
	checkAccounting(t, s)
	engine := blockRel("tier", 0, hashHex(2, 32))
	putBlock(t, s, engine, pageData(2, 4))
	mu.Lock()
	defer mu.Unlock()
	if len(heard) != 1 || heard[0] != engine {
		t.Fatalf("listeners heard %v Published, want only %s", heard, engine)
	}
	if len(imports) != 1 || imports[0] != imported {
		t.Fatalf("listeners heard %v Imported, want only %s", imports, imported)
	}
}
