// cudaload.h: the C half of the CUDA backend (cuda.go).
//
// Nothing here needs CUDA headers or libraries at build time. The CUDA runtime
// (libcudart), the driver API (libcuda) and NVRTC (libnvrtc) are opened with
// dlopen at run time; the few entry points used are declared below with plain C
// types (every CUDA handle is a pointer, every status enum an int).
//
// Every operation that touches the device is one C call that first selects the
// device with cudaSetDevice: a cgo call runs on one OS thread from start to end,
// while a goroutine may move between threads between calls.

#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { KVT_LIB_CUDART = 1, KVT_LIB_DRIVER = 2, KVT_LIB_NVRTC = 3 };
enum { KVT_STREAMS = 4, KVT_THREADS = 256 };
enum { KVT_H2D = 1, KVT_D2H = 2 };                       // cudaMemcpyKind
enum { KVT_ATTR_SMS = 16, KVT_ATTR_CC_MAJOR = 75, KVT_ATTR_CC_MINOR = 76,  // cudaDeviceAttr
       KVT_ATTR_INTEGRATED = 18, KVT_ATTR_HOST_REGISTER_SUPPORTED = 99,
       KVT_ATTR_USES_HOST_PAGE_TABLES = 100 };
enum { KVT_HOST_REGISTER_PORTABLE = 1, KVT_STREAM_NON_BLOCKING = 1 };

// kvt_err names a failed library call: which library, its status code, the call.
typedef struct {
	int lib;
	int code;
	const char *call;
} kvt_err;

static kvt_err kvt_fail(int lib, int code, const char *call) {
	kvt_err e = {lib, code, call};
	return e;
}

static kvt_err kvt_ok(void) { return kvt_fail(0, 0, NULL); }

#define KVT_RT(call, expr)                                                 \
	do {                                                                   \
		int c_ = (expr);                                                   \
		if (c_ != 0) return kvt_fail(KVT_LIB_CUDART, c_, call);            \
	} while (0)

#define KVT_DRV(call, expr)                                                \
	do {                                                                   \
		int c_ = (expr);                                                   \
		if (c_ != 0) return kvt_fail(KVT_LIB_DRIVER, c_, call);            \
	} while (0)

// kvt_cudart holds the CUDA runtime entry points.
typedef struct {
	const char *(*GetErrorString)(int);
	int (*GetDeviceCount)(int *);
	int (*SetDevice)(int);
	int (*DeviceGetAttribute)(int *, int, int);
	int (*RuntimeGetVersion)(int *);
	int (*DriverGetVersion)(int *);
	int (*HostRegister)(void *, size_t, unsigned);
	int (*HostUnregister)(void *);
	int (*MallocHost)(void **, size_t);
	int (*FreeHost)(void *);
	int (*Malloc)(void **, size_t);
	int (*Free)(void *);
	int (*MemcpyAsync)(void *, const void *, size_t, int, void *);
	int (*MemsetAsync)(void *, int, size_t, void *);
	int (*StreamCreateWithFlags)(void **, unsigned);
	int (*StreamSynchronize)(void *);
	int (*StreamDestroy)(void *);
} kvt_cudart;

// kvt_driver holds the driver API entry points used to run the fingerprint kernel.
typedef struct {
	int (*Init)(unsigned);
	int (*DeviceGet)(int *, int);
	int (*DeviceGetName)(char *, int, int);
	int (*DevicePrimaryCtxRetain)(void **, int);
	int (*DevicePrimaryCtxRelease)(int);
	int (*CtxSetCurrent)(void *);
	int (*ModuleLoadData)(void **, const void *);
	int (*ModuleUnload)(void *);
	int (*ModuleGetFunction)(void **, void *, const char *);
	int (*LaunchKernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
	                    unsigned, void *, void **, void **);
	int (*GetErrorString)(int, const char **);
} kvt_driver;

// kvt_nvrtc holds the NVRTC entry points used to compile the fingerprint kernel.
typedef struct {
	const char *(*GetErrorString)(int);
	int (*Version)(int *, int *);
	int (*CreateProgram)(void **, const char *, const char *, int, const char *const *,
	                     const char *const *);
	int (*CompileProgram)(void *, int, const char *const *);
	int (*GetProgramLogSize)(void *, size_t *);
	int (*GetProgramLog)(void *, char *);
	int (*GetCUBINSize)(void *, size_t *);
	int (*GetCUBIN)(void *, char *);
	int (*DestroyProgram)(void **);
} kvt_nvrtc;

