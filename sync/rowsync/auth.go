package rowsync

import (
	"bytes"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/flynn/noise"
)

// Mutual authentication: a Noise_NNpsk0_25519_AESGCM_SHA256 handshake
// (github.com/flynn/noise) whose pre-shared key is derived from the shared
// secret of --secret-file, which never travels.
//
//	client → server  e, payload Hello{Session, Node, To}        (sealed under the PSK)
//	server → client  e, ee, payload Welcome{Node, PeerList, Clock} (sealed under PSK and ee)
//	client → server  record 0: Ready                            (channel.go)
//
// Only a holder of the secret can seal or open either payload; fresh
// ephemeral keys on both sides make every session's keys new (and forward
// secret), so a recorded handshake replayed later leads nowhere: its replayer
// cannot send Ready. The prologue names the protocol and its version, so
// nodes of another version fail the handshake.
//
// A server that ends a handshake before its Welcome answers, in the clear,
// with a length no handshake message has: answerRefused for a refusal (the
// secret, the version, the address), answerFlooded for a handshake it
// closed to make room for others (Server.evictLocked). The client counts
// only the first as an authentication failure; a connection that ends
// without an answer is neither. An answer is unauthenticated, so anyone on
// the path can forge one, as they can cut the connection: it only names why.
//
// The secret is shared by every node, so the handshake alone would not tell
// the nodes apart: a relay could hand a node's own handshake back to it, or
// steer a client meant for one peer to another. Identity and direction are
// bound by the payloads, and every refusal counts as an authentication
// failure:
//   - Each node has a NodeID, random at start, which its Mirror and Server
//     share. A server answers a Hello from its own node and then ends the
//     handshake, and a client ends it at a Welcome from its own node: a
//     reflected handshake never yields a connection, and the client learns
//     that the address reached this node itself (self.go says when such an
//     entry of the peer list is skipped).
//   - Hello.To is the IP:port the client's connection reached. A server
//     refuses a Hello whose To is not the address the connection arrived at,
//     so a handshake meant for one node cannot be relayed to another. Peers must therefore reach each other
//     directly (--peer names an address the peer itself listens on, no NAT
//     or port mapping between nodes).
//
// Per-node static keys were the alternative; they would bind identities
// without the address rule, but every node would need a key pair and every
// peer's public key configured, where one secret file is all a deployment
// needs today.

// MinSecretBytes is the shortest shared secret accepted.
const MinSecretBytes = 16

// handshakeTimeout bounds dialing plus the handshake.
const handshakeTimeout = 5 * time.Second

// prologue binds the handshake to this protocol and version: 4 since a
// RowWrite's bulk is sealed once per row under a key of its own (channel.go).
const prologue = "kvtierfs rowsync 4"

// pskLabel separates the pre-shared key from other uses of the secret.
const pskLabel = "kvtierfs rowsync 2 psk"

// maxHandshakeMessage bounds a handshake message: an ephemeral key, a sealed
// frame of at most maxHandshakeFrame bytes and its tag.
const maxHandshakeMessage = 32 + maxHandshakeFrame + tagBytes

var cipherSuite = noise.NewCipherSuite(noise.DH25519, noise.CipherAESGCM, noise.HashSHA256)

// ErrAuth is wrapped by the errors of a failed handshake and of a record that
// fails authentication.
var ErrAuth = errors.New("rowsync: authentication failed")

// ErrFlooded is wrapped by the error of a handshake the peer's listener
// closed to make room for others (Server.evictLocked): its connections in
// handshake were at their bound. It says nothing of the secret.
var ErrFlooded = errors.New("rowsync: the peer closed this handshake to make room for others: its listener is flooded with connections that never finish a handshake (its log names their sources)")

// A listener answers a handshake it ends before its Welcome with one of two
// lengths no handshake message has, so that the client can tell a flood
// from a refusal of its secret; a connection closed without either was cut
// (or the peer is of a version before these answers).
const (
	answerFlooded = 0      // closed to make room (ErrFlooded)
	answerRefused = 0xffff // refused: secret, version or address (ErrAuth)
)

// errAnswerFlooded and errAnswerRefused are what readHandshake returns for
// those answers.
var (
	errAnswerFlooded = errors.New("answer: closed to make room")
	errAnswerRefused = errors.New("answer: refused")
)

// errClosedEarly is a client's error when the listener closed the
// connection before its Welcome without an answer.
var errClosedEarly = errors.New("rowsync: the peer closed the connection before the handshake finished, without refusing it: the connection was cut or the daemon is stopping (or the daemon predates the answers to a handshake it ends, and its log says why)")

// errEvicted ends a handshake the Server closed to make room for others.
var errEvicted = errors.New("closed before its handshake finished, to make room for others: the connections in handshake were at their bound (a flood of connections that never finish one; the sources with the most go first)")

// NodeID identifies one running node (its Mirror and Server) in handshakes.
type NodeID [16]byte

