package rowsync

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// Mutual authentication. Both sides know a shared secret; it never travels.
//
//	client → server  Hello{Version, Session, Nc}
//	server → client  Challenge{Ns, HMAC(secret, "kvtierfs/1 server" ‖ Nc ‖ Ns)}
//	client → server  Response{HMAC(secret, "kvtierfs/1 client" ‖ Nc ‖ Ns)}
//
// Nonces come from crypto/rand and tags are compared in constant time. The
// distinct labels keep a tag from being reflected in the other direction, and
// the fresh nonce on each side keeps a recorded handshake from being
// replayed. Only the handshake is authenticated: frames after it are neither
// signed nor encrypted (the acknowledged CRC32C catches corruption, not an
// attacker on the path).

// ProtocolVersion is the version a Hello carries; a server refuses others.
const ProtocolVersion = 1

// MinSecretBytes is the shortest shared secret accepted.
const MinSecretBytes = 16

// handshakeTimeout bounds dialing plus the handshake.
const handshakeTimeout = 5 * time.Second

// ErrAuth is wrapped by the errors of a failed handshake.
var ErrAuth = errors.New("rowsync: authentication failed")

// ReadSecretFile reads a shared secret (--secret-file): the file's contents
// without surrounding white space, at least MinSecretBytes long.
func ReadSecretFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("rowsync: secret: %w", err)
	}
	secret := bytes.TrimSpace(b)
	if err := checkSecret(secret); err != nil {
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	return secret, nil
}

func checkSecret(secret []byte) error {
	if len(secret) < MinSecretBytes {
		return fmt.Errorf("rowsync: shared secret of %d bytes, want at least %d", len(secret), MinSecretBytes)
	}
	return nil
}

// handshakeMAC is HMAC-SHA256(secret, label ‖ client nonce ‖ server nonce).
func handshakeMAC(secret []byte, label string, client, server *[NonceBytes]byte) (tag [MACBytes]byte) {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(label))
	h.Write(client[:])
	h.Write(server[:])
	h.Sum(tag[:0])
	return tag
}

const (
	serverLabel = "kvtierfs/1 server"
	clientLabel = "kvtierfs/1 client"
)

// clientHandshake authenticates the server behind conn and proves the secret
// to it.
func clientHandshake(conn net.Conn, secret []byte, session uint64) error {
	conn.SetDeadline(time.Now().Add(handshakeTimeout))
	defer conn.SetDeadline(time.Time{})
	hello := Hello{Version: ProtocolVersion, Session: session}
	rand.Read(hello.Nonce[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	if err := WriteMessage(conn, &hello); err != nil {
		return err
	}
	msg, err := readHandshake(conn)
	if err != nil {
		return err
	}
	ch, ok := msg.(*Challenge)
	if !ok {
		return fmt.Errorf("%w: expected a challenge, got message type %d", ErrAuth, msg.messageType())
	}
	want := handshakeMAC(secret, serverLabel, &hello.Nonce, &ch.Nonce)
	if !hmac.Equal(want[:], ch.MAC[:]) {
		return fmt.Errorf("%w: the peer does not know the shared secret", ErrAuth)
	}
	return WriteMessage(conn, &Response{MAC: handshakeMAC(secret, clientLabel, &hello.Nonce, &ch.Nonce)})
}

// serverHandshake authenticates the client behind conn, proves the secret to
// it and returns its Hello.
func serverHandshake(conn net.Conn, secret []byte) (*Hello, error) {
	conn.SetDeadline(time.Now().Add(handshakeTimeout))
	defer conn.SetDeadline(time.Time{})
	msg, err := readHandshake(conn)
	if err != nil {
		return nil, err
	}
	hello, ok := msg.(*Hello)
	if !ok {
		return nil, fmt.Errorf("%w: expected a hello, got message type %d", ErrAuth, msg.messageType())
	}
	if hello.Version != ProtocolVersion {
		return nil, fmt.Errorf("%w: protocol version %d, want %d", ErrAuth, hello.Version, ProtocolVersion)
	}
	ch := Challenge{}
	rand.Read(ch.Nonce[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	ch.MAC = handshakeMAC(secret, serverLabel, &hello.Nonce, &ch.Nonce)
	if err := WriteMessage(conn, &ch); err != nil {
		return nil, err
	}
	if msg, err = readHandshake(conn); err != nil {
		return nil, err
	}
	resp, ok := msg.(*Response)
	if !ok {
		return nil, fmt.Errorf("%w: expected a response, got message type %d", ErrAuth, msg.messageType())
	}
	want := handshakeMAC(secret, clientLabel, &hello.Nonce, &ch.Nonce)
	if !hmac.Equal(want[:], resp.MAC[:]) {
		return nil, fmt.Errorf("%w: the client does not know the shared secret", ErrAuth)
	}
	return hello, nil
}

// readHandshake reads and decodes one small frame.
func readHandshake(conn net.Conn) (Message, error) {
	frame, err := ReadFrame(conn, nil, maxHandshakeFrame)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrAuth, err)
	}
	msg, err := Decode(frame)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrAuth, err)
	}
	return msg, nil
}
