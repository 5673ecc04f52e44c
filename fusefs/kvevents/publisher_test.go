package kvevents

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"
)

// Block paths in the engine's layout and the hashes vLLM reports for them
// (the low 64 bits of the name, see TestBlockHash).
const (
	blockG2   = "M_0123456789ab_r0/b18/ef_g2/b18efa847f7a3fa48fe0aafd4a6250aa5129740e05126859377af20cedafdeee.bin"
	blockG2ID = uint64(3997773756585991918)
	blockG0   = "M_0123456789ab_r0/012/34_g0/0123456789abcdef0123456789abcdef.bin"
	blockG0ID = uint64(81985529216486895)
)

// subscriber is a SUB socket of the test.
type subscriber struct {
	zmq4.Socket
	msgs chan zmq4.Msg
}

// subscribe opens a SUB socket for topic; connect or bind it with its methods.
func subscribe(t *testing.T) *subscriber {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &subscriber{Socket: zmq4.NewSub(ctx), msgs: make(chan zmq4.Msg, 16)}
	t.Cleanup(func() {
		cancel()
		s.Close()
	})
	return s
}

// receive starts delivering the socket's messages to s.msgs.
func (s *subscriber) receive(t *testing.T, topic string) {
	t.Helper()
	if err := s.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			msg, err := s.Recv()
			if err != nil {
				close(s.msgs)
				return
			}
			s.msgs <- msg
		}
	}()
}

// next is the next message, failing the test when none comes.
func (s *subscriber) next(t *testing.T) zmq4.Msg {
	t.Helper()
	select {
	case msg, ok := <-s.msgs:
		if !ok {
			t.Fatal("subscriber closed")
		}
		return msg
	case <-time.After(30 * time.Second):
		t.Fatal("no KV event batch received")
	}
	return zmq4.Msg{}
}