// newNodeID returns a random NodeID.
func newNodeID() NodeID {
	var id NodeID
	rand.Read(id[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return id
}

func (id NodeID) String() string { return hex.EncodeToString(id[:]) }

// ReadSecretFile reads a shared secret (--secret-file): the file's contents
// without surrounding white space, at least MinSecretBytes long. The file
// must be a regular file of mode 0600 or 0400 (no access for group or
// others) owned by root or by the daemon's user.
func ReadSecretFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("rowsync: secret: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("rowsync: secret: %w", err)
	}
	if err := checkSecretFile(fi, os.Geteuid()); err != nil {
		return nil, fmt.Errorf("rowsync: secret file %s %w", path, err)
	}
	b, err := io.ReadAll(io.LimitReader(f, 1<<16))
	if err != nil {
		return nil, fmt.Errorf("rowsync: secret: %w", err)
	}
	secret := bytes.TrimSpace(b)
	if err := checkSecret(secret); err != nil {
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	return secret, nil
}

// checkSecretFile refuses a secret file that others could read or replace.
func checkSecretFile(fi os.FileInfo, euid int) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("is not a regular file (%s)", fi.Mode())
	}
	if perm := fi.Mode().Perm(); perm&0o177 != 0 {
		return fmt.Errorf("has mode %04o: other users could read or change it; chmod 600 it (0600 or 0400 only)", perm)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return errors.New("has no owner to check")
	}
	if st.Uid != 0 && int(st.Uid) != euid {
		return fmt.Errorf("is owned by uid %d: it must belong to root or to the daemon's uid %d", st.Uid, euid)
	}
	return nil
}

func checkSecret(secret []byte) error {
	if len(secret) < MinSecretBytes {
		return fmt.Errorf("rowsync: shared secret of %d bytes, want at least %d", len(secret), MinSecretBytes)
	}
	return nil
}

// presharedKey derives the handshake's 32-byte pre-shared key from the secret.
func presharedKey(secret []byte) []byte {
	psk, err := hkdf.Key(sha256.New, secret, nil, pskLabel, 32)
	if err != nil {
		panic(err) // only for lengths SHA-256 cannot produce
	}
	return psk
}

// handshakeState starts one side of the handshake; random supplies the
// ephemeral key (nil: crypto/rand).
func handshakeState(initiator bool, psk []byte, random io.Reader) (*noise.HandshakeState, error) {
	return noise.NewHandshakeState(noise.Config{
		CipherSuite:           cipherSuite,
		Random:                random,
		Pattern:               noise.HandshakeNN,
		Initiator:             initiator,
		Prologue:              []byte(prologue),
		PresharedKey:          psk,
		PresharedKeyPlacement: 0,
	})
}

// clientHandshake authenticates the server behind conn, proves the secret to
// it and returns the channel and the server's Welcome. A server that is this
// node itself ends it with errSelf.
func clientHandshake(conn net.Conn, psk []byte, self NodeID, session uint64) (*channel, *Welcome, error) {
	conn.SetDeadline(time.Now().Add(handshakeTimeout))
	defer conn.SetDeadline(time.Time{})
	hs, err := handshakeState(true, psk, nil)
	if err != nil {
		return nil, nil, err
	}
	hello := Hello{Session: session, Node: self, To: conn.RemoteAddr().String()}
	msg, _, _, err := hs.WriteMessage(nil, Encode(&hello))
	if err != nil {
		return nil, nil, err
	}
	if err := writeHandshake(conn, msg); err != nil {
		return nil, nil, err
	}
	if msg, err = readHandshake(conn); err != nil {
		switch {
		case errors.Is(err, errAnswerFlooded):
			err = ErrFlooded
		case errors.Is(err, errAnswerRefused):
			err = fmt.Errorf("%w: the peer ended the handshake: it refused this node (a wrong shared secret, another protocol version or a relayed connection; its log says which)", ErrAuth)
		case errors.Is(err, os.ErrDeadlineExceeded):
			err = fmt.Errorf("the peer accepted the connection but did not answer the handshake within %s: a stopped or hung daemon (or something else listening on its port)", handshakeTimeout)
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET):
			err = errClosedEarly // not ErrAuth: a refusal says so (answerRefused)
		}
		return nil, nil, err
	}
	payload, send, recv, err := hs.ReadMessage(nil, msg)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: the peer does not know the shared secret (or speaks another protocol version)", ErrAuth)
	}
	welcome, err := decodeHandshake[*Welcome](payload)
	if err != nil {
		return nil, nil, err
	}
	if welcome.Node == self {
		return nil, nil, errSelf
	}
	ch := newChannel(conn, send, recv)
	if err := ch.writeMessage(&Ready{}); err != nil {
		return nil, nil, err
	}
	return ch, welcome, nil
}

