package rowsync

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
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

// The bytes of protocol 4 as it is shipped: frames, records, bulk records
// and the first handshake message. A change here is a change of the
// protocol: bump the version in prologue, and keep the old bytes in the
// test. Protocol 3 sealed a RowWrite (type 4, each extent's header before
// its bytes, no key) whole in the lane's records (TestDecodeErrors refuses
// it); its first handshake message ended in …57aa5ba2b0a3f3bdd6312151e42463325c3.
// Protocol 2's Welcome had no peer-list digest (TestDecodeErrors refuses
// it); its first handshake message ended in …aff473b3f90e0714e4c9c681796f7a351
// (the prologue named version 2).

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

// goldenKey is testBulkKey in hex.
const goldenKey = "404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f"

func TestGoldenFrames(t *testing.T) {
	want := []string{
		"00000028" + "01" + "0102030405060708" + "000102030405060708090a0b0c0d0e0f" + "000d" + hex.EncodeToString([]byte("10.0.0.2:7470")),
		"00000039" + "07" + "fffefdfcfbfaf9f8f7f6f5f4f3f2f1f0" + strings.Repeat("5a", 32) + "00000123456789ab",
		"00000001" + "08",
		"000000d6" + "09" + "0000000000000007" + "00000003" + "000001f2" + "0000000000834000" + "00000123b992eaeb" + goldenKey + "00000002" +
			"0000000000000000" + "000000000000000d" + "0000000000002000" + "0000000000000064" +
			hex.EncodeToString([]byte("slot 0 begins")) + strings.Repeat("a5", 100),
		"00000045" + "09" + "0000000000000008" + "00000000" + "00000001" + "0000000000001000" + "0000000000000000" + goldenKey + "00000000",
		"0000001b" + "05" + "0000000000000007" + "00000003" + "deadbeef" + "00000123456789ac" + "0000",
		"0000002c" + "05" + "0000000000000009" + "00000001" + "00000000" + "0000000000000000" + "0011" + hex.EncodeToString([]byte("geometry mismatch")),
		"0000002a" + "06" + "000000000000000a" + "0000002a" + "000001f2" + "0000000000834000" + "01020304" + "000b" + hex.EncodeToString([]byte("0123abcd_g1")),
	}
	for i, m := range sampleMessages() {
		if got := hex.EncodeToString(Encode(m)); i >= len(want) || got != want[i] {
			t.Errorf("frame %d (%T) = %s", i, m, got)
		}
	}
}

