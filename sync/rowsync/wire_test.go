package rowsync

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// testBulkKey is the Key of the tests' RowWrites: 0x40..0x5f.
var testBulkKey = func() (key [BulkKeyBytes]byte) {
	for i := range key {
		key[i] = 0x40 + byte(i)
	}
	return key
}()

// sampleMessages returns one message of every type, for round trips and the
// fuzz corpus.
func sampleMessages() []Message {
	var a, b NodeID
	for i := range a {
		a[i], b[i] = byte(i), byte(255-i)
	}
	return []Message{
		&Hello{Session: 0x0102030405060708, Node: a, To: "10.0.0.2:7470"},
		&Welcome{Node: b, PeerList: PeerListDigest(bytes.Repeat([]byte{0x5a}, 32)), Clock: 0x0000_0123_4567_89ab},
		&Ready{},
		&RowWrite{Seq: 7, Row: 3, Rows: 498, RowBytes: 8601600, CommitBy: 0x0000_0123_4567_89ab + 1_949_000_000, Key: testBulkKey, Extents: []Extent{
			{Off: 0, Data: []byte("slot 0 begins")},
			{Off: 8192, Data: bytes.Repeat([]byte{0xa5}, 100)},
		}},
		&RowWrite{Seq: 8, Row: 0, Rows: 1, RowBytes: 4096, Key: testBulkKey}, // an all-zero row: no extents
		&Ack{Seq: 7, Row: 3, CRC: 0xdeadbeef, Clock: 0x0000_0123_4567_89ac},
		&Ack{Seq: 9, Row: 1, Err: "geometry mismatch"},
		&StoreSample{Seq: 10, Row: 42, Rows: 498, RowBytes: 8601600, CRC: 0x01020304, Key: "0123abcd_g1"},
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, m := range sampleMessages() {
		frame := Encode(m)
		got, err := Decode(frame)
		if err != nil {
			t.Errorf("Decode(Encode(%T)): %v", m, err)
			continue
		}
		if w, ok := m.(*RowWrite); ok && w.Extents == nil {
			w.Extents = []Extent{}
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("round trip of %T: got %+v, want %+v", m, got, m)
		}
		read, err := ReadFrame(bytes.NewReader(frame), nil, MaxFrameBytes)
		if err != nil || !bytes.Equal(read, frame) {
			t.Errorf("ReadFrame(%T) = %x, %v", m, read, err)
		}
	}
}

func TestEncodeTruncatesStrings(t *testing.T) {
	m, err := Decode(Encode(&Ack{Err: strings.Repeat("e", 5000)}))
	if err != nil {
		t.Fatal(err)
	}
	if got := len(m.(*Ack).Err); got != MaxErrBytes {
		t.Errorf("Err of %d bytes after a round trip, want %d", got, MaxErrBytes)
	}
}

// frame builds a frame of type typ whose body is parts, written big endian.
func frame(typ uint8, parts ...any) []byte {
	var body bytes.Buffer
	body.WriteByte(typ)
	for _, p := range parts {
		binary.Write(&body, binary.BigEndian, p)
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(body.Len())), body.Bytes()...)
}

