package rowsync

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/flynn/noise"
)

// The bytes of protocol 3 as it is shipped: frames, records and the first
// handshake message. A change here is a change of the protocol: bump the
// version in prologue, and keep the old bytes in the test. Protocol 2's
// Welcome had no peer-list digest (TestDecodeErrors refuses it); its first
// handshake message ended in …aff473b3f90e0714e4c9c681796f7a351 (the
// prologue named version 2).

// scriptConn is a connection whose reads come from a script and whose
// writes are kept, at a fixed TCP address.
type scriptConn struct {
	io.Reader
	io.Writer
}

var scriptAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7470}

func (scriptConn) Close() error                     { return nil }
func (scriptConn) LocalAddr() net.Addr              { return scriptAddr }
func (scriptConn) RemoteAddr() net.Addr             { return scriptAddr }
func (scriptConn) SetDeadline(time.Time) error      { return nil }
func (scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (scriptConn) SetWriteDeadline(time.Time) error { return nil }

// fixedCipher is a direction's cipher at nonce 0 with the key 0x00..0x1f.
func fixedCipher() *noise.CipherState {
	var key [32]byte
	for i := range key {
		key[i] = byte(i)
	}
	return noise.UnsafeNewCipherState(cipherSuite, key, 0)
}

// sealed returns the records of frames sealed by a fresh fixedCipher.
func sealed(t testing.TB, frames ...Message) []byte {
	var out bytes.Buffer
	ch := newChannel(scriptConn{Reader: bytes.NewReader(nil), Writer: &out}, fixedCipher(), nil)
	for _, m := range frames {
		if err := ch.writeMessage(m); err != nil {
			t.Fatal(err)
		}
	}
	return out.Bytes()
}

func TestGoldenFrames(t *testing.T) {
	want := []string{
		"00000028" + "01" + "0102030405060708" + "000102030405060708090a0b0c0d0e0f" + "000d" + hex.EncodeToString([]byte("10.0.0.2:7470")),
		"00000031" + "07" + "fffefdfcfbfaf9f8f7f6f5f4f3f2f1f0" + strings.Repeat("5a", 32),
		"00000001" + "08",
		"000000ae" + "04" + "0000000000000007" + "00000003" + "000001f2" + "0000000000834000" + "00000002" +
			"0000000000000000" + "000000000000000d" + hex.EncodeToString([]byte("slot 0 begins")) +
			"0000000000002000" + "0000000000000064" + strings.Repeat("a5", 100),
		"0000001d" + "04" + "0000000000000008" + "00000000" + "00000001" + "0000000000001000" + "00000000",
		"00000013" + "05" + "0000000000000007" + "00000003" + "deadbeef" + "0000",
		"00000024" + "05" + "0000000000000009" + "00000001" + "00000000" + "0011" + hex.EncodeToString([]byte("geometry mismatch")),
		"0000002a" + "06" + "000000000000000a" + "0000002a" + "000001f2" + "0000000000834000" + "01020304" + "000b" + hex.EncodeToString([]byte("0123abcd_g1")),
	}
	for i, m := range sampleMessages() {
		if got := hex.EncodeToString(Encode(m)); i >= len(want) || got != want[i] {
			t.Errorf("frame %d (%T) = %s", i, m, got)
		}
	}
}

func TestGoldenRecords(t *testing.T) {
	// An acknowledgement (one record), then a row of 70,000 bytes (two
	// records, the first full), sealed in one stream.
	ackMsg := &Ack{Seq: 7, Row: 3, CRC: 0xdeadbeef}
	data := bytes.Repeat([]byte{0xa5}, 70000)
	w := &RowWrite{Seq: 1, Row: 0, Rows: 1, RowBytes: 1 << 17, Extents: []Extent{{Off: 4096, Data: data}}}
	stream := sealed(t, ackMsg, w)
	ackLen := 2 + len(Encode(ackMsg)) + tagBytes
	ack, rec := stream[:ackLen], stream[ackLen:]
	const wantAck = "0027" + "0ebcb5cdb02c83bd08a8a9351f2c9199d19dfbedc78160359c79f1a170b74b23a82ef917bbe835"
	if got := hex.EncodeToString(ack); got != wantAck {
		t.Errorf("sealed ack = %s", got)
	}
	frameLen := len(Encode(w))
	if n := int(rec[0])<<8 | int(rec[1]); n != MaxRecordBytes {
		t.Errorf("first record of %d bytes, want %d", n, MaxRecordBytes)
	}
	if len(rec) != 2+MaxRecordBytes+2+(frameLen-maxRecordPlain)+tagBytes {
		t.Errorf("%d bytes of records for a %d-byte frame", len(rec), frameLen)
	}
	const wantRow = "33860f9d783aa607666f03bb14fb8e9d88253918cc8b52bcdbeef5b037172323"
	if sum := sha256.Sum256(rec); hex.EncodeToString(sum[:]) != wantRow {
		t.Errorf("sealed row SHA-256 = %x", sum)
	}

	// Read back, frame by frame, by the other end.
	ch := newChannel(scriptConn{Reader: bytes.NewReader(stream), Writer: io.Discard}, nil, fixedCipher())
	for _, want := range []Message{ackMsg, w} {
		frame, err := ch.readFrame(nil, MaxFrameBytes)
		if err != nil || !bytes.Equal(frame, Encode(want)) {
			t.Fatalf("read back %T: %v", want, err)
		}
	}
	if _, err := ch.readFrame(nil, MaxFrameBytes); err != io.EOF {
		t.Errorf("after the last record: %v", err)
	}

	// The same records in another order, or one of them again, fail.
	swapped := append(bytes.Clone(rec), ack...)
	ch = newChannel(scriptConn{Reader: bytes.NewReader(swapped), Writer: io.Discard}, nil, fixedCipher())
	if _, err := ch.readFrame(nil, MaxFrameBytes); !errors.Is(err, ErrAuth) {
		t.Errorf("records out of order: %v", err)
	}
	replayed := append(bytes.Clone(ack), ack...)
	ch = newChannel(scriptConn{Reader: bytes.NewReader(replayed), Writer: io.Discard}, nil, fixedCipher())
	if _, err := ch.readFrame(nil, MaxFrameBytes); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.readFrame(nil, MaxFrameBytes); !errors.Is(err, ErrAuth) {
		t.Errorf("a replayed record: %v", err)
	}
}

// goldenHello is the first handshake message of a client with a fixed
// ephemeral key.
func goldenHello(t testing.TB) []byte {
	hs, err := handshakeState(true, presharedKey(testSecret), bytes.NewReader(bytes.Repeat([]byte{0x42}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	hello := Hello{Session: 7, Node: NodeID{1, 2, 3}, To: scriptAddr.String()}
	msg, _, _, err := hs.WriteMessage(nil, Encode(&hello))
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

func TestGoldenHandshake(t *testing.T) {
	const want = "132c442be010fbd57e72603328aa76e71fccc1503aae219327d14d9c9993f472" + // ephemeral key
		"24e95242d7879eb02f972d459029321c9bf0d944bb865028d6647af3990f7be1390f48270b4d3df567f8ffd57aa5ba2b0a3f3bdd6312151e42463325c3"
	if got := hex.EncodeToString(goldenHello(t)); got != want {
		t.Errorf("first handshake message = %s", got)
	}
}

// FuzzRecords reads arbitrary bytes as a peer's records (sealed with
// fixedCipher, so the seeds get past the first tag): it must never panic,
// every error must be a failed authentication, a bad frame or the end of the
// stream, and whatever it accepts decodes as Decode says.
func FuzzRecords(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		ch := newChannel(scriptConn{Reader: bytes.NewReader(b), Writer: io.Discard}, nil, fixedCipher())
		for {
			frame, err := ch.readFrame(nil, maxRequestFrame)
			if err != nil {
				if !errors.Is(err, ErrAuth) && !errors.Is(err, ErrBadFrame) && err != io.EOF && err != io.ErrUnexpectedEOF {
					t.Fatalf("error %v is none of the expected kinds", err)
				}
				return
			}
			if m, err := Decode(frame); err == nil && !bytes.Equal(Encode(m), frame) {
				t.Fatalf("frame %x decodes to %+v", frame, m)
			}
		}
	})
}

// FuzzHandshake hands arbitrary bytes to a server as the client's side of
// the handshake, and to a client as the server's: neither may panic, and
// without the session keys neither may succeed.
func FuzzHandshake(f *testing.F) {
	psk := presharedKey(testSecret)
	f.Fuzz(func(t *testing.T, b []byte) {
		conn := scriptConn{Reader: bytes.NewReader(b), Writer: io.Discard}
		if _, _, err := serverHandshake(conn, psk, &Welcome{Node: newNodeID()}, nil); !errors.Is(err, ErrAuth) {
			t.Fatalf("server: %v", err)
		}
		conn = scriptConn{Reader: bytes.NewReader(b), Writer: io.Discard}
		// A client told of a flood, or whose connection ended before an
		// answer, learns nothing of the secret either.
		if ch, _, err := clientHandshake(conn, psk, newNodeID(), 1); ch != nil ||
			!errors.Is(err, ErrAuth) && !errors.Is(err, ErrFlooded) && !errors.Is(err, errClosedEarly) {
			t.Fatalf("client: %v", err)
		}
	})
}
