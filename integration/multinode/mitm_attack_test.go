//go:build kvtierfs_attack

// The attack harness of branch h-attack2: a man in the middle between a
// head and its peer. Run as root, in a network namespace of its own:
//
//	unshare -n sh -c 'ip link set lo up; KVT_MITM=1 go test -tags kvtierfs_attack -count=1 -run TestMITM -v ./integration/multinode/'
//
// KVT_MITM=hold runs the held-row attack: the held row arrives after its
// CommitBy and the peer does not write it (DESIGN "Lanes").
package multinode_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The head dials the peer's address; iptables redirects it to the proxy,
// whose own connections to the peer carry mark 1 and pass.

const bypassMark = 1

type unit struct {
	b   []byte // without the length prefix
	len int
}

// mitm sits between the head and one peer.
type mitm struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	attack  string // the next row frame's fate; "" passes
	hold    [][]byte
	holding bool
	release chan struct{}
	saved   [][]byte // bulk records of an earlier row (for replay)
	conns   []net.Conn
}

func startMITM(t *testing.T, upstream string) *mitm {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &mitm{ln: ln, upstream: upstream}
	_, port, _ := net.SplitHostPort(upstream)
	_, pport, _ := net.SplitHostPort(ln.Addr().String())
	rule := []string{"-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", "127.0.0.1", "--dport", port, "-m", "mark", "!", "--mark", strconv.Itoa(bypassMark), "-j", "REDIRECT", "--to-ports", pport}
	if out, err := exec.Command("iptables", rule...).CombinedOutput(); err != nil {
		t.Fatalf("iptables: %v %s", err, out)
	}
	t.Cleanup(func() {
		rule[2] = "-D"
		exec.Command("iptables", rule...).Run()
		ln.Close()
		m.mu.Lock()
		for _, c := range m.conns {
			c.Close()
		}
		m.mu.Unlock()
	})
	go m.accept()
	return m
}

func (m *mitm) set(attack string) {
	m.mu.Lock()
	m.attack = attack
	m.mu.Unlock()
}

func (m *mitm) accept() {
	for {
		c, err := m.ln.Accept()
		if err != nil {
			return
		}
		m.mu.Lock()
		rel, holding := m.release, m.holding
		m.mu.Unlock()
		if holding {
			<-rel // a lane reconnecting while a row is held waits
		}
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK, bypassMark)
			})
			return serr
		}}
		up, err := d.Dial("tcp", m.upstream)
		if err != nil {
			c.Close()
			continue
		}
		m.mu.Lock()
		m.conns = append(m.conns, c, up)
		m.mu.Unlock()
		go m.back(up, c)
		go m.forth(c, up)
	}
}

// back copies the peer's answers; "flip-ack" flips a bit of the first
// answer record after arming.
func (m *mitm) back(up, c net.Conn) {
	defer c.Close()
	units := readUnits(up)
	for u := range units {
		m.mu.Lock()
		if m.attack == "flip-ack" && len(u) > 2+16 {
			u[5] ^= 1
			m.attack = ""
		}
		m.mu.Unlock()
		if _, err := c.Write(u); err != nil {
			return
		}
	}
}

// readUnits splits a stream into length-prefixed units (handshake
// messages and records), each with its prefix.
func readUnits(r io.Reader) chan []byte {
	ch := make(chan []byte, 64)
	go func() {
		defer close(ch)
		for {
			var h [2]byte
			if _, err := io.ReadFull(r, h[:]); err != nil {
				return
			}
			n := int(binary.BigEndian.Uint16(h[:]))
			b := make([]byte, 2+n)
			copy(b, h[:])
			if _, err := io.ReadFull(r, b[2:]); err != nil {
				return
			}
			ch <- b
		}
	}()
	return ch
}

// forth forwards the head's records, applying the armed attack to the
// first row frame: its head record (the unit before the first full bulk
// record) and its bulk records.
func (m *mitm) forth(c, up net.Conn) {
	units := readUnits(c)
	var pending []byte
	var bulk [][]byte // the row's records being gathered: head + bulk
	inRow := false
	write := func(bs ...[]byte) bool {
		for _, b := range bs {
			if _, err := up.Write(b); err != nil {
				return false
			}
		}
		return true
	}
	finishRow := func() bool {
		// bulk[0] is the row's head record, the rest its bulk records.
		m.mu.Lock()
		attack := m.attack
		if attack != "" && attack != "flip-ack" {
			m.attack = ""
		}
		saved := m.saved
		if attack == "" {
			m.saved = bulk[1:]
		}
		m.mu.Unlock()
		rec := bulk
		switch attack {
		case "flip-bulk":
			rec[1][40] ^= 0x10
		case "flip-head":
			rec[0][10] ^= 0x01
		case "drop-bulk1":
			rec = append(rec[:2:2], rec[3:]...)
		case "dup-bulk0":
			rec = append([][]byte{rec[0], rec[1]}, rec[1:]...)
		case "swap-bulk":
			rec[1], rec[2] = rec[2], rec[1]
		case "replay-bulk":
			if len(saved) == len(rec)-1 {
				rec = append([][]byte{rec[0]}, saved...)
			}
		case "append-bulk":
			rec = append(rec, rec[len(rec)-1])
		case "truncate":
			write(rec[0], rec[1])
			up.Close()
			c.Close()
			return false
		case "hold":
			m.mu.Lock()
			m.holding, m.hold = true, rec
			rel := m.release
			m.mu.Unlock()
			// Keep the upstream open past the head's close, then deliver.
			go func() {
				<-rel
				write(rec...)
			}()
			return true
		}
		return write(rec...)
	}
	for {
		var u []byte
		var ok bool
		if pending != nil {
			select {
			case u, ok = <-units:
			case <-time.After(30 * time.Millisecond):
				if !write(pending) {
					return
				}
				pending = nil
				continue
			}
		} else {
			u, ok = <-units
		}
		if !ok {
			if pending != nil {
				write(pending)
			}
			m.mu.Lock()
			holding := m.holding
			m.mu.Unlock()
			if !holding {
				up.Close()
			}
			return
		}
		full := len(u) == 2+65535
		switch {
		case inRow:
			bulk = append(bulk, u)
			if !full { // the last bulk record
				inRow = false
				if !finishRow() {
					return
				}
				bulk = nil
			}
		case full && pending != nil:
			inRow, bulk, pending = true, [][]byte{pending, u}, nil
		default:
			if pending != nil && !write(pending) {
				return
			}
			pending = u
		}
	}
}