func TestGoldenRecords(t *testing.T) {
	// An acknowledgement (one record), then a row of 70,000 bytes: its
	// frame up to the bulk in one record, its bulk in two bulk records
	// (the first full), sealed in one stream.
	ackMsg := &Ack{Seq: 7, Row: 3, CRC: 0xdeadbeef}
	data := bytes.Repeat([]byte{0xa5}, 70000)
	w := &RowWrite{Seq: 1, Row: 0, Rows: 1, RowBytes: 1 << 17, Key: testBulkKey, Extents: []Extent{{Off: 4096, Data: data}}}
	var out bytes.Buffer
	ch := newChannel(scriptConn{Reader: bytes.NewReader(nil), Writer: &out}, fixedCipher(), nil)
	if err := ch.writeMessage(ackMsg); err != nil {
		t.Fatal(err)
	}
	lane, bulk := sealRow(t, ch, w)
	ack := out.Bytes()
	const wantAck = "002f" + "0ebcb5c5b02c83bd08a8a9351f2c9199d19dfbedc781602f809eb383c5ff5d9c98f7a1a8cee2bfda0117dbaf2f1f6a"
	if got := hex.EncodeToString(ack); got != wantAck {
		t.Errorf("sealed ack = %s", got)
	}
	headLen := len(Encode(w)) - len(data)
	if len(lane) != 2+headLen+tagBytes {
		t.Errorf("%d bytes of lane records for a frame of %d bytes up to its bulk", len(lane), headLen)
	}
	if n := int(bulk[0])<<8 | int(bulk[1]); n != MaxRecordBytes {
		t.Errorf("first bulk record of %d bytes, want %d", n, MaxRecordBytes)
	}
	if len(bulk) != 2+MaxRecordBytes+2+(len(data)-maxRecordPlain)+tagBytes {
		t.Errorf("%d bytes of bulk records for a %d-byte bulk", len(bulk), len(data))
	}
	const wantLane = "0069" + "15d7ae394df4301e0e2e5139eda63af7159f1c5465b25484730001d92630735e3a9667f1286cc57e1a9b86472bac4e79655a1edcb2be4c15ed4148330fedc2525f2d38a44e499dc6cbab34b1403998f9d4a5da17745e8109b3e73ca05dbbca0f1675b14406ae8c3a92"
	if got := hex.EncodeToString(lane); got != wantLane {
		t.Errorf("sealed row up to its bulk = %s", got)
	}
	const wantBulk = "aaf5ad7fd74f7f44b67706b3a788cf8f472d34932cb23ebaf40ab74af19544d3"
	if sum := sha256.Sum256(bulk); hex.EncodeToString(sum[:]) != wantBulk {
		t.Errorf("sealed bulk SHA-256 = %x", sum)
	}
	// Each bulk record is what channel.go says: AES-256-GCM under the key,
	// the index after four zero bytes as the nonce, the length bytes as
	// additional data.
	block, _ := aes.NewCipher(testBulkKey[:])
	gcm, _ := cipher.NewGCM(block)
	for i, rec := range [][]byte{bulk[:2+MaxRecordBytes], bulk[2+MaxRecordBytes:]} {
		nonce := make([]byte, 12)
		nonce[11] = byte(i)
		if plain, err := gcm.Open(nil, nonce, rec[2:], rec[:2]); err != nil || !bytes.Equal(plain, data[i*maxRecordPlain:min((i+1)*maxRecordPlain, len(data))]) {
			t.Errorf("bulk record %d does not open as specified: %v", i, err)
		}
	}
	stream := append(append(bytes.Clone(ack), lane...), bulk...)

	// Read back, frame by frame, by the other end.
	ch = newChannel(scriptConn{Reader: bytes.NewReader(stream), Writer: io.Discard}, nil, fixedCipher())
	for _, want := range []Message{ackMsg, w} {
		got, err := readMessage(ch, MaxFrameBytes)
		if err != nil || !bytes.Equal(Encode(got), Encode(want)) {
			t.Fatalf("read back %T: %v", want, err)
		}
	}
	if _, err := ch.readFrame(nil, MaxFrameBytes); err != io.EOF {
		t.Errorf("after the last record: %v", err)
	}

	// The same records in another order, or one of them again, fail.
	swapped := append(append(bytes.Clone(lane), bulk...), ack...)
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
		"24e95242d7879eb02f972d459029321c9bf0d944bb865028d6647af3990f7be1390f48270b4d3df567f8ffd57a137a930084d6d09873a78853e7702df0"
	if got := hex.EncodeToString(goldenHello(t)); got != want {
		t.Errorf("first handshake message = %s", got)
	}
}

// FuzzRecords reads arbitrary bytes as a peer's records and a RowWrite's
// bulk records (sealed with fixedCipher and testBulkKey, so the seeds get
// past the first tag) as a Server does: it must never panic, every error
// must be a failed authentication, a bad frame or the end of the stream,
// and whatever it accepts encodes to a frame that Decode accepts as the
// same message.
func FuzzRecords(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		ch := newChannel(scriptConn{Reader: bytes.NewReader(b), Writer: io.Discard}, nil, fixedCipher())
		for {
			m, err := readMessage(ch, 1<<17)
			if err != nil {
				if !errors.Is(err, ErrAuth) && !errors.Is(err, ErrBadFrame) && err != io.EOF && err != io.ErrUnexpectedEOF {
					t.Fatalf("error %v is none of the expected kinds", err)
				}
				return
			}
			if got, err := Decode(Encode(m)); err != nil || !bytes.Equal(Encode(got), Encode(m)) {
				t.Fatalf("%+v read, and its frame decodes to %+v, %v", m, got, err)
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
