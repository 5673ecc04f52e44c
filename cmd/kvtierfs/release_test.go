package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// releaseArches are the architectures `make release` builds, with their ELF machine.
var releaseArches = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// `make release` builds a static binary per architecture with the version
// and commit stamped, a tarball of it with the deploy files, and checksums
// that match.
func TestMakeRelease(t *testing.T) {
	const version, commit = "v9.8.7-test", "abc123def456"
	dir := t.TempDir()
	release := exec.Command("make", "-C", "../..", "release", "RELEASE_DIR="+dir, "VERSION="+version, "COMMIT="+commit)
	if out, err := release.CombinedOutput(); err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	}
	sums := readSums(t, filepath.Join(dir, "SHA256SUMS"))
	var want []string
	for arch, machine := range releaseArches {
		bin := "kvtierfs-linux-" + arch
		tarball := "kvtierfs-" + version + "-linux-" + arch + ".tar.gz"
		want = append(want, bin, tarball)
		path := filepath.Join(dir, bin)
		checkStatic(t, path, arch, machine)
		info, err := buildinfo.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := setting(info, "GOARCH"); got != arch || setting(info, "CGO_ENABLED") != "0" || info.Main.Path != "github.com/kvtierfs/kvtierfs" {
			t.Errorf("%s: GOARCH %q, CGO_ENABLED %q, module %q", bin, got, setting(info, "CGO_ENABLED"), info.Main.Path)
		}
		// -trimpath keeps -ldflags out of the build information: the stamped
		// strings are looked for in the binary, and read from --version below.
		if raw, err := os.ReadFile(path); err != nil || !bytes.Contains(raw, []byte(version)) || !bytes.Contains(raw, []byte(commit)) {
			t.Errorf("%s holds no stamped version %s and commit %s (%v)", bin, version, commit, err)
		}
		if out, ran := runVersionOf(t, path, arch); ran {
			line := "kvtierfs " + version + " commit " + commit + " "
			if !strings.HasPrefix(out, line) || !strings.Contains(out, "linux/"+arch) || strings.Contains(out, "(devel)") {
				t.Errorf("%s --version = %q, want %q… linux/%s", bin, out, line, arch)
			}
		}
		for _, name := range []string{bin, tarball} {
			if got := fileSum(t, filepath.Join(dir, name)); sums[name] != got {
				t.Errorf("SHA256SUMS has %q for %s, the file's is %s", sums[name], name, got)
			}
		}
		checkTarball(t, filepath.Join(dir, tarball), "kvtierfs-"+version+"-linux-"+arch, fileSum(t, path))
		checkImage(t, dir, arch, fileSum(t, path))
	}
	if got := slices.Sorted(maps.Keys(sums)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("SHA256SUMS lists %v, want %v", got, slices.Sorted(slices.Values(want)))
	}
}

