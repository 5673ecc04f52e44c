package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// composeService is the part of a Compose service the checks read.
type composeService struct {
	Image       string   `yaml:"image"`
	Command     []string `yaml:"command"`
	Devices     []string `yaml:"devices"`
	CapAdd      []string `yaml:"cap_add"`
	SecurityOpt []string `yaml:"security_opt"`
	Volumes     []struct {
		Type   string `yaml:"type"`
		Source string `yaml:"source"`
		Target string `yaml:"target"`
		Bind   struct {
			Propagation string `yaml:"propagation"`
		} `yaml:"bind"`
	} `yaml:"volumes"`
	Healthcheck struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	DependsOn map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
}

// bindOf returns the source and propagation of the bind mount whose target
// is path or holds it; ok is false when none does.
func (s composeService) bindOf(path string) (source, propagation string, ok bool) {
	for _, v := range s.Volumes {
		if v.Type == "bind" && (path == v.Target || strings.HasPrefix(path, v.Target+"/")) {
			return v.Source + strings.TrimPrefix(path, v.Target), v.Bind.Propagation, true
		}
	}
	return "", "", false
}

// dockerfile is the instructions of deploy/docker/Dockerfile, by keyword.
func dockerfile(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open(filepath.Join(deployDir, "docker", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		keyword, rest, _ := strings.Cut(line, " ")
		out[strings.ToUpper(keyword)] = append(out[strings.ToUpper(keyword)], strings.TrimSpace(rest))
	}
	return out
}

// TestDockerImageAndCompose checks the image and the Compose set-up against
// the binary and the Kubernetes files: the image holds only the binary of
// its platform as `make release` names it, at the path the DaemonSet runs;
// the Compose daemon uses real flags, has /dev/fuse and CAP_SYS_ADMIN,
// propagates its mount (rshared) to the host and into the engine's
// container, shares the host's /dev/shm where its --shm-glob looks, and the
// engine starts only once the daemon's health check (kvtierfs stat of the
// mountpoint) passes, with the mountpoint as its fs tier's root.
func TestDockerImageAndCompose(t *testing.T) {
	df := dockerfile(t)
	if !slices.Equal(df["FROM"], []string{"scratch"}) || !slices.Contains(df["ARG"], "TARGETARCH") {
		t.Errorf("Dockerfile FROM %v, ARG %v: want FROM scratch and the platform's TARGETARCH", df["FROM"], df["ARG"])
	}
	var entrypoint []string
	if len(df["ENTRYPOINT"]) != 1 || json.Unmarshal([]byte(df["ENTRYPOINT"][0]), &entrypoint) != nil || len(entrypoint) != 1 {
		t.Fatalf("Dockerfile ENTRYPOINT %v: want one exec-form path", df["ENTRYPOINT"])
	}
	binary := entrypoint[0]
	// TestMakeRelease checks that the release holds kvtierfs-linux-ARCH.
	if len(df["COPY"]) != 1 || df["COPY"][0] != "kvtierfs-linux-${TARGETARCH} "+binary {
		t.Errorf("Dockerfile COPY %v: want the release binary kvtierfs-linux-${TARGETARCH} copied to %s", df["COPY"], binary)
	}
	workload, ok := readWorkloads(t)["DaemonSet/kvtierfs"]
	if !ok || len(workload.Spec.Template.Spec.Containers) == 0 {
		t.Fatal("no DaemonSet kvtierfs container in the Kubernetes manifests")
	}
	ds := workload.Spec.Template.Spec.Containers[0]

	var compose struct {
		Services map[string]composeService `yaml:"services"`
	}
	raw, err := os.ReadFile(filepath.Join(deployDir, "docker", "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	daemon, ok := compose.Services["kvtierfs"]
	if !ok {
		t.Fatalf("compose.yaml has no kvtierfs service among %v", compose.Services)
	}
	if daemon.Image != ds.Image {
		t.Errorf("compose runs image %q, the DaemonSet %q", daemon.Image, ds.Image)
	}
	if len(ds.Command) == 0 || ds.Command[0] != binary {
		t.Errorf("the DaemonSet runs %v, the image holds kvtierfs at %s", ds.Command, binary)
	}
	argv := daemon.Command
	checkCommandLine(t, "compose kvtierfs command", argv)
	if len(argv) < 2 || argv[0] != "mount" {
		t.Fatalf("compose runs kvtierfs %v, want mount MOUNTPOINT", argv)
	}
	mountpoint := argv[1]
	hostMount, propagation, ok := daemon.bindOf(mountpoint)
	if !ok || propagation != "rshared" {
		t.Errorf("the mountpoint %s is not below an rshared bind (%q): the host never sees the mount", mountpoint, propagation)
	}
	if !slices.ContainsFunc(daemon.Devices, func(d string) bool { return strings.HasPrefix(d, "/dev/fuse") }) || !slices.Contains(daemon.CapAdd, "SYS_ADMIN") {
		t.Errorf("the daemon lacks /dev/fuse or CAP_SYS_ADMIN: devices %v, cap_add %v", daemon.Devices, daemon.CapAdd)
	}
	glob := flagValue(argv, "--shm-glob")
	if src, _, ok := daemon.bindOf(filepath.Dir(glob)); !ok || src != filepath.Dir(glob) {
		t.Errorf("--shm-glob %q is not in the host's %s (bind %q)", glob, filepath.Dir(glob), src)
	}
	health, ok := kvtierfsArgs(daemon.Healthcheck.Test)
	if !ok || len(health) < 2 || health[0] != "stat" || health[1] != mountpoint || daemon.Healthcheck.Test[0] != "CMD" || daemon.Healthcheck.Test[1] != binary {
		t.Errorf("the health check %v does not run %s stat %s", daemon.Healthcheck.Test, binary, mountpoint)
	} else {
		checkCommandLine(t, "compose health check", health)
	}

	engine, ok := compose.Services["vllm"]
	if !ok {
		t.Fatal("compose.yaml has no vllm service (the engine's side)")
	}
	if dep := engine.DependsOn["kvtierfs"]; dep.Condition != "service_healthy" {
		t.Errorf("the engine waits for kvtierfs with %q, want service_healthy (the mount serves)", dep.Condition)
	}
	if src, prop, ok := engine.bindOf(mountpoint); !ok || src != hostMount || (prop != "rslave" && prop != "rshared") {
		t.Errorf("the engine sees %s as %q (%q), want the daemon's host mount %s with rslave propagation", mountpoint, src, prop, hostMount)
	}
	if src, _, ok := engine.bindOf(filepath.Dir(glob)); !ok || src != filepath.Dir(glob) {
		t.Errorf("the engine's %s is not the host's", filepath.Dir(glob))
	}
	checkEngineTier(t, engine.Command, mountpoint)
}
