package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"
)

// deployDir holds the deploy files, relative to this package.
const deployDir = "../../deploy"

// flagsOf returns the flag set subcommand name builds, by asking it for help.
func flagsOf(t *testing.T, name string) *pflag.FlagSet {
	t.Helper()
	c := commandNamed(name)
	if c == nil {
		t.Fatalf("deploy files run 'kvtierfs %s', which is not a command", name)
	}
	saved := usageOutput
	usageOutput = io.Discard
	defer func() { usageOutput = saved }()
	if err := c.run([]string{"--help"}); !errors.Is(err, pflag.ErrHelp) {
		t.Fatalf("kvtierfs %s --help: %v", name, err)
	}
	return flagSets[name]
}

// checkCommandLine checks that argv (after the kvtierfs binary) names a
// command and only flags that command has.
func checkCommandLine(t *testing.T, where string, argv []string) {
	t.Helper()
	if len(argv) == 0 {
		t.Errorf("%s: kvtierfs without a command", where)
		return
	}
	fl := flagsOf(t, argv[0])
	for _, arg := range argv[1:] {
		if !strings.HasPrefix(arg, "--") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
		if fl.Lookup(name) == nil {
			t.Errorf("%s: kvtierfs %s has no flag --%s", where, argv[0], name)
		}
	}
}

// kvtierfsArgs returns what follows the kvtierfs binary in argv, if it runs it.
func kvtierfsArgs(argv []string) ([]string, bool) {
	for i, a := range argv {
		if filepath.Base(a) == "kvtierfs" {
			return argv[i+1:], true
		}
	}
	return nil, false
}

// container is the part of a Kubernetes container spec the checks read.
type container struct {
	Name           string   `yaml:"name"`
	Image          string   `yaml:"image"`
	Command        []string `yaml:"command"`
	Args           []string `yaml:"args"`
	ReadinessProbe *probe   `yaml:"readinessProbe"`
	StartupProbe   *probe   `yaml:"startupProbe"`
	LivenessProbe  *probe   `yaml:"livenessProbe"`
	Resources      struct {
		Requests struct {
			Memory string `yaml:"memory"`
		} `yaml:"requests"`
	} `yaml:"resources"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	SecurityContext struct {
		Privileged   bool `yaml:"privileged"`
		Capabilities struct {
			Add []string `yaml:"add"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name             string `yaml:"name"`
		MountPath        string `yaml:"mountPath"`
		MountPropagation string `yaml:"mountPropagation"`
	} `yaml:"volumeMounts"`
}

// volume is a pod's volume: a host path or a Secret.
type volume struct {
	Name     string `yaml:"name"`
	HostPath *struct {
		Path string `yaml:"path"`
	} `yaml:"hostPath"`
	Secret *struct {
		SecretName  string `yaml:"secretName"`
		DefaultMode int    `yaml:"defaultMode"`
	} `yaml:"secret"`
}

// probe is a container's readiness, startup or liveness probe.
type probe struct {
	Exec struct {
		Command []string `yaml:"command"`
	} `yaml:"exec"`
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
	TimeoutSeconds int `yaml:"timeoutSeconds"`
}

