package multinode_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestGrafanaDashboardMetricsExported scrapes the /metrics of a head node
// mirroring to a peer after a few promotions, and checks that every metric
// deploy/grafana/kvtierfs.json queries is exported, and that it has the
// panels an operator looks for; so is every metric of the alert rules.
func TestGrafanaDashboardMetricsExported(t *testing.T) {
	head, peer := &node{region: newRegion(t, "A")}, &node{region: newRegion(t, "B")}
	secret, listen, metrics := secretFile(t), freeAddr(t), freeAddr(t)
	peer.mount(t, t.TempDir(), nil, "--listen", listen, "--row-bytes", strconv.Itoa(rowBytes), "--secret-file", secret)
	head.mount(t, t.TempDir(), nil, "--peer", listen, "--secret-file", secret, "--metrics-addr", metrics)
	if identical := promoteAll(t, head, peer, 4); identical != 4 {
		t.Fatalf("%d of 4 promoted rows identical across nodes", identical)
	}
	exported := scrapeNames(t, "http://"+metrics+"/metrics")

	raw, err := os.ReadFile("../../deploy/grafana/kvtierfs.json")
	if err != nil {
		t.Fatal(err)
	}
	var dashboard struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dashboard); err != nil {
		t.Fatalf("kvtierfs.json: %v", err)
	}
	metricName := regexp.MustCompile(`kvtierfs_[a-z0-9_]+`)
	var queries []string
	titles := map[string]bool{}
	for _, p := range dashboard.Panels {
		titles[p.Title] = true
		for _, target := range p.Targets {
			queries = append(queries, target.Expr)
		}
	}
	for _, v := range dashboard.Templating.List {
		queries = append(queries, v.Definition)
	}
	referenced := 0
	for _, q := range queries {
		for _, name := range metricName.FindAllString(q, -1) {
			referenced++
			if !exported[name] {
				t.Errorf("the dashboard queries %s, which the daemon does not export (query %q)", name, q)
			}
		}
	}
	if referenced < 30 {
		t.Errorf("the dashboard references only %d metrics", referenced)
	}
	rules, err := os.ReadFile("../../deploy/prometheus/kvtierfs-alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range metricName.FindAllString(string(rules), -1) {
		if !exported[name] {
			t.Errorf("the alert rules use %s, which the daemon does not export", name)
		}
	}
	for _, title := range []string{"Store occupancy", "Lookup hit rate", "Throughput", "Load latency", "Store latency", "Peer links", "Warnings raised"} {
		if !titles[title] {
			t.Errorf("the dashboard has no %q panel", title)
		}
	}
	for _, name := range []string{"kvtierfs_peer_up", "kvtierfs_warning", "kvtierfs_rows_mirrored_total"} {
		if !exported[name] {
			t.Errorf("%s is not exported", name)
		}
	}
}

// scrapeNames returns the names of the samples a Prometheus endpoint serves.
func scrapeNames(t *testing.T, url string) map[string]bool {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		names[line[:strings.IndexAny(line, "{ ")]] = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}
