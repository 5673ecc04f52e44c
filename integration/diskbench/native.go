//go:build cgo

package diskbench

/*
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <unistd.h>

// A load job: n block paths, read each into rows[i % nrows] with one
// open/readv/close, as vLLM's C batch loader does, on native threads.
struct kvt_loads {
	char **paths;
	int n;
	char *rows;
	long row_bytes;
	int nrows;
	int flags;
	atomic_int next;
	atomic_int failed;
};

static void *kvt_load_worker(void *arg) {
	struct kvt_loads *j = arg;
	for (;;) {
		int i = atomic_fetch_add(&j->next, 1);
		if (i >= j->n) return NULL;
		int fd = open(j->paths[i], O_RDONLY | O_CLOEXEC | j->flags);
		if (fd < 0) { atomic_fetch_add(&j->failed, 1); continue; }
		struct iovec iov = { j->rows + (long)(i % j->nrows) * j->row_bytes, (size_t)j->row_bytes };
		ssize_t got = readv(fd, &iov, 1);
		close(fd); // its error is ignored, as the engine's C loader does
		if (got != j->row_bytes) atomic_fetch_add(&j->failed, 1);
	}
}

static int kvt_load_all(char **paths, int n, char *rows, long row_bytes, int nrows, int threads, int direct) {
	struct kvt_loads j = { paths, n, rows, row_bytes, nrows, direct ? O_DIRECT : 0 };
	atomic_init(&j.next, 0);
	atomic_init(&j.failed, 0);
	pthread_t *tids = calloc(threads, sizeof(pthread_t));
	int started = 0;
	for (; started < threads; started++)
		if (pthread_create(&tids[started], NULL, kvt_load_worker, &j) != 0) break;
	for (int t = 0; t < started; t++) pthread_join(tids[t], NULL);
	free(tids);
	if (started == 0) return -1;
	return atomic_load(&j.failed);
}
*/
import "C"

import (
	"fmt"
	"time"
	"unsafe"
)

// nativeLoads loads every path into rows of dest (path i into row i mod
// rows) from threads native threads, each load one open, one readv of a row
// and a close whose error is ignored: vLLM's C batch loader, with no Go
// scheduler between the threads. It returns the wall time.
func nativeLoads(paths []string, dest []byte, rowBytes, threads int, direct bool) (time.Duration, error) {
	cpaths := make([]*C.char, len(paths))
	for i, p := range paths {
		cpaths[i] = C.CString(p)
	}
	defer func() {
		for _, p := range cpaths {
			C.free(unsafe.Pointer(p))
		}
	}()
	cdirect := C.int(0)
	if direct {
		cdirect = 1
	}
	// The C side gets its own copy of the path array: Go memory holding Go
	// pointers must not be passed to C.
	arr := (**C.char)(C.malloc(C.size_t(len(cpaths)) * C.size_t(unsafe.Sizeof(uintptr(0)))))
	defer C.free(unsafe.Pointer(arr))
	copy(unsafe.Slice(arr, len(cpaths)), cpaths)
	start := time.Now()
	failed := C.kvt_load_all(arr, C.int(len(paths)), (*C.char)(unsafe.Pointer(&dest[0])), C.long(rowBytes),
		C.int(len(dest)/rowBytes), C.int(threads), cdirect)
	elapsed := time.Since(start)
	switch {
	case failed < 0:
		return elapsed, fmt.Errorf("no load thread could be started")
	case failed > 0:
		return elapsed, fmt.Errorf("%d of %d loads failed", failed, len(paths))
	}
	return elapsed, nil
}
