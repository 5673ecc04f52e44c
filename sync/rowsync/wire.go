package rowsync

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/kvtierfs/kvtierfs/tiers/block"
)

// Wire format. Every message is one frame:
//
//	uint32  n: length of the rest of the frame, big endian, 1..MaxFrameBytes
//	uint8   message type (typeHello ... typeRowWrite)
//	n-1     body
//
// Bodies are fixed-width big-endian integers in declaration order; a string
// is a uint16 length and its bytes; a RowWrite's extents are a uint32 count,
// then per extent a uint64 offset and a uint64 length, then the extents'
// bytes back to back (the row's bulk). Decode rejects anything else,
// including trailing bytes, so the encoding of a message is unique.
//
// Frames never travel in the clear. Hello and Welcome are the payloads of
// the two handshake messages, and every later frame is sealed into records
// (see channel.go), a RowWrite's bulk in bulk records of its own, under the
// row's Key, sealed once for every peer. The client's first record holds
// Ready; then it sends RowWrite and StoreSample frames, possibly many before
// the first answer, and the server answers each with an Ack carrying the
// same Seq, in order. The server reads a RowWrite as a stream (receiveRow)
// into a buffer with the checks Decode makes, and writes the row only once
// the whole frame arrived.

// MaxFrameBytes bounds the length field of a frame: a row of MaxRowBytes plus
// its extent headers.
const MaxFrameBytes = MaxRowBytes + 1<<20

const (
	// MaxKeyBytes bounds StoreSample.Key; Encode truncates longer keys.
	MaxKeyBytes = 1024
	// MaxErrBytes bounds Ack.Err; Encode truncates longer messages.
	MaxErrBytes = 1024
	// MaxAddrBytes bounds Hello.To; Encode truncates longer addresses.
	MaxAddrBytes = 64
	// maxHandshakeFrame bounds the frames of the handshake (Hello, Welcome, Ready).
	maxHandshakeFrame = 128
	// maxAckFrame bounds the frames a Mirror reads (acks only).
	maxAckFrame = 64 + MaxErrBytes
	// maxRequestFrame bounds the frames a Server reads whole (all but
	// RowWrite, which it streams).
	maxRequestFrame = 64 + MaxKeyBytes
)

// Sizes of a RowWrite body before its extent headers, and of an extent header.
const (
	rowWriteHeadBytes = 8 + 4 + 4 + 8 + 8 + BulkKeyBytes + 4
	extentHeadBytes   = 16
)

// Message types. 2 and 3 were protocol 1's Challenge and Response, 4 the
// RowWrite of protocols 1 to 3 (each extent's header before its bytes, no
// key); they are not reused.
const (
	typeHello       uint8 = 1
	typeAck         uint8 = 5
	typeStoreSample uint8 = 6
	typeWelcome     uint8 = 7
	typeReady       uint8 = 8
	typeRowWrite    uint8 = 9
)

// ErrBadFrame is wrapped by every error Decode and ReadFrame return for bytes
// that are not a valid frame.
var ErrBadFrame = errors.New("rowsync: bad frame")

// Message is one of *Hello, *Welcome, *Ready, *RowWrite, *Ack, *StoreSample.
type Message interface {
	messageType() uint8
}

// Hello is the payload of the client's handshake message: who sends and to
// whom (see auth.go). Session is random per Mirror: a server serves one
// connection per session and drops the older one, so that rows still
// buffered on a connection the Mirror gave up on can never land after rows
// sent on its successor.
type Hello struct {
	Session uint64
	Node    NodeID // the sending node
	To      string // the IP:port the client's connection reached, at most MaxAddrBytes
}

// Welcome is the payload of the server's handshake message: the node that
// answers and the digest of its peer list (see selfEntries in self.go). A
// server answers a Hello from its own node too, so that a client that reached
// itself learns so (it then ends the handshake). Clock is the server's clock
// (Server.clock) when it answered, for the client's CommitBy (peerClock).
type Welcome struct {
	Node     NodeID
	PeerList PeerListDigest
	Clock    uint64
}

// Ready is the client's first record: it proves to the server that the
// client holds the session keys, before the server acts on its Hello.
type Ready struct{}