func TestDecodeErrors(t *testing.T) {
	type (
		u8  = uint8
		u16 = uint16
		u32 = uint32
		u64 = uint64
	)
	rowWrite := func(rowBytes u64, count u32, extents ...any) []byte {
		return frame(typeRowWrite, append([]any{u64(1), u32(2), u32(4), rowBytes, u64(0), [BulkKeyBytes]byte{}, count}, extents...)...)
	}
	for _, tc := range []struct {
		name  string
		frame []byte
		want  string
	}{
		{"empty", nil, "0 bytes, want at least 5"},
		{"header only", []byte{0, 0, 0, 1}, "4 bytes"},
		{"length too large", append(frame(typeWelcome, NodeID{}), 0), "length field 17, frame holds 18"},
		{"length too small", frame(typeWelcome, NodeID{})[:10], "length field 17, frame holds 6"},
		{"unknown type", frame(99, u32(0)), "unknown message type 99"},
		{"zero type", frame(0), "unknown message type 0"},
		{"protocol 1 challenge", frame(2, [64]byte{}), "unknown message type 2"},
		{"short hello", frame(typeHello, u64(2), [15]byte{}), "fixed field needs 16 bytes, 15 left"},
		{"address too long", frame(typeHello, u64(2), NodeID{}, u16(MaxAddrBytes+1)), "string of 65 bytes, limit 64"},
		{"trailing bytes", frame(typeWelcome, [57]byte{}), "1 trailing bytes"},
		{"welcome without a clock", frame(typeWelcome, NodeID{}, PeerListDigest{}), "uint64 needs 8 bytes, 0 left"},
		{"protocol 2 welcome", frame(typeWelcome, NodeID{}), "fixed field needs 32 bytes, 0 left"},
		{"ready with a body", frame(typeReady, u8(0)), "1 trailing bytes"},
		{"zero row size", rowWrite(0, 0), "row size 0"},
		{"huge row size", rowWrite(MaxRowBytes+1, 0), "row size 268435457"},
		{"row out of range", frame(typeRowWrite, u64(1), u32(4), u32(4), u64(4096), u64(0), [BulkKeyBytes]byte{}, u32(0)), "row 4 of a 4-row region"},
		{"protocol 3 row write", frame(4, u64(1), u32(0), u32(1), u64(4096), u32(0)), "unknown message type 4"},
		{"short key", frame(typeRowWrite, u64(1), u32(0), u32(1), u64(4096), u64(0), [31]byte{}), "fixed field needs 32 bytes, 31 left"},
		{"too many extents", rowWrite(4096, 1<<31), "extents cannot fit"},
		{"more extents than pages", rowWrite(8192, 3, u64(0), u64(1), u64(1), u64(1), u64(2), u64(1), [3]byte{}), "3 extents, at most 2 for a 8192-byte row"},
		{"empty extent", rowWrite(4096, 1, u64(0), u64(0), u8(0)), "extent 0 is empty"},
		{"extent past row", rowWrite(4096, 1, u64(4000), u64(97), [97]byte{}), "runs past the 4096-byte row"},
		{"extent offset overflow", rowWrite(4096, 1, u64(1<<64-1), u64(1), u8(1)), "runs past"},
		{"extent data missing", rowWrite(4096, 1, u64(0), u64(10), [9]byte{}), "extent 0 needs 10 bytes of the bulk, 9 left"},
		{"bulk too long", rowWrite(4096, 1, u64(0), u64(10), [11]byte{}), "1 trailing bytes"},
		{"overlapping extents", rowWrite(8192, 2, u64(0), u64(10), u64(9), u64(1), [11]byte{}), "extent 1 at 9 overlaps"},
		{"key too long", frame(typeStoreSample, u64(1), u32(0), u32(1), u64(4096), u32(0), u16(MaxKeyBytes+1)), "string of 1025 bytes, limit 1024"},
		{"key truncated", frame(typeStoreSample, u64(1), u32(0), u32(1), u64(4096), u32(0), u16(5), [4]byte{}), "string needs 5 bytes, 4 left"},
		{"short ack", frame(typeAck, u64(1), u32(0)), "uint32 needs 4 bytes, 0 left"},
		{"ack without a clock", frame(typeAck, u64(1), u32(0), u32(0), u16(0)), "uint64 needs 8 bytes, 2 left"},
	} {
		m, err := Decode(tc.frame)
		if err == nil || !errors.Is(err, ErrBadFrame) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Decode = %+v, %v; want ErrBadFrame containing %q", tc.name, m, err, tc.want)
		}
	}
}

// TestRowWriteExtentsAtMostOnePerPage checks that a RowWrite of 1-byte
// extents, one per minPageBytes of the row, is read, and that one more is
// refused by Decode and by receiveRow before it asks for a buffer.
func TestRowWriteExtentsAtMostOnePerPage(t *testing.T) {
	const rowBytes = 5*minPageBytes + 1
	for _, count := range []int{6, 7} {
		w := &RowWrite{Row: 0, Rows: 1, RowBytes: rowBytes}
		for i := range count {
			w.Extents = append(w.Extents, Extent{Off: uint64(i), Data: []byte{byte(i + 1)}})
		}
		frame := Encode(w)
		_, err := Decode(frame)
		r := bytes.NewReader(frame[5:])
		asked := false
		_, _, _, rerr := receiveRow(r, uint32(len(frame)-5), func(*RowWrite) ([]byte, error) { asked = true; return make([]byte, rowBytes), nil }, nil, plainBulk(r))
		switch {
		case count == 6 && (err != nil || rerr != nil):
			t.Errorf("6 extents of a %d-byte row: Decode %v, receiveRow %v", rowBytes, err, rerr)
		case count == 7 && (!errors.Is(err, ErrBadFrame) || !errors.Is(rerr, ErrBadFrame) || asked):
			t.Errorf("7 extents of a %d-byte row: Decode %v, receiveRow %v (asked for a buffer: %v)", rowBytes, err, rerr, asked)
		}
	}
}

