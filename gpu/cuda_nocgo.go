//go:build !cgo

package gpu

import "errors"

// errNoCgo explains why a binary built with CGO_ENABLED=0 has no CUDA backend.
var errNoCgo = errors.New("gpu: CUDA backend unavailable: binary built without cgo (CGO_ENABLED=0)")

// DeviceCount returns the number of CUDA devices; without cgo there is no CUDA.
func DeviceCount() (int, error) { return 0, errNoCgo }

func openCUDA(int) (Backend, error) { return nil, errNoCgo }