// RowWrite asks the server to make row Row of its region hold the extents,
// with zeros everywhere else. Rows and RowBytes are the sender's region
// geometry, which must equal the receiver's. Key is the one its bulk (the
// extents' bytes) is sealed under (channel.go), fresh for every mirrored
// row. CommitBy is the receiver's clock (Server.clock) from which on it must
// not write the row: the sender may have failed the load by then
// (peerClock.commitBy).
type RowWrite struct {
	Seq      uint64
	Row      uint32
	Rows     uint32
	RowBytes uint64
	CommitBy uint64
	Key      [BulkKeyBytes]byte
	Extents  []Extent // sorted, disjoint, non-empty, inside the row
}

// Extent is a run of bytes of a row at offset Off. After Decode, Data aliases
// the decoded frame.
type Extent struct {
	Off  uint64
	Data []byte
}

// Ack answers a RowWrite or a StoreSample with the same Seq: CRC is the
// CRC32C of row Row as the receiver now holds it. A non-empty Err means the
// request failed and CRC is meaningless. Clock is the receiver's clock
// (Server.clock) when it answered.
type Ack struct {
	Seq   uint64
	Row   uint32
	CRC   uint32
	Clock uint64
	Err   string
}

// StoreSample tells the server that the sender's worker stored block Key from
// row Row, whose CRC32C is CRC. The server answers with an Ack carrying the
// CRC32C of its own row Row, and both sides feed the pair to their Gate.
type StoreSample struct {
	Seq      uint64
	Row      uint32
	Rows     uint32
	RowBytes uint64
	CRC      uint32
	Key      string
}

func (*Hello) messageType() uint8       { return typeHello }
func (*Welcome) messageType() uint8     { return typeWelcome }
func (*Ready) messageType() uint8       { return typeReady }
func (*RowWrite) messageType() uint8    { return typeRowWrite }
func (*Ack) messageType() uint8         { return typeAck }
func (*StoreSample) messageType() uint8 { return typeStoreSample }

// Encode returns the frame of m.
func Encode(m Message) []byte {
	var frame []byte
	for _, b := range encodeFrame(m) {
		frame = append(frame, b...)
	}
	return frame
}

// encodeFrame returns the frame of m as buffers: the header and body, with a
// RowWrite's extent data left in place between its extent headers.
func encodeFrame(m Message) net.Buffers {
	head := make([]byte, 4, 64)
	head = append(head, m.messageType())
	var bufs net.Buffers
	switch m := m.(type) {
	case *Hello:
		head = binary.BigEndian.AppendUint64(head, m.Session)
		head = append(head, m.Node[:]...)
		head = appendString(head, m.To, MaxAddrBytes)
	case *Welcome:
		head = append(head, m.Node[:]...)
		head = append(head, m.PeerList[:]...)
		head = binary.BigEndian.AppendUint64(head, m.Clock)
	case *Ready:
	case *RowWrite:
		bufs = make(net.Buffers, 0, 1+len(m.Extents))
		bufs = append(bufs, appendRowHead(head, m))
		for _, e := range m.Extents {
			bufs = append(bufs, e.Data)
		}
	case *Ack:
		head = binary.BigEndian.AppendUint64(head, m.Seq)
		head = binary.BigEndian.AppendUint32(head, m.Row)
		head = binary.BigEndian.AppendUint32(head, m.CRC)
		head = binary.BigEndian.AppendUint64(head, m.Clock)
		head = appendString(head, m.Err, MaxErrBytes)
	case *StoreSample:
		head = binary.BigEndian.AppendUint64(head, m.Seq)
		head = binary.BigEndian.AppendUint32(head, m.Row)
		head = binary.BigEndian.AppendUint32(head, m.Rows)
		head = binary.BigEndian.AppendUint64(head, m.RowBytes)
		head = binary.BigEndian.AppendUint32(head, m.CRC)
		head = appendString(head, m.Key, MaxKeyBytes)
	}
	if bufs == nil {
		bufs = net.Buffers{head}
	}
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	binary.BigEndian.PutUint32(bufs[0], uint32(n-4))
	return bufs
}

