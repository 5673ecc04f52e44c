package rowsync

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkMirror moves 112 rows of 8,601,600 bytes, half of each zero (the
// field's re-sync of 112 promoted rows), from one /dev/shm region to another
// over loopback. MB/s counts row bytes in every sub-benchmark, so the ratio
// of two sub-benchmarks is the ratio of their throughputs:
//
//	plain-tcp  the whole rows over one plain TCP connection, read straight
//	           into the destination rows, one acknowledgement per batch
//	mirror     Mirror.MirrorRow for one row after another
//	mirror-16  MirrorRow from 16 goroutines (the engine's 16 readers)
//	load-done  Node.LoadDone one after another: row identification among
//	           the 112 rows by digest (shm.Set.Confirm, as the daemon
//	           does) plus MirrorRow
//
// The serial ones also report the latency per row (p50, p99). Every one
// reports the CPU time of the whole process (sender and receiver) per row,
// which contention for the cores changes less than the throughput.
func BenchmarkMirror(b *testing.B) {
	const rows, rowBytes = 112, 8601600
	src, dst := shmRegion(b, rows, rowBytes), shmRegion(b, rows, rowBytes)
	for i := range rows {
		fillHalf(src.Row(i), uint64(i))
		fillHalf(dst.Row(i), rows+uint64(i)) // stale rows, and every page faulted in as the engine's would be
	}
	ctx := context.Background()

	b.Run("plain-tcp", func(b *testing.B) {
		client, server := tcpPair(b)
		go func() {
			for {
				for i := range rows {
					if _, err := io.ReadFull(server, dst.Row(i)); err != nil {
						return
					}
				}
				server.Write([]byte{1})
			}
		}()
		b.SetBytes(rows * rowBytes)
		ack := make([]byte, 1)
		defer reportCPU(b, rows)()
		for b.Loop() {
			for i := range rows {
				if _, err := client.Write(src.Row(i)); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := io.ReadFull(client, ack); err != nil {
				b.Fatal(err)
			}
		}
	})

	s, err := StartServer(ServerConfig{Listen: "127.0.0.1:0", Secret: testSecret, Region: func(int) (*Region, error) { return dst, nil }, RowBytes: dst.RowBytes(), Logf: discard})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	m, err := NewMirror(MirrorConfig{Peers: []string{s.Addr().String()}, Secret: testSecret, Deadline: time.Minute, Logf: discard})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	waitFor(b, "peer up", m.Healthy)

	b.Run("mirror", func(b *testing.B) {
		serialRows(b, rows, rowBytes, func(i int) error { return m.MirrorRow(ctx, src, i, src.Row(i)) })
	})

	b.Run("mirror-16", func(b *testing.B) {
		b.SetBytes(rows * rowBytes)
		defer reportCPU(b, rows)()
		for b.Loop() {
			var next atomic.Int64
			var wg sync.WaitGroup
			for range 16 {
				wg.Go(func() {
					for i := int(next.Add(1)) - 1; i < rows; i = int(next.Add(1)) - 1 {
						if err := m.MirrorRow(ctx, src, i, src.Row(i)); err != nil {
							b.Error(err)
						}
					}
				})
			}
			wg.Wait()
		}
	})

	b.Run("load-done", func(b *testing.B) {
		n := &Node{gate: NewGate(ModeOn, nil), mirror: m}
		serialRows(b, rows, rowBytes, func(i int) error { return n.LoadDone(ctx, src, src.Row(i)) })
	})
}

// serialRows calls do for every row, one after another, and reports the
// latency per row.
func serialRows(b *testing.B, rows, rowBytes int, do func(row int) error) {
	b.SetBytes(int64(rows * rowBytes))
	var lat []time.Duration
	defer reportCPU(b, rows)()
	for b.Loop() {
		for i := range rows {
			start := time.Now()
			if err := do(i); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1e3, "p50-ms/row")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1e3, "p99-ms/row")
}

// reportCPU starts counting the process's CPU time; the function it returns
// reports it per row, for b.N rounds of rows rows.
func reportCPU(b *testing.B, rows int) func() {
	start := cpuTime(b)
	return func() {
		b.ReportMetric(float64((cpuTime(b)-start).Microseconds())/1e3/float64(b.N*rows), "cpu-ms/row")
	}
}

// cpuTime returns the user and system time the process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(b *testing.B) (client, server net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	if server, err = ln.Accept(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// BenchmarkSealRow is the head's own work per mirrored row, without the
// peers: a RowWrite of one slot of 2,150,400 bytes (a row of 8,601,600 at
// four nodes) written to each of 1 or 3 peers' lanes in parallel, as
// Mirror.mirror does, each lane a connection that discards what it is
// given: the bulk sealed once under a fresh key by 1 or sealWorkers
// goroutines, each lane's frame up to it sealed in its own records, and the
// bulk's records written to every lane. MB/s counts the slot's bytes once
// per row; ns/op is the latency of a row, cpu-ms/row the process's CPU time.
func BenchmarkSealRow(b *testing.B) {
	const slotBytes = 2150400
	slot := make([]byte, slotBytes)
	fillHalf(slot, 1)
	for i := range slot { // no zero page: one extent
		slot[i] |= 1
	}
	extents := []Extent{{Off: 4300800, Data: slot}}
	for _, peers := range []int{1, 3} {
		for _, sealers := range []int{1, sealWorkers} {
			b.Run(fmt.Sprintf("peers=%d/sealers=%d", peers, sealers), func(b *testing.B) {
				lanes := make([]*channel, peers)
				for i := range lanes {
					lanes[i] = newChannel(scriptConn{Writer: io.Discard}, fixedCipher(), nil)
				}
				b.SetBytes(slotBytes)
				b.ReportAllocs()
				defer reportCPU(b, 1)()
				for b.Loop() {
					key, err := newBulkKey()
					if err != nil {
						b.Fatal(err)
					}
					bulk, err := sealBulk(key, extents, sealers, peers)
					if err != nil {
						b.Fatal(err)
					}
					var wg sync.WaitGroup
					for _, ch := range lanes {
						wg.Go(func() {
							msg := RowWrite{Row: 3, Rows: 128, RowBytes: 8601600}
							if err := ch.writeRow(&msg, bulk); err != nil {
								b.Error(err)
							}
							bulk.written()
						})
					}
					wg.Wait()
				}
			})
		}
	}
}
