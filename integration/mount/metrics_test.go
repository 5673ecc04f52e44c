package mount_test

import (
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvtierfs/kvtierfs/integration/mounttest"
)

// TestMetricsIdleConnectionsCannotStarveStores: a daemon limited to 512
// descriptors (prlimit) meets 600 idle connections to its metrics port, as
// any local user can open on loopback. The endpoint accepts a bounded few
// and closes idle ones, so the engine's stores still find descriptors (they
// failed with EIO once the daemon held one per connection) and a scrape
// arriving after them is answered.
func TestMetricsIdleConnectionsCannotStarveStores(t *testing.T) {
	d := mounttest.Start(t, mounttest.Options{Args: []string{"--metrics-addr", "127.0.0.1:0"},
		Wrapper: []string{"prlimit", "--nofile=512:512", "--"}})
	m := regexp.MustCompile(`metrics=http://(\S+)/metrics`).FindStringSubmatch(d.Log())
	if m == nil {
		t.Fatalf("the daemon did not log its metrics address:\n%s", d.Log())
	}
	var idle []net.Conn
	for range 600 {
		c, err := net.Dial("tcp", m[1])
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	// A scrape arriving after them is answered: the endpoint closes the
	// oldest connections that sent nothing to make room for it.
	scrape, err := net.Dial("tcp", m[1])
	if err != nil {
		t.Fatal(err)
	}
	defer scrape.Close()
	if _, err := scrape.Write([]byte("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	scrape.SetReadDeadline(time.Now().Add(5 * time.Minute))
	if reply, err := io.ReadAll(scrape); err != nil || !strings.Contains(string(reply), "kvtierfs_") {
		t.Fatalf("scrape among idle connections: %v, reply %.200q", err, reply)
	}

	tier := openTier(t, d)
	region := newRegion(t, 4)
	for i := range 4 {
		path := storeBlock(t, tier, region.Row(i), i)
		if err := tier.Load(path, region.Row(i)); err != nil {
			t.Fatalf("load %d while idle connections are open: %v", i, err)
		}
	}

	// Connections closed by their client leave the backlog at once.
	for _, c := range idle {
		c.Close()
	}
	client := http.Client{Timeout: 5 * time.Minute}
	resp, err := client.Get("http://" + m[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s", resp.Status)
	}
}