// appendRowHead appends the body of w up to its bulk to head, a frame's
// length and type.
func appendRowHead(head []byte, w *RowWrite) []byte {
	head = binary.BigEndian.AppendUint64(head, w.Seq)
	head = binary.BigEndian.AppendUint32(head, w.Row)
	head = binary.BigEndian.AppendUint32(head, w.Rows)
	head = binary.BigEndian.AppendUint64(head, w.RowBytes)
	head = binary.BigEndian.AppendUint64(head, w.CommitBy)
	head = append(head, w.Key[:]...)
	head = binary.BigEndian.AppendUint32(head, uint32(len(w.Extents)))
	for _, e := range w.Extents {
		head = binary.BigEndian.AppendUint64(head, e.Off)
		head = binary.BigEndian.AppendUint64(head, uint64(len(e.Data)))
	}
	return head
}

// appendString appends s, truncated to limit bytes, with its uint16 length.
func appendString(dst []byte, s string, limit int) []byte {
	s = s[:min(len(s), limit)]
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...)
}

// ReadFrame reads one frame from r into buf (grown when too small) and returns
// it. A length field of 0 or above limit (at most MaxFrameBytes) is an error
// wrapping ErrBadFrame, reported before anything is allocated.
func ReadFrame(r io.Reader, buf []byte, limit int) ([]byte, error) {
	if cap(buf) < 4 {
		buf = make([]byte, 4, 64)
	}
	buf = buf[:4]
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(buf)
	if n == 0 || int64(n) > int64(min(limit, MaxFrameBytes)) {
		return nil, fmt.Errorf("%w: length %d, limit %d", ErrBadFrame, n, min(limit, MaxFrameBytes))
	}
	if cap(buf) < 4+int(n) {
		buf = append(buf[:4], make([]byte, n)...)
	}
	buf = buf[:4+n]
	if _, err := io.ReadFull(r, buf[4:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}

// Decode parses one whole frame. It never panics: every length is checked
// against what is left of the frame, geometry against MaxRowBytes, and
// extents against the row; violations are errors wrapping ErrBadFrame. The
// Data of decoded extents aliases frame.
func Decode(frame []byte) (Message, error) {
	if len(frame) < 5 {
		return nil, fmt.Errorf("%w: %d bytes, want at least 5", ErrBadFrame, len(frame))
	}
	n := binary.BigEndian.Uint32(frame)
	if int64(n) != int64(len(frame)-4) {
		return nil, fmt.Errorf("%w: length field %d, frame holds %d", ErrBadFrame, n, len(frame)-4)
	}
	if n > MaxFrameBytes {
		return nil, fmt.Errorf("%w: length %d, limit %d", ErrBadFrame, n, MaxFrameBytes)
	}
	d := decoder{b: frame[5:]}
	var m Message
	switch typ := frame[4]; typ {
	case typeHello:
		h := &Hello{Session: d.u64()}
		d.bytes(h.Node[:])
		h.To = d.str(MaxAddrBytes)
		m = h
	case typeWelcome:
		w := &Welcome{}
		d.bytes(w.Node[:])
		d.bytes(w.PeerList[:])
		w.Clock = d.u64()
		m = w
	case typeReady:
		m = &Ready{}
	case typeRowWrite:
		w, count := d.rowWriteHead()
		w.Extents = d.extents(count, w.RowBytes)
		m = w
	case typeAck:
		m = &Ack{Seq: d.u64(), Row: d.u32(), CRC: d.u32(), Clock: d.u64(), Err: d.str(MaxErrBytes)}
	case typeStoreSample:
		s := &StoreSample{Seq: d.u64(), Row: d.u32(), Rows: d.u32(), RowBytes: d.u64(), CRC: d.u32()}
		d.geometry(s.Row, s.Rows, s.RowBytes)
		s.Key = d.str(MaxKeyBytes)
		m = s
	default:
		return nil, fmt.Errorf("%w: unknown message type %d", ErrBadFrame, typ)
	}
	if d.err == nil && len(d.b) > 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	return m, nil
}

// decoder reads a body front to back. The first error sticks; after it every
// read returns zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrBadFrame, fmt.Sprintf(format, args...))
	}
}

