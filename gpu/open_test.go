package gpu

import (
	"strings"
	"testing"
)

func TestOpenRejectsUnknownKind(t *testing.T) {
	_, _, err := Open("gpu0", 0)
	if err == nil {
		t.Fatal(`Open("gpu0") succeeded`)
	}
	for _, want := range []string{"--gpu", `"gpu0"`, "auto", "cuda", "host"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

func TestOpenHost(t *testing.T) {
	b, note, err := Open(KindHost, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.Name() != KindHost || !strings.Contains(note, "--gpu host") {
		t.Errorf("Open(host) = %s backend, note %q", b.Name(), note)
	}
}

// TestOpenAutoPicksCUDAWhenUsable checks auto against what the CUDA backend
// itself says about this machine.
func TestOpenAutoPicksCUDAWhenUsable(t *testing.T) {
	b, note, err := Open(KindAuto, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	t.Log(note)
	cuda, cudaErr := openCUDA(0)
	if cudaErr == nil {
		cuda.Close()
	}
	want := KindHost
	if cudaErr == nil {
		want = KindCUDA
	}
	if b.Name() != want {
		t.Errorf("--gpu auto chose %s, want %s (CUDA: %v)", b.Name(), want, cudaErr)
	}
}