// serverHandshake authenticates the client behind conn, proves the secret to
// it and returns the channel and the client's Hello. welcome is this node's
// answer. A Hello from this node itself is answered, so that its client
// learns it reached itself, and then ended with errSelf. evicted (nil:
// never) reports whether the Server closed the handshake to make room; it is
// asked with proven set once the Hello was sealed under the secret (and
// notes that), and at a failure before the Welcome, whose answer to the
// client (answerFlooded or answerRefused) it chooses.
func serverHandshake(conn net.Conn, psk []byte, welcome *Welcome, evicted func(proven bool) bool) (*channel, *Hello, error) {
	if evicted == nil {
		evicted = func(bool) bool { return false }
	}
	conn.SetDeadline(time.Now().Add(handshakeTimeout))
	defer conn.SetDeadline(time.Time{})
	hello, hs, err := serverHello(conn, psk, welcome, evicted)
	if err != nil {
		answer := uint16(answerRefused)
		if evicted(false) {
			answer, err = answerFlooded, errEvicted
		}
		conn.Write(binary.BigEndian.AppendUint16(nil, answer)) // within the deadline; its error changes nothing
		return nil, nil, err
	}
	fromSelf := hello.Node == welcome.Node
	msg, recv, send, err := hs.WriteMessage(nil, Encode(welcome))
	if err != nil {
		return nil, nil, err
	}
	if err := writeHandshake(conn, msg); err != nil {
		return nil, nil, err
	}
	if fromSelf {
		return nil, nil, errSelf
	}
	ch := newChannel(conn, send, recv)
	frame, err := ch.readFrame(nil, maxHandshakeFrame)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: no ready record: %w", ErrAuth, err)
	}
	if _, err := decodeHandshake[*Ready](frame); err != nil {
		return nil, nil, err
	}
	return ch, hello, nil
}

// serverHello reads and checks the client's Hello; hs is the handshake it
// leaves for the Welcome.
func serverHello(conn net.Conn, psk []byte, welcome *Welcome, evicted func(proven bool) bool) (*Hello, *noise.HandshakeState, error) {
	hs, err := handshakeState(false, psk, nil)
	if err != nil {
		return nil, nil, err
	}
	msg, err := readHandshake(conn)
	if errors.Is(err, errAnswerFlooded) || errors.Is(err, errAnswerRefused) {
		err = fmt.Errorf("%w: %w: a client sent a listener's answer", ErrAuth, ErrBadFrame)
	}
	if err != nil {
		return nil, nil, err
	}
	payload, _, _, err := hs.ReadMessage(nil, msg)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: the client does not know the shared secret (or speaks another protocol version)", ErrAuth)
	}
	hello, err := decodeHandshake[*Hello](payload)
	if err != nil {
		return nil, nil, err
	}
	if hello.Node != welcome.Node {
		if err := checkDialed(hello.To, conn.LocalAddr()); err != nil {
			return nil, nil, err
		}
	}
	if evicted(true) {
		return nil, nil, errEvicted
	}
	return hello, hs, nil
}

// checkDialed refuses a Hello meant for another address than local, the one
// the connection arrived at.
func checkDialed(to string, local net.Addr) error {
	want := local.String()
	if a, ok := local.(*net.TCPAddr); ok {
		here := a.AddrPort()
		want = here.String()
		// Zones name interfaces, which each host names its own way.
		same := func(x, y netip.Addr) bool { return x.Unmap().WithZone("") == y.Unmap().WithZone("") }
		if got, err := netip.ParseAddrPort(to); err == nil && same(got.Addr(), here.Addr()) && got.Port() == here.Port() {
			return nil
		}
	} else if to == want {
		return nil
	}
	return fmt.Errorf("%w: the client dialed %q, but this is %s (a relayed handshake, or NAT between the nodes)", ErrAuth, to, want)
}

// writeHandshake writes one handshake message with its uint16 length.
func writeHandshake(conn net.Conn, msg []byte) error {
	_, err := conn.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(msg))), msg...))
	return err
}

// readHandshake reads one handshake message of at most maxHandshakeMessage bytes.
func readHandshake(conn net.Conn) ([]byte, error) {
	var head [2]byte
	if _, err := io.ReadFull(conn, head[:]); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrAuth, err)
	}
	n := int(binary.BigEndian.Uint16(head[:]))
	switch n {
	case answerFlooded:
		return nil, errAnswerFlooded
	case answerRefused:
		return nil, errAnswerRefused
	}
	if n > maxHandshakeMessage {
		return nil, fmt.Errorf("%w: %w: handshake message of %d bytes, limit %d", ErrAuth, ErrBadFrame, n, maxHandshakeMessage)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(conn, msg); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrAuth, err)
	}
	return msg, nil
}

// decodeHandshake decodes a handshake frame that must be a T.
func decodeHandshake[T Message](frame []byte) (T, error) {
	var want T
	msg, err := Decode(frame)
	if err != nil {
		return want, fmt.Errorf("%w: %w", ErrAuth, err)
	}
	m, ok := msg.(T)
	if !ok {
		return want, fmt.Errorf("%w: expected message type %d, got %d", ErrAuth, want.messageType(), msg.messageType())
	}
	return m, nil
}