// take returns the next n bytes, or nil after an error.
func (d *decoder) take(n uint64, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail("%s needs %d bytes, %d left", what, n, len(d.b))
		return nil
	}
	b := d.b[:n:n]
	d.b = d.b[n:]
	return b
}

func (d *decoder) u16() uint16 {
	if b := d.take(2, "uint16"); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if b := d.take(4, "uint32"); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if b := d.take(8, "uint64"); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

// bytes fills dst.
func (d *decoder) bytes(dst []byte) {
	copy(dst, d.take(uint64(len(dst)), "fixed field"))
}

func (d *decoder) str(limit int) string {
	n := d.u16()
	if d.err == nil && int(n) > limit {
		d.fail("string of %d bytes, limit %d", n, limit)
	}
	return string(d.take(uint64(n), "string"))
}

// geometry checks a row index against the region geometry.
func (d *decoder) geometry(row, rows uint32, rowBytes uint64) {
	switch {
	case d.err != nil:
	case rowBytes == 0 || rowBytes > MaxRowBytes:
		d.fail("row size %d, want 1..%d", rowBytes, MaxRowBytes)
	case row >= rows:
		d.fail("row %d of a %d-row region", row, rows)
	}
}

// rowWriteHead reads a RowWrite up to its extent headers, checks the
// geometry and returns the extent count.
func (d *decoder) rowWriteHead() (*RowWrite, uint32) {
	w := &RowWrite{Seq: d.u64(), Row: d.u32(), Rows: d.u32(), RowBytes: d.u64(), CommitBy: d.u64()}
	d.geometry(w.Row, w.Rows, w.RowBytes)
	d.bytes(w.Key[:])
	return w, d.u32()
}

// minPageBytes is the smallest page of any machine a node runs on.
const minPageBytes = 4096

// maxExtents is the most extents a RowWrite of a row of rowBytes may have:
// one per minPageBytes of the row. A sender's extents are runs of non-zero
// pages with a zero page between any two (nonZeroExtents, and the runs
// MirrorBlock is given), about half as many at most, whatever the sender's
// page size; more, down to 1-byte extents, would only make a receiver hold
// about 32 bytes of extent list per byte of row.
func maxExtents(rowBytes uint64) uint64 {
	return (rowBytes + minPageBytes - 1) / minPageBytes
}

// extentCount checks that count extents can fit in left bytes and are no
// more than a row of rowBytes may have (maxExtents), and returns the length
// of their bulk: each takes extentHeadBytes and at least one byte of it.
// Both bound what a decoder allocates.
func (d *decoder) extentCount(count uint32, rowBytes, left uint64) (bulk uint64) {
	switch {
	case d.err != nil:
	case uint64(count)*(extentHeadBytes+1) > left:
		d.fail("%d extents cannot fit in %d bytes", count, left)
	case uint64(count) > maxExtents(rowBytes):
		d.fail("%d extents, at most %d for a %d-byte row", count, maxExtents(rowBytes), rowBytes)
	}
	if d.err != nil {
		return 0
	}
	return left - uint64(count)*extentHeadBytes
}

// extentHead reads the offset and length of extent i and checks it against
// the end of the previous extent, the row, and the bytes of the bulk not
// claimed by the extents before it.
func (d *decoder) extentHead(i uint32, end, rowBytes, bulkLeft uint64) (off, n uint64) {
	off, n = d.u64(), d.u64()
	switch {
	case d.err != nil:
	case n == 0:
		d.fail("extent %d is empty", i)
	case off < end:
		d.fail("extent %d at %d overlaps or precedes the previous one (ends at %d)", i, off, end)
	case off > rowBytes || n > rowBytes-off:
		d.fail("extent %d (%d+%d) runs past the %d-byte row", i, off, n, rowBytes)
	case n > bulkLeft:
		d.fail("extent %d needs %d bytes of the bulk, %d left", i, n, bulkLeft)
	}
	return off, n
}

// extentsEnd checks that the extents claimed the whole bulk.
func (d *decoder) extentsEnd(bulkLeft uint64) {
	if d.err == nil && bulkLeft > 0 {
		d.fail("%d trailing bytes", bulkLeft)
	}
}

// extents reads count extent headers of a row of rowBytes, then their bulk.
func (d *decoder) extents(count uint32, rowBytes uint64) []Extent {
	bulkLeft := d.extentCount(count, rowBytes, uint64(len(d.b)))
	if d.err != nil {
		return nil
	}
	extents := make([]Extent, count)
	lens := make([]uint64, count)
	var end uint64 // end of the previous extent
	for i := range count {
		off, n := d.extentHead(i, end, rowBytes, bulkLeft)
		if d.err != nil {
			return nil
		}
		extents[i].Off, lens[i] = off, n
		bulkLeft -= n
		end = off + n
	}
	if d.extentsEnd(bulkLeft); d.err != nil {
		return nil
	}
	for i := range extents {
		extents[i].Data = d.take(lens[i], "extent data")
	}
	return extents
}

// receiveRow is the streaming counterpart of Decode for a RowWrite whose
// frame header (length, type) has been read: it reads the bodyLen bytes of
// the body, with the same checks, the extent headers from r and then the
// bulk from the reader bulk returns for the RowWrite (its Key) and the
// bulk's length, into the buffer bufFor returns for the RowWrite (as long as
// the row), each extent at its offset in the row. It returns the RowWrite
// with its extents aliasing that buffer and the CRC32C of the row it
// describes, summed as the bytes arrive. Nothing else is written: the caller
// writes the row (rowCommit) once the frame is complete. gap, unless nil, is
// told each range of the row outside every extent, all of them before the
// bulk. When bufFor fails, the rest of the body is read and dropped, and its
// error returned as refused. An error return means the stream is unusable:
// bytes that are not a valid frame (ErrBadFrame), a bulk record that fails
// authentication (ErrAuth), or a read error.
func receiveRow(r io.Reader, bodyLen uint32, bufFor func(*RowWrite) ([]byte, error), gap func(from, to uint64), bulk func(w *RowWrite, n uint64) (io.Reader, error)) (w *RowWrite, crc uint32, refused, err error) {
	if bodyLen < rowWriteHeadBytes {
		return nil, 0, nil, fmt.Errorf("%w: row write body of %d bytes", ErrBadFrame, bodyLen)
	}
	var head [rowWriteHeadBytes]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, 0, nil, err
	}
	d := decoder{b: head[:]}
	w, count := d.rowWriteHead()
	bulkLeft := d.extentCount(count, w.RowBytes, uint64(bodyLen)-rowWriteHeadBytes)
	if d.err != nil {
		return nil, 0, nil, d.err
	}
	bulkLen := bulkLeft
	buf, refused := bufFor(w)
	if refused == nil && uint64(len(buf)) != w.RowBytes {
		refused = fmt.Errorf("buffer of %d bytes for a %d-byte row", len(buf), w.RowBytes)
	}
	if refused != nil {
		if _, err = io.CopyN(io.Discard, r, int64(count)*extentHeadBytes); err == nil {
			err = discardBulk(w, bulkLen, bulk)
		}
		return w, 0, refused, err
	}
	if gap == nil {
		gap = func(from, to uint64) {}
	}
	if count == 0 {
		gap(0, w.RowBytes)
	}
	w.Extents = make([]Extent, 0, min(count, 1024))
	var end uint64 // end of the previous extent
	for i := range count {
		var eh [extentHeadBytes]byte
		if _, err := io.ReadFull(r, eh[:]); err != nil {
			return nil, 0, nil, err
		}
		d := decoder{b: eh[:]}
		off, n := d.extentHead(i, end, w.RowBytes, bulkLeft)
		if d.err != nil {
			return nil, 0, nil, d.err
		}
		if off > end {
			gap(end, off)
		}
		if i == count-1 && off+n < w.RowBytes {
			gap(off+n, w.RowBytes)
		}
		w.Extents = append(w.Extents, Extent{Off: off, Data: buf[off : off+n : off+n]})
		bulkLeft -= n
		end = off + n
	}
	if d.extentsEnd(bulkLeft); d.err != nil {
		return nil, 0, nil, d.err
	}
	br, err := bulk(w, bulkLen)
	if err != nil {
		return nil, 0, nil, err
	}
	end = 0
	for _, e := range w.Extents {
		crc = block.UpdateCRC32CZeros(crc, e.Off-end)
		if crc, err = readAndSum(crc, e.Data, br); err != nil {
			return nil, 0, nil, err
		}
		end = e.Off + uint64(len(e.Data))
	}
	return w, block.UpdateCRC32CZeros(crc, w.RowBytes-end), nil, nil
}

