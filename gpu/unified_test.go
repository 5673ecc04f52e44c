package gpu

import (
	"strings"
	"testing"
)

// The region is registered wherever the device can register it, copied
// from pageable memory where it cannot, and the description says which.
func TestPlanHostMemory(t *testing.T) {
	for _, c := range []struct {
		name     string
		attrs    memoryAttrs
		register bool
		note     string
	}{
		{"discrete (H100, PCIe)", memoryAttrs{HostRegisterSupported: true}, true, "discrete memory; cudaHostRegister pins"},
		{"GH200 / GB200 (ATS)", memoryAttrs{HostRegisterSupported: true, UsesHostPageTables: true}, true, "populates the region, does not pin"},
		{"GB10 (unified, ATS)", memoryAttrs{HostRegisterSupported: true, UsesHostPageTables: true, Integrated: true}, true, "memory shared with the host; host page tables"},
		{"integrated without registration", memoryAttrs{Integrated: true}, false, "unsupported: rows are copied from pageable memory"},
	} {
		p := planHostMemory(c.attrs)
		if p.register != c.register || !strings.Contains(p.note, c.note) {
			t.Errorf("%s: register %v, note %q; want %v, %q", c.name, p.register, p.note, c.register, c.note)
		}
	}
}
