package gpu

// memoryAttrs are the CUDA device attributes that say how the GPU reaches
// host memory (cudaDeviceGetAttribute).
type memoryAttrs struct {
	// HostRegisterSupported is cudaDevAttrHostRegisterSupported (99):
	// cudaHostRegister works on this device only when it is set.
	HostRegisterSupported bool
	// UsesHostPageTables is cudaDevAttrPageableMemoryAccessUsesHostPageTables
	// (100): the GPU reads host memory through the CPU's page tables (ATS over
	// NVLink-C2C: GH200, GB200, the GB10 of a DGX Spark). There
	// cudaHostRegister does not page-lock, it only populates the range.
	UsesHostPageTables bool
	// Integrated is cudaDevAttrIntegrated (18): the GPU has no memory of its
	// own, device allocations come from the same DRAM as the host's.
	Integrated bool
}

// hostMemoryPlan is what the CUDA stage does with the engine's region.
type hostMemoryPlan struct {
	// register is whether Register calls cudaHostRegister; without it the
	// rows are copied from the mapping as pageable memory.
	register bool
	// note says so, for Describe.
	note string
}

// planHostMemory decides how the region reaches the device. Registration is
// a bandwidth optimisation, never a condition of correctness (vLLM's
// host_register logs and goes on unpinned): where the device cannot
// register, copies come from pageable memory instead of failing the stage.
func planHostMemory(a memoryAttrs) hostMemoryPlan {
	memory := "discrete memory"
	if a.Integrated {
		memory = "memory shared with the host"
	}
	switch {
	case !a.HostRegisterSupported:
		return hostMemoryPlan{note: memory + "; cudaHostRegister unsupported: rows are copied from pageable memory"}
	case a.UsesHostPageTables:
		return hostMemoryPlan{register: true, note: memory + "; host page tables: cudaHostRegister populates the region, does not pin it"}
	default:
		return hostMemoryPlan{register: true, note: memory + "; cudaHostRegister pins the region"}
	}
}
