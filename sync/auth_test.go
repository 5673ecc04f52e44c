package rowsync

import (
	"bytes"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// recordConn remembers everything written to it.
type recordConn struct {
	net.Conn
	mu      sync.Mutex
	written bytes.Buffer
}

func (c *recordConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.written.Write(b)
	c.mu.Unlock()
	return c.Conn.Write(b)
}

// handshake runs both sides over a pipe and returns their errors and the
// bytes both sides sent.
func handshake(clientSecret, serverSecret []byte) (clientErr, serverErr error, wire []byte) {
	c, s := net.Pipe()
	rc, rs := &recordConn{Conn: c}, &recordConn{Conn: s}
	var wg sync.WaitGroup
	wg.Go(func() {
		_, serverErr = serverHandshake(rs, serverSecret)
		s.Close()
	})
	clientErr = clientHandshake(rc, clientSecret, 1)
	c.Close()
	wg.Wait()
	return clientErr, serverErr, append(rc.written.Bytes(), rs.written.Bytes()...)
}

func TestHandshake(t *testing.T) {
	cErr, sErr, wire := handshake(testSecret, testSecret)
	if cErr != nil || sErr != nil {
		t.Fatalf("same secret: client %v, server %v", cErr, sErr)
	}
	if bytes.Contains(wire, testSecret) {
		t.Error("the secret went over the wire")
	}
	// Fresh nonces: two handshakes never send the same bytes.
	if _, _, wire2 := handshake(testSecret, testSecret); bytes.Equal(wire, wire2) {
		t.Error("two handshakes sent identical bytes")
	}
}

func TestHandshakeWrongSecret(t *testing.T) {
	other := []byte("kvtier-test-another-secret-xyz")
	cErr, sErr, _ := handshake(other, testSecret)
	if !errors.Is(cErr, ErrAuth) || !strings.Contains(cErr.Error(), "does not know the shared secret") {
		t.Errorf("client: %v", cErr)
	}
	if !errors.Is(sErr, ErrAuth) {
		t.Errorf("server: %v", sErr)
	}
}

func TestHandshakeForgedResponse(t *testing.T) {
	// A client that sees the challenge but cannot compute the response.
	c, s := net.Pipe()
	defer c.Close()
	var serverErr error
	var wg sync.WaitGroup
	wg.Go(func() { _, serverErr = serverHandshake(s, testSecret); s.Close() })
	WriteMessage(c, &Hello{Version: ProtocolVersion})
	msg, err := readHandshake(c)
	if err != nil {
		t.Fatal(err)
	}
	ch := msg.(*Challenge)
	WriteMessage(c, &Response{MAC: ch.MAC}) // reflect the server's own tag
	wg.Wait()
	if !errors.Is(serverErr, ErrAuth) || !strings.Contains(serverErr.Error(), "client does not know the shared secret") {
		t.Errorf("server accepted a reflected tag: %v", serverErr)
	}
}

func TestHandshakeVersion(t *testing.T) {
	c, s := net.Pipe()
	defer c.Close()
	var serverErr error
	var wg sync.WaitGroup
	wg.Go(func() { _, serverErr = serverHandshake(s, testSecret); s.Close() })
	WriteMessage(c, &Hello{Version: ProtocolVersion + 1})
	wg.Wait()
	if !errors.Is(serverErr, ErrAuth) || !strings.Contains(serverErr.Error(), "protocol version 2, want 1") {
		t.Errorf("server: %v", serverErr)
	}
}

func TestReadSecretFile(t *testing.T) {
	dir := t.TempDir()
	good, short := filepath.Join(dir, "good"), filepath.Join(dir, "short")
	os.WriteFile(good, []byte("  "+string(testSecret)+"\n"), 0o600)
	os.WriteFile(short, []byte("tooshort\n"), 0o600)
	if s, err := ReadSecretFile(good); err != nil || !bytes.Equal(s, testSecret) {
		t.Errorf("ReadSecretFile(good) = %q, %v", s, err)
	}
	if _, err := ReadSecretFile(short); err == nil || !strings.Contains(err.Error(), "shared secret of 8 bytes, want at least 16") {
		t.Errorf("ReadSecretFile(short) = %v", err)
	}
	if _, err := ReadSecretFile(filepath.Join(dir, "missing")); err == nil {
		t.Error("ReadSecretFile(missing) succeeded")
	}
}
