package rowsync_test

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/kvtierfs/kvtierfs/sync/rowsync"
)

// Two nodes: the peer's Server receives rows of its own size into its region, the head's
// Mirror authenticates to it (Noise, the shared secret) and copies a row,
// returning once the peer acknowledged the row's checksum.
func Example() {
	secret := []byte("a secret of at least sixteen bytes")
	const rows, rowBytes = 4, 8192
	quiet := func(string, ...any) {}
	peerMem, headMem := make([]byte, rows*rowBytes), make([]byte, rows*rowBytes)
	peerRegion, _ := rowsync.NewRegion(peerMem, rowBytes)
	headRegion, _ := rowsync.NewRegion(headMem, rowBytes)

	server, err := rowsync.StartServer(rowsync.ServerConfig{Listen: "127.0.0.1:0", Secret: secret, Logf: quiet,
		Region: func(int) (*rowsync.Region, error) { return peerRegion, nil }, RowBytes: rowBytes})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer server.Close()
	mirror, err := rowsync.NewMirror(rowsync.MirrorConfig{Peers: []string{server.Addr().String()}, Secret: secret, Logf: quiet})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mirror.Close()
	for deadline := time.Now().Add(5 * time.Second); !mirror.Healthy() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}

	copy(headRegion.Row(2), "KV promoted into row 2")
	err = mirror.MirrorRow(context.Background(), headRegion, 2, bytes.Clone(headRegion.Row(2)))
	fmt.Println(err, bytes.Equal(peerRegion.Row(2), headRegion.Row(2)))
	// Output: <nil> true
}