// kvt_dlopen opens a shared library; on failure it returns NULL and a copy of
// dlerror's message in *msg (free it).
static void *kvt_dlopen(const char *name, char **msg) {
	void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		*msg = strdup(e != NULL ? e : "dlopen failed");
	}
	return h;
}

#define KVT_SYM(lib, table, field, name)                                   \
	if ((*(void **)(&(table)->field) = dlsym(lib, name)) == NULL) return name

// kvt_resolve_* fill a table from an opened library and return NULL, or the name
// of the first symbol the library lacks.
static const char *kvt_resolve_cudart(void *lib, kvt_cudart *t) {
	KVT_SYM(lib, t, GetErrorString, "cudaGetErrorString");
	KVT_SYM(lib, t, GetDeviceCount, "cudaGetDeviceCount");
	KVT_SYM(lib, t, SetDevice, "cudaSetDevice");
	KVT_SYM(lib, t, DeviceGetAttribute, "cudaDeviceGetAttribute");
	KVT_SYM(lib, t, RuntimeGetVersion, "cudaRuntimeGetVersion");
	KVT_SYM(lib, t, DriverGetVersion, "cudaDriverGetVersion");
	KVT_SYM(lib, t, HostRegister, "cudaHostRegister");
	KVT_SYM(lib, t, HostUnregister, "cudaHostUnregister");
	KVT_SYM(lib, t, MallocHost, "cudaMallocHost");
	KVT_SYM(lib, t, FreeHost, "cudaFreeHost");
	KVT_SYM(lib, t, Malloc, "cudaMalloc");
	KVT_SYM(lib, t, Free, "cudaFree");
	KVT_SYM(lib, t, MemcpyAsync, "cudaMemcpyAsync");
	KVT_SYM(lib, t, MemsetAsync, "cudaMemsetAsync");
	KVT_SYM(lib, t, StreamCreateWithFlags, "cudaStreamCreateWithFlags");
	KVT_SYM(lib, t, StreamSynchronize, "cudaStreamSynchronize");
	KVT_SYM(lib, t, StreamDestroy, "cudaStreamDestroy");
	return NULL;
}