func TestReadFrameLimits(t *testing.T) {
	for _, tc := range []struct {
		name  string
		input []byte
		limit int
		want  error
		text  string
	}{
		{"eof", nil, 100, io.EOF, ""},
		{"short header", []byte{0, 0}, 100, io.ErrUnexpectedEOF, ""},
		{"zero length", []byte{0, 0, 0, 0}, 100, ErrBadFrame, "length 0"},
		{"over limit", []byte{0, 0, 0, 101}, 100, ErrBadFrame, "length 101, limit 100"},
		{"over max", []byte{0xff, 0xff, 0xff, 0xff}, 1 << 40, ErrBadFrame, "limit 269484032"},
		{"short body", []byte{0, 0, 0, 10, 1, 2}, 100, io.ErrUnexpectedEOF, ""},
	} {
		_, err := ReadFrame(bytes.NewReader(tc.input), nil, tc.limit)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: ReadFrame = %v, want %v containing %q", tc.name, err, tc.want, tc.text)
		}
	}
}

// FuzzDecode checks that Decode never panics, that whatever it accepts
// re-encodes to the same bytes (the encoding is unique) and reads back
// through ReadFrame, and that the streaming receiveRow agrees with Decode on
// every RowWrite frame whose row is small enough to allocate.
func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		checkReceiveRow(t, b, m, err)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("Decode error %v does not wrap ErrBadFrame", err)
			}
			return
		}
		if enc := Encode(m); !bytes.Equal(enc, b) {
			t.Fatalf("Encode(Decode(%x)) = %x", b, enc)
		}
		if got, err := ReadFrame(bytes.NewReader(b), nil, MaxFrameBytes); err != nil || !bytes.Equal(got, b) {
			t.Fatalf("ReadFrame(%x) = %x, %v", b, got, err)
		}
	})
}

// checkReceiveRow checks that receiveRow accepts frame b exactly when Decode
// did (m, err) and then reads the extents Decode found, and that the commit
// makes of them the row they describe.
func checkReceiveRow(t *testing.T, b []byte, m Message, err error) {
	if len(b) < 5 || b[4] != typeRowWrite || int64(binary.BigEndian.Uint32(b)) != int64(len(b)-4) {
		return
	}
	buf, row := []byte(nil), []byte(nil)
	var dest *rowCommit
	bufFor := func(w *RowWrite) ([]byte, error) {
		if w.RowBytes > 1<<16 {
			return nil, errors.New("too large to check")
		}
		buf, row = make([]byte, w.RowBytes), bytes.Repeat([]byte{0xee}, int(w.RowBytes))
		dest = newRowCommit(row)
		return buf, nil
	}
	r := bytes.NewReader(b[5:])
	got, crc, refused, rerr := receiveRow(r, uint32(len(b)-5), bufFor, func(from, to uint64) { dest.gap(from, to) }, plainBulk(r))
	if dest != nil {
		defer dest.wait()
	}
	switch {
	case err != nil && rerr == nil && buf != nil:
		t.Fatalf("receiveRow accepted what Decode refused (%v)", err)
	case err == nil && rerr != nil:
		t.Fatalf("receiveRow refused what Decode accepted: %v", rerr)
	case err == nil && buf != nil:
		w := m.(*RowWrite)
		if refused != nil || got.Seq != w.Seq || got.Row != w.Row || !reflect.DeepEqual(applyExtents(w.RowBytes, got.Extents), applyExtents(w.RowBytes, w.Extents)) {
			t.Fatalf("receiveRow read %+v (refused %v), Decode %+v", got, refused, w)
		}
		want := applyExtents(w.RowBytes, w.Extents)
		if dest.commit(got.Extents); !bytes.Equal(row, want) || crc != block.CRC32C(want) {
			t.Fatalf("the commit made a different row, or receiveRow summed another (CRC32C %08x, want %08x)", crc, block.CRC32C(want))
		}
	}
}
