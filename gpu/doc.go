// Package gpu is kvtierfs's CPU→GPU load stage: it copies rows of the engine's
// shm region into GPU memory and fingerprints what the GPU holds, so that the
// engine model can check that every rank's GPU has the expected KV.
//
// # Backends
//
// Open picks a Backend by the value of --gpu:
//
//   - "cuda": the CUDA runtime, loaded at run time with dlopen (libcudart.so,
//     then .so.13, .so.12, .so.11.0; or the path in $KVTIERFS_CUDART), so a
//     binary built here needs no CUDA headers or libraries. The region is
//     registered with cudaHostRegister where the device supports it (else
//     copied from as pageable memory, as vLLM does; on unified-memory devices
//     that read through the host's page tables registration only populates
//     the pages); CopyRows issues cudaMemcpyAsync calls
//     round-robin on four streams and waits for all of them. Errors carry
//     CUDA's own error strings (CUDAError).
//   - "host": the same interface over ordinary memory, for machines without a
//     GPU (CI, laptops). It checks everything the CUDA backend checks.
//   - "auto": "cuda" when the runtime loads and the device is usable, else
//     "host"; the note Open returns says why.
//
// # Fingerprint
//
// Fingerprint returns kvtier-fp1 (defined at FingerprintHost): a sum mod 2^64
// of SplitMix64-mixed (word + index·γ) terms, finalized with the length. Any
// thread can compute any term and partial sums combine in any order, so the
// device and the host agree bit for bit.
//
// The CUDA backend computes it on the device when it can: a kernel compiled at
// Open by NVRTC (libnvrtc.so*, or $KVTIERFS_NVRTC) for the device's sm_XY,
// loaded into the runtime's primary context with cuModuleLoadData (libcuda.so.1)
// and launched with cuLaunchKernel; it reduces per-thread partial sums with warp
// shuffles and one atomicAdd per warp, and only the 8-byte sum crosses the bus.
// Without NVRTC or the driver API it copies the range back through a pinned
// staging buffer and hashes it on the host. FingerprintMethod says which, and
// for the fallback why.
//
// # Bandwidth
//
// MeasureH2D (and the command gpu/cmd/h2dbench) measures host→device bandwidth
// from a registered /dev/shm region, from cudaMallocHost memory and from
// pageable memory, for engine-sized rows in batches.
package gpu