// workload is a Kubernetes object with a pod template.
type workload struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		UpdateStrategy struct {
			Type          string `yaml:"type"`
			RollingUpdate *struct {
				MaxUnavailable any `yaml:"maxUnavailable"`
				MaxSurge       any `yaml:"maxSurge"`
			} `yaml:"rollingUpdate"`
		} `yaml:"updateStrategy"`
		Template struct {
			Metadata struct {
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"metadata"`
			Spec struct {
				Tolerations []struct {
					Key      string `yaml:"key"`
					Operator string `yaml:"operator"`
				} `yaml:"tolerations"`
				PriorityClassName string      `yaml:"priorityClassName"`
				HostNetwork       bool        `yaml:"hostNetwork"`
				InitContainers    []container `yaml:"initContainers"`
				Containers        []container `yaml:"containers"`
				Volumes           []volume    `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// readWorkloads decodes every document of the Kubernetes manifests.
func readWorkloads(t *testing.T) map[string]workload {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(deployDir, "kubernetes", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s/kubernetes: %v", deployDir, err)
	}
	out := map[string]workload{}
	for _, file := range files {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(f)
		dec.KnownFields(false)
		for {
			var w workload
			err := dec.Decode(&w)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			out[w.Kind+"/"+w.Metadata.Name] = w
		}
		f.Close()
	}
	return out
}

// TestKubernetesManifests checks the DaemonSet and the engine's pod: every
// kvtierfs command line in them uses real flags, the mount propagates to the
// host and into the engine, the daemon has /dev/fuse and CAP_SYS_ADMIN, a
// readiness probe and scrape annotations for its metrics port, and the
// engine's tier root is the daemon's mountpoint.
func TestKubernetesManifests(t *testing.T) {
	objects := readWorkloads(t)
	ds, ok := objects["DaemonSet/kvtierfs"]
	if !ok {
		t.Fatalf("no DaemonSet kvtierfs among %v", slices.Collect(maps.Keys(objects)))
	}
	checked := 0
	for key, w := range objects {
		for _, c := range append(w.Spec.Template.Spec.InitContainers, w.Spec.Template.Spec.Containers...) {
			if argv, ok := kvtierfsArgs(append(c.Command, c.Args...)); ok {
				checkCommandLine(t, key+" container "+c.Name, argv)
				checked++
			}
			if p := c.ReadinessProbe; p != nil {
				if argv, ok := kvtierfsArgs(p.Exec.Command); ok {
					checkCommandLine(t, key+" readiness probe of "+c.Name, argv)
					checked++
				}
			}
		}
	}
	if checked < 2 {
		t.Fatalf("found %d kvtierfs command lines in the manifests, want the mount and its probe", checked)
	}

	daemon := ds.Spec.Template.Spec.Containers[0]
	argv, _ := kvtierfsArgs(append(daemon.Command, daemon.Args...))
	if len(argv) < 2 || argv[0] != "mount" {
		t.Fatalf("the DaemonSet runs kvtierfs %v, want mount MOUNTPOINT", argv)
	}
	mountpoint := argv[1]
	hostPaths := map[string]string{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	propagated, fuse := "", false
	for _, m := range daemon.VolumeMounts {
		if m.MountPropagation == "Bidirectional" && strings.HasPrefix(mountpoint, m.MountPath+"/") {
			propagated = hostPaths[m.Name]
		}
		fuse = fuse || m.MountPath == "/dev/fuse" && hostPaths[m.Name] == "/dev/fuse"
	}
	if propagated == "" {
		t.Errorf("the mountpoint %s is not below a Bidirectional hostPath volume: the host never sees the mount", mountpoint)
	}
	if !fuse {
		t.Error("the daemon has no /dev/fuse")
	}
	sc := daemon.SecurityContext
	if !sc.Privileged || !slices.Contains(sc.Capabilities.Add, "SYS_ADMIN") {
		t.Errorf("the daemon is not privileged with SYS_ADMIN (Bidirectional propagation and FUSE mounts need both): %+v", sc)
	}
	if p := daemon.ReadinessProbe; p == nil || !slices.Contains(p.Exec.Command, "stat") || !slices.Contains(p.Exec.Command, mountpoint) {
		t.Errorf("the readiness probe does not stat the mountpoint %s", mountpoint)
	}
	metricsAddr := flagValue(daemon.Args, "--metrics-addr")
	ann := ds.Spec.Template.Metadata.Annotations
	if ann["prometheus.io/scrape"] != "true" || !strings.HasSuffix(metricsAddr, ":"+ann["prometheus.io/port"]) ||
		strings.HasPrefix(metricsAddr, "127.") {
		t.Errorf("scrape annotations %v do not reach --metrics-addr %q", ann, metricsAddr)
	}

	engine, ok := objects["Deployment/vllm"]
	if !ok {
		t.Fatal("no Deployment vllm (the engine's side)")
	}
	engineHostPaths := map[string]string{}
	for _, v := range engine.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			engineHostPaths[v.Name] = v.HostPath.Path
		}
	}
	vllm := engine.Spec.Template.Spec.Containers[0]
	checkEngineTier(t, vllm.Args, mountpoint)
	seen := false
	for _, m := range vllm.VolumeMounts {
		if engineHostPaths[m.Name] == propagated && m.MountPropagation == "HostToContainer" && strings.HasPrefix(mountpoint, m.MountPath+"/") {
			seen = true
		}
	}
	if !seen {
		t.Errorf("the engine does not mount host path %s with HostToContainer at the daemon's mountpoint's parent", propagated)
	}
}

// checkEngineTier checks that the engine's --kv-transfer-config in args
// names one secondary tier, the fs tier at mountpoint.
func checkEngineTier(t *testing.T, args []string, mountpoint string) {
	t.Helper()
	var config struct {
		Extra struct {
			SecondaryTiers []struct {
				Type    string `json:"type"`
				RootDir string `json:"root_dir"`
			} `json:"secondary_tiers"`
		} `json:"kv_connector_extra_config"`
	}
	if err := json.Unmarshal([]byte(flagValue(args, "--kv-transfer-config")), &config); err != nil {
		t.Fatalf("--kv-transfer-config of the engine: %v", err)
	}
	if tiers := config.Extra.SecondaryTiers; len(tiers) != 1 || tiers[0].Type != "fs" || tiers[0].RootDir != mountpoint {
		t.Errorf("the engine's secondary tiers %+v are not the fs tier at %s", tiers, mountpoint)
	}
}

// flagValue returns the value following flag in args, or after flag=.
func flagValue(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

// TestSystemdFiles checks that the unit's command lines and every flag in the
// env file, commented-out examples included, are real commands and flags.
func TestSystemdFiles(t *testing.T) {
	env := readEnvFile(t, filepath.Join(deployDir, "systemd", "kvtierfs.env"))
	if len(env["KVTIERFS_MOUNTPOINT"]) == 0 || len(env["KVTIERFS_FLAGS"]) == 0 {
		t.Fatalf("kvtierfs.env sets no KVTIERFS_MOUNTPOINT or KVTIERFS_FLAGS: %v", env)
	}
	for _, flags := range env["KVTIERFS_FLAGS"] {
		checkCommandLine(t, "kvtierfs.env", append([]string{"mount", env["KVTIERFS_MOUNTPOINT"][0]}, strings.Fields(flags)...))
	}
	unit, err := os.ReadFile(filepath.Join(deployDir, "systemd", "kvtierfs.service"))
	if err != nil {
		t.Fatal(err)
	}
	var directives []string
	for _, line := range strings.Split(string(unit), "\n") {
		key, value, ok := strings.Cut(line, "=")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		directives = append(directives, key+"="+value)
		if strings.HasPrefix(key, "Exec") {
			argv, ok := kvtierfsArgs(strings.Fields(strings.TrimLeft(value, "-")))
			if !ok {
				t.Errorf("%s does not run kvtierfs: %s", key, value)
				continue
			}
			checkCommandLine(t, "kvtierfs.service "+key, argv)
		}
	}
	for _, want := range []string{"Type=notify", "Restart=on-failure", "EnvironmentFile=/etc/kvtierfs/kvtierfs.env"} {
		if !slices.Contains(directives, want) {
			t.Errorf("kvtierfs.service lacks %s", want)
		}
	}
}

// readEnvFile reads KEY=VALUE lines, commented-out ones too, as systemd's
// EnvironmentFile does (quotes removed); a key may appear several times.
func readEnvFile(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		key, value, ok := strings.Cut(strings.TrimPrefix(line, "#"), "=")
		if !ok || strings.ContainsAny(key, " \t") {
			continue
		}
		env[key] = append(env[key], strings.Trim(value, `"`))
	}
	return env
}

// TestPrometheusAlertRules checks deploy/prometheus with promtool (Debian's
// prometheus package, installed by make deps): the rules load, and their
// unit tests (alerts that fire, and resolve once their cause is gone) pass.
func TestPrometheusAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("KVTIERFS_UNIT") != "" {
			t.Skip("promtool is missing (make deps installs the prometheus package)")
		}
		t.Fatal("promtool is missing: make deps installs the prometheus package")
	}
	dir := filepath.Join(deployDir, "prometheus")
	for _, args := range [][]string{{"check", "rules", "kvtierfs-alerts.yaml"}, {"test", "rules", "kvtierfs-alerts.test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestDaemonSetIsANodeAgent checks the DaemonSet against node-exporter's
// norms: it tolerates every taint, has the node-critical priority, a
// liveness probe on /healthz of the metrics port (behind a startup probe), a
// readiness probe whose stat gives up before the probe does, a memory
// request covering --staging-bytes plus the daemon's overhead, and a rolling
// update that never runs two daemons on one node.
func TestDaemonSetIsANodeAgent(t *testing.T) {
	objects := readWorkloads(t)
	for _, name := range []string{"DaemonSet/kvtierfs", "DaemonSet/kvtierfs-tp"} {
		ds, ok := objects[name]
		if !ok {
			t.Fatalf("no %s among the manifests", name)
		}
		t.Run(name, func(t *testing.T) { checkNodeAgent(t, ds) })
	}
}

// checkNodeAgent checks a DaemonSet against node-exporter's norms: every
// taint tolerated, node-critical priority, health probes, memory for its
// staging, one node at a time.
func checkNodeAgent(t *testing.T, ds workload) {
	spec := ds.Spec.Template.Spec
	tolerated := false
	for _, tol := range spec.Tolerations {
		tolerated = tolerated || tol.Operator == "Exists" && tol.Key == ""
	}
	if !tolerated {
		t.Errorf("tolerations %+v: want operator Exists without a key (every taint, as node-exporter)", spec.Tolerations)
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q, want system-node-critical", spec.PriorityClassName)
	}
	if len(spec.Containers) == 0 {
		t.Fatal("the DaemonSet has no container")
	}
	daemon := spec.Containers[0]
	var metricsPort string
	for _, p := range daemon.Ports {
		if strings.HasSuffix(flagValue(daemon.Args, "--metrics-addr"), fmt.Sprintf(":%d", p.ContainerPort)) {
			metricsPort = p.Name
		}
	}
	for name, p := range map[string]*probe{"liveness": daemon.LivenessProbe, "startup": daemon.StartupProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || metricsPort == "" || p.HTTPGet.Port != metricsPort {
			t.Errorf("the %s probe is not an HTTP GET of /healthz on the metrics port %q", name, metricsPort)
		}
	}
	if r := daemon.ReadinessProbe; r != nil {
		timeout, err := time.ParseDuration(flagValue(r.Exec.Command, "--timeout"))
		if err != nil || timeout <= 0 || timeout >= time.Duration(r.TimeoutSeconds)*time.Second {
			t.Errorf("the readiness probe's stat --timeout %q is not shorter than the probe's %ds: a hung daemon would fail the probe without a cause",
				flagValue(r.Exec.Command, "--timeout"), r.TimeoutSeconds)
		}
	}
	staging, err := parseSize("staging-bytes", flagValue(daemon.Args, "--staging-bytes"))
	if err != nil {
		t.Fatalf("the DaemonSet sets no --staging-bytes, so its memory depends on the node's RAM: %v", err)
	}
	request, err := parseQuantity(daemon.Resources.Requests.Memory)
	if err != nil {
		t.Fatalf("memory request: %v", err)
	}
	if need := staging + memoryOverhead; request < need {
		t.Errorf("memory request %s (%d bytes) is below --staging-bytes plus the overhead, %d bytes", daemon.Resources.Requests.Memory, request, need)
	}
	u := ds.Spec.UpdateStrategy
	if u.Type != "RollingUpdate" || u.RollingUpdate == nil || fmt.Sprint(u.RollingUpdate.MaxSurge) != "0" || fmt.Sprint(u.RollingUpdate.MaxUnavailable) != "1" {
		t.Errorf("update strategy %+v: want RollingUpdate, one node at a time, no surge (two daemons cannot serve one mountpoint)", u)
	}
}

// parseQuantity parses a Kubernetes memory quantity in bytes (Ki, Mi, Gi, Ti
// or none).
func parseQuantity(q string) (int64, error) {
	units := map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
	for suffix, unit := range units {
		if n, ok := strings.CutSuffix(q, suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			return v * unit, err
		}
	}
	return strconv.ParseInt(q, 10, 64)
}

// TestTPDaemonSetIsOneGroup checks the recipe for a tensor-parallel group:
// the node network, one peer list for every node (each daemon skips itself,
// integration/multinode TestOnePeerListForThree), the row size, and the
// peers' secret and the metrics token from a Secret only the daemon reads.
func TestTPDaemonSetIsOneGroup(t *testing.T) {
	ds, ok := readWorkloads(t)["DaemonSet/kvtierfs-tp"]
	if !ok {
		t.Fatal("no DaemonSet kvtierfs-tp")
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("hostNetwork is off: the peers' addresses are the nodes'")
	}
	args := spec.Containers[0].Args
	_, port, err := net.SplitHostPort(flagValue(args, "--listen"))
	if err != nil {
		t.Fatalf("--listen %q: %v", flagValue(args, "--listen"), err)
	}
	var peers []string
	for i, a := range args {
		if a == "--peer" && i+1 < len(args) {
			peers = append(peers, args[i+1])
		}
	}
	if len(peers) < 2 {
		t.Errorf("peers %v: want every node of the group (at least two), the same list on each", peers)
	}
	for _, p := range peers {
		if _, pp, err := net.SplitHostPort(p); err != nil || pp != port {
			t.Errorf("peer %q does not name the port the daemons --listen on (%s)", p, port)
		}
	}
	if rowBytes, err := parseSize("row-bytes", flagValue(args, "--row-bytes")); err != nil || rowBytes <= 0 || rowBytes%4096 != 0 {
		t.Errorf("--row-bytes %q: want a block file's size (%v)", flagValue(args, "--row-bytes"), err)
	}
	secrets := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.Secret != nil && v.Secret.DefaultMode == 0o400 {
			secrets[v.Name] = true
		}
	}
	for _, flag := range []string{"--secret-file", "--metrics-token-file"} {
		file, read := flagValue(args, flag), false
		for _, m := range spec.Containers[0].VolumeMounts {
			read = read || secrets[m.Name] && strings.HasPrefix(file, m.MountPath+"/")
		}
		if !read {
			t.Errorf("%s %q is not in a Secret volume of mode 0400", flag, file)
		}
	}
}