func TestMITM(t *testing.T) {
	head, peer := &node{region: newRegion(t, "A")}, &node{region: newRegion(t, "B")}
	secret, listen := secretFile(t), freeAddr(t)
	px := startMITM(t, listen)
	peer.mount(t, t.TempDir(), nil, "--listen", listen, "--row-bytes", strconv.Itoa(rowBytes), "--secret-file", secret)
	head.mount(t, t.TempDir(), nil, "--peer", listen, "--secret-file", secret, "--replicated-kv", "on")
	const chunks = 16
	storeChunks(t, head, peer, chunks, true)
	waitPeerUp(t, head)
	if os.Getenv("KVT_MITM") == "hold" {
		holdAttack(t, px, head, peer)
		return
	}
	attacks := []string{"", "flip-bulk", "flip-head", "drop-bulk1", "dup-bulk0", "swap-bulk", "replay-bulk", "append-bulk", "truncate", "flip-ack", "", "replay-bulk"}
	next := 0
	for _, a := range attacks {
		row := chunks + next%chunks
		i := next % chunks
		next++
		marker := bytes.Repeat([]byte{0xA5}, rowBytes)
		copy(peer.region.Row(row), marker)
		before := append([]byte(nil), peer.region.Row(row)...)
		px.set(a)
		same, err := promote(head, peer, i, row)
		px.set("")
		peerChanged := !bytes.Equal(before, peer.region.Row(row))
		t.Logf("attack %-12q: load err=%v identical=%v peerRowChanged=%v", a, err, same, peerChanged)
		if err == nil && !same {
			t.Errorf("attack %q: load returned but rows differ", a)
		}
		if err != nil && peerChanged {
			t.Errorf("attack %q: failed load changed the peer's row", a)
		}
		waitPeerUp(t, head)
		// It resumes:
		r2 := chunks + next%chunks
		same, err = promote(head, peer, next%chunks, r2)
		next++
		if err != nil || !same {
			t.Errorf("after attack %q: resume load err=%v identical=%v", a, err, same)
		}
	}
	st := head.daemon.Stats()
	t.Logf("head counters: mirrored %d auth_failures %d", st.Counters.RowsMirrored, st.Counters.AuthFailures)
}

// holdAttack: the proxy holds one row frame past the head's deadline and
// delivers it after the engine reused the row at every rank: the peer must
// count it late and leave the row as the engine wrote it.
func holdAttack(t *testing.T, px *mitm, head, peer *node) {
	const row = 20
	px.mu.Lock()
	px.release = make(chan struct{})
	px.mu.Unlock()
	px.set("hold")
	start := time.Now()
	_, err := promote(head, peer, 3, row)
	t.Logf("held load: err=%v after %v", err, time.Since(start))
	if err == nil {
		t.Fatal("held load succeeded")
	}
	// The load failed: the engine reuses row 20 for a new GPU->CPU store
	// of chunk 7 at every rank.
	writeKV(head.region.Row(row), 7, 0, true)
	writeKV(peer.region.Row(row), 7, 1, true)
	if !bytes.Equal(head.region.Row(row), peer.region.Row(row)) {
		t.Fatal("setup")
	}
	close(px.release)
	for deadline := time.Now().Add(20 * time.Second); peer.daemon.Stats().Counters.RowsLate == 0 && bytes.Equal(head.region.Row(row), peer.region.Row(row)); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the held row was neither counted late nor written")
		}
	}
	if !bytes.Equal(head.region.Row(row), peer.region.Row(row)) {
		want := make([]byte, rowBytes)
		writeKV(want, 3, 1, true)
		t.Errorf("the peer's row %d changed after the engine reused it: holds chunk 3 (the failed load's) = %v", row, bytes.Equal(want, peer.region.Row(row)))
	}
	if n := peer.daemon.Stats().Counters.RowsLate; n != 1 {
		t.Errorf("the peer's rows_late = %d, want 1", n)
	}
	waitPeerUp(t, head)
	t.Logf("peer up again: %+v", head.daemon.Stats().Peers)
}