// checkImage builds deploy/docker/Dockerfile for linux/arch from the release
// in dir with podman, in a private store (FROM scratch: no registry), and
// checks that the image is that platform's, runs the binary as root, and
// holds the released binary at its entry point and nothing else. (Running
// the image needs cgroups this sandbox lacks; the Compose test checks the
// rest against the flags.)
func checkImage(t *testing.T, dir, arch, binSum string) {
	t.Helper()
	podman, err := exec.LookPath("podman")
	if err != nil {
		t.Fatalf("podman missing (make deps installs it): %v", err)
	}
	store := t.TempDir()
	// File locks in the store: podman's default shm locks leave
	// /dev/shm/libpod_lock behind, shared with every other podman run.
	conf := filepath.Join(store, "containers.conf")
	locks := filepath.Join(store, "tmp")
	if err := os.WriteFile(conf, []byte("[engine]\nlock_type = \"file\"\ntmp_dir = \""+locks+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(podman, append([]string{"--root", filepath.Join(store, "root"),
			"--runroot", filepath.Join(store, "run"), "--storage-driver", "vfs"}, args...)...)
		cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+conf)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("podman %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	tag := "localhost/kvtierfs-release-test:" + arch
	run("build", "--platform", "linux/"+arch, "-f", filepath.Join(deployDir, "docker", "Dockerfile"), "-t", tag, dir)
	if fi, err := os.Stat(filepath.Join(locks, "locks")); err != nil || !fi.IsDir() {
		t.Errorf("podman kept no locks in the test's %s (%v): its shm locks stay in /dev/shm", locks, err)
	}
	got := strings.TrimSpace(run("image", "inspect", tag, "--format", "{{.Os}}/{{.Architecture}} {{.Config.User}} {{json .Config.Entrypoint}}"))
	if want := `linux/` + arch + ` 0:0 ["/usr/local/bin/kvtierfs"]`; got != want {
		t.Errorf("image for %s: %s, want %s", arch, got, want)
	}
	archive := filepath.Join(store, arch+".tar")
	run("save", "--format", "docker-archive", "-o", archive, tag)
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var files []string
	outer := tar.NewReader(f)
	for {
		h, err := outer.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
		if !strings.HasSuffix(h.Name, ".tar") {
			continue
		}
		layer := tar.NewReader(outer)
		for {
			lh, err := layer.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s layer %s: %v", archive, h.Name, err)
			}
			if lh.Typeflag != tar.TypeReg {
				continue
			}
			files = append(files, lh.Name)
			sum := sha256.New()
			io.Copy(sum, layer)
			if lh.Name == "usr/local/bin/kvtierfs" && hex.EncodeToString(sum.Sum(nil)) != binSum {
				t.Errorf("image for %s holds another kvtierfs than the release's", arch)
			}
		}
	}
	if !slices.Equal(files, []string{"usr/local/bin/kvtierfs"}) {
		t.Errorf("image for %s holds %v, want the binary only", arch, files)
	}
}

// checkStatic checks that path is an executable for machine with no
// interpreter and no shared libraries.
func checkStatic(t *testing.T, path, arch string, machine elf.Machine) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Machine != machine || f.Type != elf.ET_EXEC {
		t.Errorf("%s: %v %v, want an executable for %v (%s)", path, f.Type, f.Machine, machine, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s is dynamically linked (%v)", path, p.Type)
		}
	}
}

// runVersionOf runs `path --version`, under qemu-user for another
// architecture; ran is false where neither can run it.
func runVersionOf(t *testing.T, path, arch string) (out string, ran bool) {
	t.Helper()
	cmd := exec.Command(path, "--version")
	if arch != runtime.GOARCH {
		qemu, err := exec.LookPath("qemu-" + map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[arch] + "-static")
		if err != nil {
			t.Logf("%s --version not run: no qemu-user for %s (make deps installs qemu-user-static)", path, arch)
			return "", false
		}
		cmd = exec.Command(qemu, path, "--version")
	}
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", path, err, b)
	}
	return string(b), true
}

// readSums parses a sha256sum file: name → hex digest.
func readSums(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sums := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("SHA256SUMS line %q is not sha256sum's", sc.Text())
		}
		sums[name] = sum
	}
	return sums
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// checkTarball checks that a release tarball holds, under top/, the binary
// (by its checksum) and its benchmark build, the README, the licence and
// every deploy file of the tree.
func checkTarball(t *testing.T, path, top, binSum string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{top + "/kvtierfs": false, top + "/kvtierfs-bench": false, top + "/README.md": false, top + "/LICENSE": false}
	err = filepath.WalkDir(deployDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(deployDir, p)
			want[top+"/deploy/"+filepath.ToSlash(rel)] = false
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if _, ok := want[h.Name]; ok {
			want[h.Name] = true
		}
		if h.Name == top+"/kvtierfs-bench" && h.Mode&0o111 == 0 {
			t.Errorf("%s: kvtierfs-bench is mode %o, want executable", path, h.Mode)
		}
		if h.Name == top+"/kvtierfs" {
			sum := sha256.New()
			io.Copy(sum, tr)
			if got := hex.EncodeToString(sum.Sum(nil)); got != binSum || h.Mode&0o111 == 0 {
				t.Errorf("%s: kvtierfs is %s mode %o, want the released binary %s, executable", path, got, h.Mode, binSum)
			}
		}
	}
	for name, found := range want {
		if !found {
			t.Errorf("%s lacks %s", path, name)
		}
	}
}

// setting is a build setting of a binary's build information.
func setting(info *buildinfo.BuildInfo, key string) string {
	for _, s := range info.Settings {
		if s.Key == key {
			return s.Value
		}
	}
	return ""
}