// waitSubscribed waits until the publisher's socket knows a subscription.
func waitSubscribed(t *testing.T, p *Publisher) {
	t.Helper()
	for range 3000 {
		if p.subscribed() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the subscription never reached the publisher")
}

// removedEvent is a decoded BlockRemoved.
type removedEvent struct {
	Hashes []uint64
	Medium string
	Group  uint64
}

// decodeBatch decodes a KVEventBatch of BlockRemoved events with a msgpack
// library independent of the encoder, checking every field vLLM's msgspec
// decoder needs.
func decodeBatch(t *testing.T, payload []byte) []removedEvent {
	t.Helper()
	var batch []any
	if err := msgpack.Unmarshal(payload, &batch); err != nil {
		t.Fatalf("decoding batch: %v", err)
	}
	if len(batch) != 3 {
		t.Fatalf("batch %v: want [ts, events, data_parallel_rank]", batch)
	}
	if ts, ok := batch[0].(float64); !ok || time.Since(time.Unix(0, int64(ts*1e9))).Abs() > time.Hour {
		t.Fatalf("ts %#v: want float64 Unix seconds of now", batch[0])
	}
	if rank := toUint(t, batch[2]); rank != 0 {
		t.Fatalf("data_parallel_rank %d, want 0", rank)
	}
	raw, ok := batch[1].([]any)
	if !ok {
		t.Fatalf("events %#v: want an array", batch[1])
	}
	var events []removedEvent
	for _, r := range raw {
		m, ok := r.(map[string]any)
		if !ok || len(m) != 4 || m["type"] != "BlockRemoved" {
			t.Fatalf("event %#v: want a map tagged BlockRemoved with block_hashes, medium, group_idx", r)
		}
		var ev removedEvent
		for _, h := range m["block_hashes"].([]any) {
			ev.Hashes = append(ev.Hashes, toUint(t, h))
		}
		ev.Medium, _ = m["medium"].(string)
		ev.Group = toUint(t, m["group_idx"])
		events = append(events, ev)
	}
	return events
}

func toUint(t *testing.T, v any) uint64 {
	t.Helper()
	switch x := reflect.ValueOf(v); {
	case x.CanUint():
		return x.Uint()
	case x.CanInt() && x.Int() >= 0:
		return uint64(x.Int())
	}
	t.Fatalf("%#v is not a non-negative integer", v)
	return 0
}

// seqOf checks a message's framing (topic, 8-byte sequence number, payload)
// and returns its sequence number.
func seqOf(t *testing.T, msg zmq4.Msg, topic string) uint64 {
	t.Helper()
	if len(msg.Frames) != 3 || string(msg.Frames[0]) != topic || len(msg.Frames[1]) != 8 {
		t.Fatalf("message frames %q: want topic %q, 8-byte sequence number, payload", msg.Frames, topic)
	}
	return binary.BigEndian.Uint64(msg.Frames[1])
}

// TestPublisherBindsAndSendsBlockRemoved publishes on a bound ipc endpoint:
// blocks become one BlockRemoved per group, other paths are ignored.
func TestPublisherBindsAndSendsBlockRemoved(t *testing.T) {
	endpoint := "ipc://" + filepath.Join(t.TempDir(), "events.sock")
	p, err := Start(Options{Endpoint: endpoint, Topic: "kv@node"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sub := subscribe(t)
	if err := sub.Dial(endpoint); err != nil {
		t.Fatal(err)
	}
	sub.receive(t, "kv@")
	waitSubscribed(t, p)

	p.BlockGone("M_0123456789ab_r0/config.json")
	p.BlockGone(blockG2 + "_0123abc.tmp")
	p.BlockGone(blockG2)
	msg := sub.next(t)
	if seq := seqOf(t, msg, "kv@node"); seq != 0 {
		t.Fatalf("first batch has sequence number %d, want 0", seq)
	}
	got := decodeBatch(t, msg.Frames[2])
	want := []removedEvent{{Hashes: []uint64{blockG2ID}, Medium: "STORAGE", Group: 2}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("events %+v, want %+v", got, want)
	}
	if published, dropped := p.Counts(); published != 1 || dropped != 0 {
		t.Fatalf("published %d, dropped %d; want 1, 0", published, dropped)
	}
}

// TestPublisherDropsWhenQueueFull fills the queue before the publisher runs:
// BlockGone neither blocks nor queues past it, the drops are counted, and the
// next batch's sequence number skips one so subscribers see the loss.
func TestPublisherDropsWhenQueueFull(t *testing.T) {
	endpoint := "ipc://" + filepath.Join(t.TempDir(), "events.sock")
	p, err := open(Options{Endpoint: endpoint, QueueLen: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sub := subscribe(t)
	if err := sub.Dial(endpoint); err != nil {
		t.Fatal(err)
	}
	sub.receive(t, "")
	waitSubscribed(t, p)

	p.BlockGone(blockG0)
	p.BlockGone(blockG2)
	p.BlockGone(blockG2)
	if _, dropped := p.Counts(); dropped != 2 {
		t.Fatalf("dropped %d, want 2", dropped)
	}
	p.running.Go(p.run)
	msg := sub.next(t)
	if seq := seqOf(t, msg, ""); seq != 1 {
		t.Fatalf("batch after drops has sequence number %d, want 1 (a gap)", seq)
	}
	got := decodeBatch(t, msg.Frames[2])
	want := []removedEvent{{Hashes: []uint64{blockG0ID}, Medium: "STORAGE", Group: 0}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("events %+v, want %+v", got, want)
	}
}

// TestPublisherConnectsWhenRouterComesUp starts a connecting publisher before
// anything listens at its endpoint: it keeps trying and publishes once the
// router's SUB socket is bound.
func TestPublisherConnectsWhenRouterComesUp(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	endpoint := "tcp://" + addr
	p, err := Start(Options{Endpoint: endpoint})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sub := subscribe(t)
	if err := sub.Listen(endpoint); err != nil {
		t.Fatal(err)
	}
	sub.receive(t, "")
	waitSubscribed(t, p)
	p.BlockGone(blockG0)
	if got := decodeBatch(t, sub.next(t).Frames[2]); len(got) != 1 || !reflect.DeepEqual(got[0].Hashes, []uint64{blockG0ID}) {
		t.Fatalf("events %+v, want block %d", got, blockG0ID)
	}
}

// TestCheckEndpoint accepts what vLLM's publisher takes and names the rest.
func TestCheckEndpoint(t *testing.T) {
	for _, ok := range []string{"tcp://*:5557", "tcp://0.0.0.0:5557", "tcp://127.0.0.1:5557", "tcp://[::]:5557", "ipc:///run/kv.sock"} {
		if err := CheckEndpoint(ok); err != nil {
			t.Errorf("%s refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"127.0.0.1:5557", "udp://*:5557", "tcp://", "http://router", "tcp://*", "inproc://kv", "tcp://1.*.3.4:5557"} {
		if err := CheckEndpoint(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// TestParseEndpointBindsLoopbackByDefault: vLLM's bind-all wildcards bind
// the loopback address unless BindAll is set; other addresses are dialled.
func TestParseEndpointBindsLoopbackByDefault(t *testing.T) {
	cases := []struct {
		endpoint string
		bindAll  bool
		network  string
		address  string
		bind     bool
	}{
		{"tcp://*:5557", false, "tcp", "127.0.0.1:5557", true},
		{"tcp://0.0.0.0:5557", false, "tcp", "127.0.0.1:5557", true},
		{"tcp://[::]:5557", false, "tcp", "[::1]:5557", true},
		{"tcp://*:5557", true, "tcp", ":5557", true},
		{"tcp://[::]:5557", true, "tcp", ":5557", true},
		{"tcp://[fd00::7]:5557", false, "tcp", "[fd00::7]:5557", true},
		{"tcp://router:5557", true, "tcp", "router:5557", false},
		{"ipc:///run/kv.sock", false, "unix", "/run/kv.sock", true},
	}
	for _, c := range cases {
		network, address, bind, err := parseEndpoint(c.endpoint, c.bindAll)
		if err != nil || network != c.network || address != c.address || bind != c.bind {
			t.Errorf("%s (bind all %v): %s %s bind %v, %v; want %s %s bind %v", c.endpoint, c.bindAll,
				network, address, bind, err, c.network, c.address, c.bind)
		}
	}
}

// hugeFrameClaim is a peer's valid ZMTP 3.0 NULL greeting followed by one
// frame header claiming 1 TiB: 73 bytes.
func hugeFrameClaim() []byte {
	msg := make([]byte, 64, 73)
	msg[0], msg[9], msg[10] = 0xFF, 0x7F, 3
	copy(msg[12:], "NULL")
	msg = append(msg, flagLong)
	return binary.BigEndian.AppendUint64(msg, 1<<40)
}

// sendHugeFrameClaim sends hugeFrameClaim on conn and waits until the
// publisher closes the connection.
func sendHugeFrameClaim(t *testing.T, conn net.Conn) {
	t.Helper()
	defer conn.Close()
	if _, err := conn.Write(hugeFrameClaim()); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(time.Minute))
	buf := make([]byte, 4096)
	for {
		if _, err := conn.Read(buf); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("the publisher kept the connection of a peer claiming a 1 TiB frame")
			}
			return
		}
	}
}

// TestPublisherBoundSurvivesHugeFrameClaim: a bound publisher (on loopback,
// from tcp://*:0) meets a peer sending the 73 bytes that made go-zeromq
// allocate 1 TiB; it drops that peer and its real subscriber still
// receives events.
func TestPublisherBoundSurvivesHugeFrameClaim(t *testing.T) {
	p, err := Start(Options{Endpoint: "tcp://*:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	addr := p.Addr().(*net.TCPAddr)
	if !addr.IP.IsLoopback() {
		t.Fatalf("tcp://*:0 bound %s, want the loopback address", addr)
	}
	sub := subscribe(t)
	if err := sub.Dial("tcp://" + addr.String()); err != nil {
		t.Fatal(err)
	}
	sub.receive(t, "")
	waitSubscribed(t, p)

	attacker, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	sendHugeFrameClaim(t, attacker)

	p.BlockGone(blockG0)
	if got := decodeBatch(t, sub.next(t).Frames[2]); len(got) != 1 || !reflect.DeepEqual(got[0].Hashes, []uint64{blockG0ID}) {
		t.Fatalf("events %+v, want block %d", got, blockG0ID)
	}
}

// TestPublisherConnectingSurvivesHugeFrameClaim: a listener at the router's
// address answers a connecting publisher with the same 73 bytes; the
// publisher drops it, dials again, and the real router's SUB socket bound
// there next receives events.
func TestPublisherConnectingSurvivesHugeFrameClaim(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "tcp://" + l.Addr().String()
	p, err := Start(Options{Endpoint: endpoint})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	attacker, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	sendHugeFrameClaim(t, attacker)
	l.Close()

	sub := subscribe(t)
	if err := sub.Listen(endpoint); err != nil {
		t.Fatal(err)
	}
	sub.receive(t, "")
	waitSubscribed(t, p)
	p.BlockGone(blockG2)
	if got := decodeBatch(t, sub.next(t).Frames[2]); len(got) != 1 || !reflect.DeepEqual(got[0].Hashes, []uint64{blockG2ID}) {
		t.Fatalf("events %+v, want block %d", got, blockG2ID)
	}
}

// TestReadFrameRefusesOversizedHeader: a header claiming more than a
// subscriber sends is refused from its 9 bytes alone.
func TestReadFrameRefusesOversizedHeader(t *testing.T) {
	header := binary.BigEndian.AppendUint64([]byte{flagLong}, 1<<40)
	if _, _, err := readFrame(bufio.NewReader(bytes.NewReader(header))); !errors.Is(err, errFrameTooLarge) {
		t.Fatalf("readFrame of a 1 TiB header: %v, want %v", err, errFrameTooLarge)
	}
	short := appendFrame(nil, 0, []byte{1, 'k', 'v'})
	if flags, body, err := readFrame(bufio.NewReader(bytes.NewReader(short))); err != nil || flags != 0 || string(body) != "\x01kv" {
		t.Fatalf("readFrame of a subscription: flags %d body %q, %v", flags, body, err)
	}
}

// TestPublisherReconnectsAfterRouterRestart: a connecting publisher whose
// router goes away reaches the router's next socket at the same address.
func TestPublisherReconnectsAfterRouterRestart(t *testing.T) {
	first := subscribe(t)
	if err := first.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	endpoint := "tcp://" + first.Addr().String()
	first.receive(t, "")
	p, err := Start(Options{Endpoint: endpoint})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitSubscribed(t, p)
	p.BlockGone(blockG0)
	first.next(t)
	first.Close()

	second := subscribe(t)
	if err := second.Listen(endpoint); err != nil {
		t.Fatal(err)
	}
	second.receive(t, "")
	// Batches sent before the new subscription arrives are lost, as with
	// any PUB socket: send until one gets through.
	for range 600 {
		p.BlockGone(blockG2)
		select {
		case msg := <-second.msgs:
			if got := decodeBatch(t, msg.Frames[2]); got[0].Hashes[0] != blockG2ID {
				t.Fatalf("events %+v after reconnecting, want block %d", got, blockG2ID)
			}
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatal("nothing received after the router came back")
}

// rawPeer is a hand-driven ZMTP 3.1 peer of the test.
type rawPeer struct {
	conn net.Conn
	in   *bufio.Reader
}

// dialRaw connects to a bound publisher and exchanges greetings and READY
// as a socket of type socketType speaking ZMTP 3.1.
func dialRaw(t *testing.T, p *Publisher, socketType string) *rawPeer {
	t.Helper()
	conn, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r, err := handshakeRaw(conn, socketType)
	if err != nil {
		t.Fatalf("publisher's greeting: %v", err)
	}
	return r
}

// handshakeRaw exchanges greetings and READY on conn as dialRaw does.
func handshakeRaw(conn net.Conn, socketType string) (*rawPeer, error) {
	conn.SetDeadline(time.Now().Add(time.Minute))
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xFF, 0x7F, 3, 1
	copy(g[12:], "NULL")
	props := append([]byte{byte(len("Socket-Type"))}, "Socket-Type"...)
	props = binary.BigEndian.AppendUint32(props, uint32(len(socketType)))
	props = append(props, socketType...)
	if _, err := conn.Write(append(g, appendCommand(nil, "READY", props)...)); err != nil {
		return nil, err
	}
	r := &rawPeer{conn: conn, in: bufio.NewReader(conn)}
	return r, readGreeting(r.in)
}

// TestPublisherSpeaksZMTP31 drives a peer by hand: READY with its socket
// type, a ZMTP 3.1 SUBSCRIBE command, a PING answered by a PONG with the
// same context, then the topic's batch; a peer of another socket type is
// refused after the handshake.
func TestPublisherSpeaksZMTP31(t *testing.T) {
	p, err := Start(Options{Endpoint: "tcp://*:0", Topic: "kv@node"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sub := dialRaw(t, p, "SUB")
	flags, body, err := readFrame(sub.in)
	if name, props, _ := command(body); err != nil || flags != flagCommand || name != "READY" {
		t.Fatalf("publisher's READY: %v, flags %d, %q", err, flags, body)
	} else if typ, err := socketType(props); err != nil || typ != "PUB" {
		t.Fatalf("publisher's socket type %q, %v", typ, err)
	}
	ping := append([]byte{0, 10}, "ctx"...)
	if _, err := sub.conn.Write(append(appendCommand(nil, "SUBSCRIBE", []byte("kv@")), appendCommand(nil, "PING", ping)...)); err != nil {
		t.Fatal(err)
	}
	if _, body, err := readFrame(sub.in); err != nil {
		t.Fatal(err)
	} else if name, data, _ := command(body); name != "PONG" || string(data) != "ctx" {
		t.Fatalf("answer to PING: %q %q, want PONG ctx", name, data)
	}
	waitSubscribed(t, p)
	p.BlockGone(blockG0)
	var frames [][]byte
	for {
		flags, body, err := readFrame(sub.in)
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, body)
		if flags&flagMore == 0 {
			break
		}
	}
	if len(frames) != 3 || string(frames[0]) != "kv@node" {
		t.Fatalf("frames %q: want topic, sequence number, payload", frames)
	}
	if got := decodeBatch(t, frames[2]); len(got) != 1 || !reflect.DeepEqual(got[0].Hashes, []uint64{blockG0ID}) {
		t.Fatalf("events %+v, want block %d", got, blockG0ID)
	}

	push := dialRaw(t, p, "PUSH")
	readFrame(push.in) // the publisher's READY
	if _, _, err := readFrame(push.in); err == nil {
		t.Fatal("a PUSH peer was kept")
	}
}

// TestPublisherDropsPeersThatNeverSubscribe: a peer that completes its
// handshake and then only holds its connection loses it.
func TestPublisherDropsPeersThatNeverSubscribe(t *testing.T) {
	p, err := Start(Options{Endpoint: "tcp://*:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	idle := dialRaw(t, p, "SUB")
	readFrame(idle.in) // the publisher's READY
	if _, _, err := readFrame(idle.in); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a peer without a subscription kept its connection: %v", err)
	}
}

// dialAs connects to a bound publisher's loopback address from a socket
// owned by uid: the socket is made under that fsuid, on this thread only,
// and the kernel's sock_diag reports it as that user's.
func dialAs(t *testing.T, p *Publisher, uid int) net.Conn {
	t.Helper()
	addr := p.Addr().(*net.TCPAddr)
	return dialFrom(t, [4]byte(addr.IP.To4()), addr.Port, uid)
}

// subscribeRaw completes a SUB peer's subscription to every topic and
// tells whether the publisher kept the connection: it answers a PING.
func subscribeRaw(sub *rawPeer) error {
	if _, _, err := readFrame(sub.in); err != nil { // the publisher's READY
		return err
	}
	ping := append([]byte{0, 10}, "alive"...)
	if _, err := sub.conn.Write(append(appendCommand(nil, "SUBSCRIBE", nil), appendCommand(nil, "PING", ping)...)); err != nil {
		return err
	}
	_, body, err := readFrame(sub.in)
	if err != nil {
		return err
	}
	if name, data, _ := command(body); name != "PONG" || string(data) != "alive" {
		return fmt.Errorf("answer to PING: %q %q", name, data)
	}
	return nil
}

// TestOneUserCannotTakeEverySlot: one local user opens maxPeers valid,
// subscribed SUB connections to the loopback publisher; main served them
// all and closed every later one, so the operator's router, another user,
// could not subscribe. A source keeps at most maxPeersPerSource, and a
// subscriber of another uid still gets in and receives the batches.
func TestOneUserCannotTakeEverySlot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a socket of another uid needs root (setfsuid)")
	}
	// The source of a loopback peer is its uid, told by the kernel's
	// sock_diag. qemu-user emulates no NETLINK_SOCK_DIAG socket (only a few
	// netlink protocols): there this test needs a real arm64 kernel.
	if fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG); err == nil {
		unix.Close(fd)
	} else if errors.Is(err, unix.EPROTONOSUPPORT) {
		t.Skipf("no NETLINK_SOCK_DIAG socket here (%v): qemu-user; run on a real kernel", err)
	}
	p, err := Start(Options{Endpoint: "tcp://*:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const flooder, router = 4711, 4712
	kept := 0
	for range maxPeers {
		conn := dialAs(t, p, flooder)
		if sub, err := handshakeRaw(conn, "SUB"); err == nil && subscribeRaw(sub) == nil {
			kept++
		}
	}
	if kept > maxPeersPerSource {
		t.Errorf("one uid holds %d subscribed connections, want at most %d", kept, maxPeersPerSource)
	}
	sub, err := handshakeRaw(dialAs(t, p, router), "SUB")
	if err == nil {
		err = subscribeRaw(sub)
	}
	if err != nil {
		t.Fatalf("another uid's subscriber, after one uid took %d connections: %v", kept, err)
	}
	p.BlockGone(blockG0)
	var frames [][]byte
	for {
		flags, body, err := readFrame(sub.in)
		if err != nil {
			t.Fatalf("another uid's subscriber: %v", err)
		}
		frames = append(frames, body)
		if flags&flagMore == 0 {
			break
		}
	}
	if len(frames) != 3 {
		t.Fatalf("another uid's subscriber got frames %q, want topic, sequence number, payload", frames)
	}
}
