//go:build !cgo || !cuda

package gpu

import "errors"

// errNoCgo explains why a binary has no CUDA backend: the backend is linked
// only on request, so the daemon carries no cgo GPU code by default.
var errNoCgo = errors.New("gpu: CUDA backend unavailable: build with cgo and the cuda tag (make build TAGS=cuda)")

// DeviceCount returns the number of CUDA devices; without the backend there is no CUDA.
func DeviceCount() (int, error) { return 0, errNoCgo }

func openCUDA(int) (Backend, error) { return nil, errNoCgo }