// discardBulk reads the n bytes of w's bulk from the reader bulk returns and
// drops them.
func discardBulk(w *RowWrite, n uint64, bulk func(*RowWrite, uint64) (io.Reader, error)) error {
	br, err := bulk(w, n)
	if err == nil {
		_, err = io.CopyN(io.Discard, br, int64(n))
	}
	return err
}

// rowCommit writes a received row into its destination row: the extents,
// and zeros elsewhere. Pages outside the extents are written only where they
// are not zero already: with one GPU per node a row's other slots are zero on
// every node (shared DESIGN §2), and clearing them made every peer write the
// whole row for each slot it received, a cost that grew with the row, not the
// slot. Those pages are read while the frame still arrives (gap): the gaps
// are queued, and scanLanes goroutines beside the receive scan them, so the
// commit after the frame writes the extents and only the stale pages found.
// The queue holds at most one gap more than the frame has extents
// (maxExtents). The destination is only read until commit, so a frame that
// fails leaves it as it was. Two frames for one row at once (two loads into
// one row, which an engine never issues) could leave it holding parts of
// both; the old whole-row write was not atomic either, only quicker.
type rowCommit struct {
	row   []byte
	scans sync.WaitGroup
	mu    sync.Mutex
	gaps  []block.Run // guarded by mu: gaps no scan has taken yet
	lanes int         // guarded by mu: scans running
	stale []block.Run // guarded by mu: non-zero pages outside the extents
}