static const char *kvt_resolve_driver(void *lib, kvt_driver *t) {
	KVT_SYM(lib, t, Init, "cuInit");
	KVT_SYM(lib, t, DeviceGet, "cuDeviceGet");
	KVT_SYM(lib, t, DeviceGetName, "cuDeviceGetName");
	KVT_SYM(lib, t, DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	KVT_SYM(lib, t, DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
	KVT_SYM(lib, t, CtxSetCurrent, "cuCtxSetCurrent");
	KVT_SYM(lib, t, ModuleLoadData, "cuModuleLoadData");
	KVT_SYM(lib, t, ModuleUnload, "cuModuleUnload");
	KVT_SYM(lib, t, ModuleGetFunction, "cuModuleGetFunction");
	KVT_SYM(lib, t, LaunchKernel, "cuLaunchKernel");
	KVT_SYM(lib, t, GetErrorString, "cuGetErrorString");
	return NULL;
}

static const char *kvt_resolve_nvrtc(void *lib, kvt_nvrtc *t) {
	KVT_SYM(lib, t, GetErrorString, "nvrtcGetErrorString");
	KVT_SYM(lib, t, Version, "nvrtcVersion");
	KVT_SYM(lib, t, CreateProgram, "nvrtcCreateProgram");
	KVT_SYM(lib, t, CompileProgram, "nvrtcCompileProgram");
	KVT_SYM(lib, t, GetProgramLogSize, "nvrtcGetProgramLogSize");
	KVT_SYM(lib, t, GetProgramLog, "nvrtcGetProgramLog");
	KVT_SYM(lib, t, GetCUBINSize, "nvrtcGetCUBINSize");
	KVT_SYM(lib, t, GetCUBIN, "nvrtcGetCUBIN");
	KVT_SYM(lib, t, DestroyProgram, "nvrtcDestroyProgram");
	return NULL;
}

// kvt_error_string returns the library's own text for a status code.
static const char *kvt_error_string(const kvt_cudart *rt, const kvt_driver *drv,
                                   const kvt_nvrtc *nv, kvt_err e) {
	const char *s = NULL;
	switch (e.lib) {
	case KVT_LIB_CUDART:
		s = rt->GetErrorString(e.code);
		break;
	case KVT_LIB_DRIVER:
		if (drv != NULL && drv->GetErrorString(e.code, &s) != 0) s = NULL;
		break;
	case KVT_LIB_NVRTC:
		if (nv != NULL) s = nv->GetErrorString(e.code);
		break;
	}
	return s != NULL ? s : "unknown error";
}

static kvt_err kvt_device_count(const kvt_cudart *rt, int *n) {
	KVT_RT("cudaGetDeviceCount", rt->GetDeviceCount(n));
	return kvt_ok();
}

// kvt_dev is one device as the backend uses it.
typedef struct {
	const kvt_cudart *rt;
	const kvt_driver *drv;  // NULL unless the fingerprint kernel is loaded
	int device;
	int sms, cc_major, cc_minor, runtime_version, driver_version;
	int integrated, host_register_supported, uses_host_page_tables;
	void *streams[KVT_STREAMS];
	void *scratch;          // 8 device bytes: the kernel's sum
	void *ctx, *module, *kernel;
} kvt_dev;

// kvt_dev_init selects the device, reads its attributes, creates the streams and
// the fingerprint scratch word.
static kvt_err kvt_dev_init(kvt_dev *d) {
	KVT_RT("cudaSetDevice", d->rt->SetDevice(d->device));
	KVT_RT("cudaDeviceGetAttribute", d->rt->DeviceGetAttribute(&d->sms, KVT_ATTR_SMS, d->device));
	KVT_RT("cudaDeviceGetAttribute",
	       d->rt->DeviceGetAttribute(&d->cc_major, KVT_ATTR_CC_MAJOR, d->device));
	KVT_RT("cudaDeviceGetAttribute",
	       d->rt->DeviceGetAttribute(&d->cc_minor, KVT_ATTR_CC_MINOR, d->device));
	KVT_RT("cudaDeviceGetAttribute",
	       d->rt->DeviceGetAttribute(&d->integrated, KVT_ATTR_INTEGRATED, d->device));
	KVT_RT("cudaDeviceGetAttribute", d->rt->DeviceGetAttribute(&d->host_register_supported,
	                                                           KVT_ATTR_HOST_REGISTER_SUPPORTED, d->device));
	KVT_RT("cudaDeviceGetAttribute", d->rt->DeviceGetAttribute(&d->uses_host_page_tables,
	                                                           KVT_ATTR_USES_HOST_PAGE_TABLES, d->device));
	KVT_RT("cudaRuntimeGetVersion", d->rt->RuntimeGetVersion(&d->runtime_version));
	KVT_RT("cudaDriverGetVersion", d->rt->DriverGetVersion(&d->driver_version));
	for (int i = 0; i < KVT_STREAMS; i++) {
		KVT_RT("cudaStreamCreateWithFlags",
		       d->rt->StreamCreateWithFlags(&d->streams[i], KVT_STREAM_NON_BLOCKING));
	}
	KVT_RT("cudaMalloc", d->rt->Malloc(&d->scratch, sizeof(uint64_t)));
	return kvt_ok();
}

// kvt_dev_destroy releases what kvt_dev_init and kvt_load_kernel made; it goes on
// past failures and returns the first.
static kvt_err kvt_dev_destroy(kvt_dev *d) {
	kvt_err first = kvt_ok();
	int c;
	if ((c = d->rt->SetDevice(d->device)) != 0) return kvt_fail(KVT_LIB_CUDART, c, "cudaSetDevice");
	if (d->module != NULL) {
		if ((c = d->drv->CtxSetCurrent(d->ctx)) == 0) c = d->drv->ModuleUnload(d->module);
		if (c != 0 && first.code == 0) first = kvt_fail(KVT_LIB_DRIVER, c, "cuModuleUnload");
	}
	if (d->ctx != NULL && (c = d->drv->DevicePrimaryCtxRelease(d->device)) != 0 && first.code == 0)
		first = kvt_fail(KVT_LIB_DRIVER, c, "cuDevicePrimaryCtxRelease");
	if (d->scratch != NULL && (c = d->rt->Free(d->scratch)) != 0 && first.code == 0)
		first = kvt_fail(KVT_LIB_CUDART, c, "cudaFree");
	for (int i = 0; i < KVT_STREAMS; i++) {
		if (d->streams[i] != NULL && (c = d->rt->StreamDestroy(d->streams[i])) != 0 &&
		    first.code == 0)
			first = kvt_fail(KVT_LIB_CUDART, c, "cudaStreamDestroy");
	}
	return first;
}

// kvt_device_name reads the device's marketing name through the driver API.
static kvt_err kvt_device_name(const kvt_driver *drv, int ordinal, char *name, int len) {
	int dev;
	KVT_DRV("cuInit", drv->Init(0));
	KVT_DRV("cuDeviceGet", drv->DeviceGet(&dev, ordinal));
	KVT_DRV("cuDeviceGetName", drv->DeviceGetName(name, len, dev));
	return kvt_ok();
}

// kvt_compile builds CUDA C++ source into a cubin for the device's architecture
// with NVRTC. On success *cubin (free it) holds *size bytes; on a compile error
// *log (free it) holds NVRTC's log.
static kvt_err kvt_compile(const kvt_nvrtc *nv, const char *src, const char *name,
                           const char *arch_option, char **cubin, size_t *size, char **log) {
	void *prog = NULL;
	int c;
	if ((c = nv->CreateProgram(&prog, src, name, 0, NULL, NULL)) != 0)
		return kvt_fail(KVT_LIB_NVRTC, c, "nvrtcCreateProgram");
	const char *opts[] = {arch_option};
	kvt_err e = kvt_ok();
	if ((c = nv->CompileProgram(prog, 1, opts)) != 0) {
		e = kvt_fail(KVT_LIB_NVRTC, c, "nvrtcCompileProgram");
		size_t n = 0;
		if (nv->GetProgramLogSize(prog, &n) == 0 && n > 1 && (*log = malloc(n)) != NULL &&
		    nv->GetProgramLog(prog, *log) != 0) {
			free(*log);
			*log = NULL;
		}
	} else if ((c = nv->GetCUBINSize(prog, size)) != 0) {
		e = kvt_fail(KVT_LIB_NVRTC, c, "nvrtcGetCUBINSize");
	} else if ((*cubin = malloc(*size)) == NULL) {
		e = kvt_fail(KVT_LIB_NVRTC, 1, "malloc");  // NVRTC_ERROR_OUT_OF_MEMORY
	} else if ((c = nv->GetCUBIN(prog, *cubin)) != 0) {
		free(*cubin);
		*cubin = NULL;
		e = kvt_fail(KVT_LIB_NVRTC, c, "nvrtcGetCUBIN");
	}
	nv->DestroyProgram(&prog);
	return e;
}

// kvt_load_kernel loads a cubin into the device's primary context (the one the
// runtime uses, so cudaMalloc pointers are valid in it) and finds the kernel.
static kvt_err kvt_load_kernel(kvt_dev *d, const kvt_driver *drv, const char *cubin,
                               const char *kernel) {
	int dev;
	KVT_DRV("cuInit", drv->Init(0));
	KVT_DRV("cuDeviceGet", drv->DeviceGet(&dev, d->device));
	KVT_DRV("cuDevicePrimaryCtxRetain", drv->DevicePrimaryCtxRetain(&d->ctx, dev));
	d->drv = drv;
	KVT_DRV("cuCtxSetCurrent", drv->CtxSetCurrent(d->ctx));
	KVT_DRV("cuModuleLoadData", drv->ModuleLoadData(&d->module, cubin));
	KVT_DRV("cuModuleGetFunction", drv->ModuleGetFunction(&d->kernel, d->module, kernel));
	return kvt_ok();
}

// kvt_copy is one host→device copy; addresses are plain integers so that a Go
// slice of them holds no Go pointers.
typedef struct {
	uint64_t dst, src, len;
} kvt_copy;

// kvt_copy_h2d enqueues the copies round-robin on the streams, then waits for
// every stream, also after a failed enqueue; it returns the first failure.
static kvt_err kvt_copy_h2d(const kvt_dev *d, const kvt_copy *copies, int n) {
	KVT_RT("cudaSetDevice", d->rt->SetDevice(d->device));
	kvt_err first = kvt_ok();
	for (int i = 0; i < n; i++) {
		int c = d->rt->MemcpyAsync((void *)(uintptr_t)copies[i].dst,
		                           (const void *)(uintptr_t)copies[i].src, copies[i].len, KVT_H2D,
		                           d->streams[i % KVT_STREAMS]);
		if (c != 0) {
			first = kvt_fail(KVT_LIB_CUDART, c, "cudaMemcpyAsync");
			break;
		}
	}
	for (int s = 0; s < KVT_STREAMS; s++) {
		int c = d->rt->StreamSynchronize(d->streams[s]);
		if (c != 0 && first.code == 0) first = kvt_fail(KVT_LIB_CUDART, c, "cudaStreamSynchronize");
	}
	return first;
}

// kvt_copy_d2h copies n device bytes at src to host memory at dst and waits.
static kvt_err kvt_copy_d2h(const kvt_dev *d, void *dst, uint64_t src, size_t n) {
	KVT_RT("cudaSetDevice", d->rt->SetDevice(d->device));
	KVT_RT("cudaMemcpyAsync",
	       d->rt->MemcpyAsync(dst, (const void *)(uintptr_t)src, n, KVT_D2H, d->streams[0]));
	KVT_RT("cudaStreamSynchronize", d->rt->StreamSynchronize(d->streams[0]));
	return kvt_ok();
}

// kvt_fingerprint_sum runs the fingerprint kernel over n device bytes at ptr and
// returns the word sum S (see fingerprint.go) in *sum.
static kvt_err kvt_fingerprint_sum(const kvt_dev *d, uint64_t ptr, uint64_t n, uint64_t *sum) {
	KVT_RT("cudaSetDevice", d->rt->SetDevice(d->device));
	KVT_DRV("cuCtxSetCurrent", d->drv->CtxSetCurrent(d->ctx));
	void *stream = d->streams[0];
	KVT_RT("cudaMemsetAsync", d->rt->MemsetAsync(d->scratch, 0, sizeof(uint64_t), stream));
	uint64_t words = (n + 7) / 8;
	uint64_t blocks = (words + KVT_THREADS - 1) / KVT_THREADS;
	uint64_t max_blocks = (uint64_t)d->sms * 8;
	if (blocks > max_blocks) blocks = max_blocks;
	if (blocks == 0) blocks = 1;
	uint64_t out = (uint64_t)(uintptr_t)d->scratch;
	void *args[] = {&ptr, &n, &out};
	KVT_DRV("cuLaunchKernel", d->drv->LaunchKernel(d->kernel, (unsigned)blocks, 1, 1, KVT_THREADS,
	                                               1, 1, 0, stream, args, NULL));
	uint64_t result = 0;
	KVT_RT("cudaMemcpyAsync", d->rt->MemcpyAsync(&result, d->scratch, sizeof result, KVT_D2H, stream));
	KVT_RT("cudaStreamSynchronize", d->rt->StreamSynchronize(stream));
	*sum = result;
	return kvt_ok();
}

static kvt_err kvt_host_register(const kvt_dev *d, void *p, size_t n) {
	KVT_RT("cudaSetDevice", d->rt->SetDevice(d->device));
	KVT_RT("cudaHostRegister", d->rt->HostRegister(p, n, KVT_HOST_REGISTER_PORTABLE));
	return kvt_ok();
}

static kvt_err kvt_host_unregister(const kvt_dev *d, void *p) {
	KVT_RT("cudaSetDevice", d->rt->SetDevice(d->device));
	KVT_RT("cudaHostUnregister", d->rt->HostUnregister(p));
	return kvt_ok();
}

static kvt_err kvt_malloc_host(const kvt_dev *d, void **p, size_t n) {
	KVT_RT("cudaSetDevice", d->rt->SetDevice(d->device));
	KVT_RT("cudaMallocHost", d->rt->MallocHost(p, n));
	return kvt_ok();
}

static kvt_err kvt_free_host(const kvt_dev *d, void *p) {
	KVT_RT("cudaSetDevice", d->rt->SetDevice(d->device));
	KVT_RT("cudaFreeHost", d->rt->FreeHost(p));
	return kvt_ok();
}

static kvt_err kvt_malloc(const kvt_dev *d, uint64_t *ptr, size_t n) {
	void *p = NULL;
	KVT_RT("cudaSetDevice", d->rt->SetDevice(d->device));
	KVT_RT("cudaMalloc", d->rt->Malloc(&p, n));
	*ptr = (uint64_t)(uintptr_t)p;
	return kvt_ok();
}

static kvt_err kvt_free(const kvt_dev *d, uint64_t ptr) {
	KVT_RT("cudaSetDevice", d->rt->SetDevice(d->device));
	KVT_RT("cudaFree", d->rt->Free((void *)(uintptr_t)ptr));
	return kvt_ok();
}

static void kvt_nvrtc_version(const kvt_nvrtc *nv, int *major, int *minor) {
	if (nv->Version(major, minor) != 0) *major = *minor = 0;
}
