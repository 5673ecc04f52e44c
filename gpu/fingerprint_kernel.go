//go:build cgo && cuda

package gpu

// fingerprintKernelName is the kernel's entry point in fingerprintKernelSource.
const fingerprintKernelName = "kvtier_fp1_sum"

// fingerprintKernelSource is the CUDA C++ kernel that computes S on the device:
// a grid-stride loop of per-thread partial sums, a warp shuffle reduction and
// one 64-bit atomicAdd per warp into *out (which the caller zeroes).
const fingerprintKernelSource = `
#define KVT_GAMMA 0x9E3779B97F4A7C15ULL

__device__ __forceinline__ unsigned long long kvt_mix64(unsigned long long z) {
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

extern "C" __global__ void kvtier_fp1_sum(const unsigned char *p, unsigned long long n,
                                          unsigned long long *out) {
	unsigned long long words = (n + 7) / 8;
	unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
	bool aligned = (((unsigned long long)p) & 7) == 0;
	unsigned long long acc = 0;
	for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
	     i < words; i += stride) {
		unsigned long long w = 0;
		if (aligned && 8 * i + 8 <= n) {
			w = ((const unsigned long long *)p)[i];
		} else {
			for (int b = 0; b < 8; b++) {
				unsigned long long k = 8 * i + b;
				if (k < n) w |= (unsigned long long)p[k] << (8 * b);
			}
		}
		acc += kvt_mix64(w + (i + 1) * KVT_GAMMA);
	}
	for (int offset = 16; offset > 0; offset >>= 1)
		acc += __shfl_down_sync(0xffffffffu, acc, offset);
	if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}
`