// scanLanes is how many goroutines scan one row's gaps beside the receive.
const scanLanes = 2

func newRowCommit(row []byte) *rowCommit {
	return &rowCommit{row: row}
}

// gap notes that [from, to) of the row lies outside every extent of the
// frame, to be scanned for non-zero pages beside the receive.
func (c *rowCommit) gap(from, to uint64) {
	c.mu.Lock()
	c.gaps = append(c.gaps, block.Run{Start: int(from), End: int(to)})
	start := c.lanes < scanLanes
	if start {
		c.lanes++
	}
	c.mu.Unlock()
	if start {
		c.scans.Go(c.scan)
	}
}

// scan scans queued gaps until none is left.
func (c *rowCommit) scan() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.gaps) > 0 {
		g := c.gaps[0]
		c.gaps = c.gaps[1:]
		c.mu.Unlock()
		runs := findStale(c.row, g.Start, g.End)
		c.mu.Lock()
		c.stale = append(c.stale, runs...)
	}
	c.lanes--
}

// findStale maps [from, to) of row and returns its non-zero pages; tests
// replace it to hold a scan.
var findStale = func(row []byte, from, to int) []block.Run {
	prefault(row[from:to])
	return block.AppendNonZeroRuns(nil, row, from, to)
}

// wait waits for the gaps' scans.
func (c *rowCommit) wait() { c.scans.Wait() }

// commit makes the row hold extents (sorted, disjoint, inside the row, with
// every gap between and around them noted) and zeros elsewhere. The gaps'
// pages were mapped by their scans; the extents' pages are mapped here, an
// extent in one call (a daemon's mapping of the engine's region starts
// without any).
func (c *rowCommit) commit(extents []Extent) {
	c.wait()
	for _, r := range c.stale {
		clear(c.row[r.Start:r.End])
	}
	for _, e := range extents {
		prefault(c.row[e.Off-e.Off%uint64(block.PageSize) : e.Off+uint64(len(e.Data))])
		copy(c.row[e.Off:], e.Data)
	}
}
