package rowsync

import (
	"bufio"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/flynn/noise"
)

// Records. After the handshake (auth.go) each direction of a connection is a
// sequence of records, each sealed with the direction's key:
//
//	uint16  n: length of the sealed record, big endian, tagBytes+1..MaxRecordBytes
//	n       AES-256-GCM of 1..maxRecordPlain plaintext bytes, with the
//	        record's index in its direction as the nonce and the two length
//	        bytes as additional data (the tag is the last tagBytes)
//
// The plaintext of a direction is its frames (wire.go) back to back; every
// frame starts a record, so a frame of F bytes takes ceil(F/maxRecordPlain)
// records. A receiver opens each record before it uses a byte of it, so a
// changed, dropped, replayed, reordered or injected record fails
// authentication (ErrAuth) and ends the connection.
//
// A RowWrite's bulk, the bytes of its extents, is the exception (protocol
// 4): its records hold the frame up to the bulk and end there, and the bulk
// follows in bulk records, sealed once for every peer the row goes to
// (sealBulk) under the RowWrite's Key, fresh and random for every mirrored
// row:
//
//	uint16  n: length of the sealed record, big endian, tagBytes+1..MaxRecordBytes
//	n       AES-256-GCM under Key of the bulk's next min(maxRecordPlain, left)
//	        bytes, with the record's index within the row as the nonce and
//	        the two length bytes as additional data
//
// A row of 8.6 MB takes about 130 bulk records. Key travels in the lane's
// records with the row's identity and extents, so it is as confidential and
// authenticated per lane as the rest of the frame; the peers of one row
// share it and get the same bulk records. A key is never reused, so no
// nonce repeats under one key. The receiver knows every bulk record's
// length from the frame's and checks it before it opens the record: a bulk
// record of another row (another key), moved within the row (another
// index), changed, cut short, lengthened or dropped fails authentication
// (ErrAuth), and a record appended after the bulk is read as the next lane
// record, which fails there.

const (
	// MaxRecordBytes is the largest sealed record: Noise's message limit.
	MaxRecordBytes = noise.MaxMsgLen
	// tagBytes is the size of an AES-GCM tag.
	tagBytes = 16
	// maxRecordPlain is the most plaintext one record holds.
	maxRecordPlain = MaxRecordBytes - tagBytes
	// flushBytes is how many sealed bytes a writer gathers before writing
	// them, and readBufferBytes how many a reader asks the connection for at
	// once: a few records per system call, and a receiver that starts
	// opening a row's records while the sender still seals the rest.
	flushBytes      = 256 << 10
	readBufferBytes = 256 << 10
	// BulkKeyBytes is the size of a RowWrite's Key: AES-256.
	BulkKeyBytes = 32
	// bulkStride is the place a full bulk record takes in a sealed bulk.
	bulkStride = 2 + MaxRecordBytes
	// bulkChunkRecords is how many bulk records are sealed (and then
	// written to each lane) at a time, about flushBytes.
	bulkChunkRecords = 4
	// sealWorkers is how many goroutines seal one row's bulk.
	sealWorkers = 4
)

// channel is one authenticated connection after the handshake. The writing
// side (writeFrame) and the reading side (Read, endFrame) may run in two
// goroutines; each side is used by one goroutine at a time.
type channel struct {
	conn       net.Conn
	r          *bufio.Reader // conn's bytes
	send, recv *noise.CipherState

	out  []byte  // sealed records not yet written
	asm  []byte  // a record's plaintext gathered from several pieces
	head [2]byte // the record being sealed's length bytes, kept here so that sealing allocates nothing of its own

	in   []byte // the sealed record being read
	left []byte // plaintext of the current record not yet read
}

func newChannel(conn net.Conn, send, recv *noise.CipherState) *channel {
	return &channel{conn: conn, r: bufio.NewReaderSize(conn, readBufferBytes), send: send, recv: recv}
}

// writeMessage seals the frame of m, which is not a RowWrite (writeRow),
// into records and writes them.
func (c *channel) writeMessage(m Message) error {
	return c.writeFrame(encodeFrame(m))
}

// writeFrame seals one frame, given as consecutive pieces, into records and
// writes them.
func (c *channel) writeFrame(pieces net.Buffers) error {
	if err := c.sealFrame(pieces); err != nil {
		return err
	}
	_, err := c.conn.Write(c.out)
	return err
}

// writeRow writes w with bulk: the frame up to the bulk in records, then
// the bulk's records, each chunk once it is sealed. w's Key and Extents are
// set to bulk's first, so that the frame describes the bulk it carries (a
// frame that did not would fail authentication at every peer).
func (c *channel) writeRow(w *RowWrite, bulk *sealedBulk) error {
	w.Key, w.Extents = bulk.key, bulk.extents
	head := appendRowHead(make([]byte, 5, 5+rowWriteHeadBytes+extentHeadBytes*len(w.Extents)), w)
	binary.BigEndian.PutUint32(head, uint32(len(head)-4)+uint32(bulk.plainBytes))
	head[4] = typeRowWrite
	if err := c.sealFrame(net.Buffers{head}); err != nil {
		return err
	}
	if _, err := c.conn.Write(c.out); err != nil {
		return err
	}
	for i, ready := range bulk.ready {
		<-ready
		if _, err := c.conn.Write(bulk.chunk(i)); err != nil {
			return err
		}
	}
	return nil
}

// sealFrame seals one frame, given as consecutive pieces, into records in
// c.out, writing them out flushBytes at a time; the last are left in c.out.
// A piece that fills whole records is sealed in place; smaller pieces are
// gathered first.
func (c *channel) sealFrame(pieces net.Buffers) error {
	c.out, c.asm = c.out[:0], c.asm[:0]
	for _, b := range pieces {
		for len(b) > 0 {
			if len(c.asm) == 0 && len(b) >= maxRecordPlain {
				if err := c.seal(b[:maxRecordPlain]); err != nil {
					return err
				}
				b = b[maxRecordPlain:]
			} else {
				n := min(len(b), maxRecordPlain-len(c.asm))
				c.asm, b = append(c.asm, b[:n]...), b[n:]
				if len(c.asm) == maxRecordPlain {
					if err := c.seal(c.asm); err != nil {
						return err
					}
					c.asm = c.asm[:0]
				}
			}
			if len(c.out) >= flushBytes {
				if _, err := c.conn.Write(c.out); err != nil {
					return err
				}
				c.out = c.out[:0]
			}
		}
	}
	if len(c.asm) > 0 {
		return c.seal(c.asm)
	}
	return nil
}

// seal appends the record of plain to c.out.
func (c *channel) seal(plain []byte) error {
	binary.BigEndian.PutUint16(c.head[:], uint16(len(plain)+tagBytes))
	out, err := c.send.Encrypt(append(c.out, c.head[:]...), c.head[:], plain)
	if err != nil {
		return fmt.Errorf("rowsync: sealing a record: %w", err)
	}
	c.out = out
	return nil
}

// Read reads plaintext, opening the next record when the current one is used
// up; a record that fits p is opened straight into it. A record that fails
// authentication is an error wrapping ErrAuth.
func (c *channel) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(c.left) == 0 {
		head, err := c.readRecord()
		if err != nil {
			return 0, err
		}
		if len(p) >= len(c.in)-tagBytes {
			plain, err := c.open(p[:0], head)
			return len(plain), err
		}
		if c.left, err = c.open(c.in[:0], head); err != nil {
			return 0, err
		}
	}
	n := copy(p, c.left)
	c.left = c.left[n:]
	return n, nil
}

// readRecord reads the next sealed record into c.in and returns its length
// bytes. End of stream at a record boundary is io.EOF.
func (c *channel) readRecord() (head [2]byte, err error) {
	if _, err := io.ReadFull(c.r, head[:]); err != nil {
		return head, err
	}
	n := int(binary.BigEndian.Uint16(head[:]))
	if n <= tagBytes {
		return head, fmt.Errorf("%w: record of %d bytes", ErrAuth, n)
	}
	if cap(c.in) < n {
		c.in = make([]byte, MaxRecordBytes)
	}
	c.in = c.in[:n]
	if _, err := io.ReadFull(c.r, c.in); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return head, err
	}
	return head, nil
}

// open authenticates and decrypts c.in, appending the plaintext to dst.
func (c *channel) open(dst []byte, head [2]byte) ([]byte, error) {
	index := c.recv.Nonce()
	plain, err := c.recv.Decrypt(dst, head[:], c.in)
	if err != nil {
		return nil, fmt.Errorf("%w: record %d failed authentication: changed, replayed, reordered or not sealed by the peer", ErrAuth, index)
	}
	return plain, nil
}

// endFrame checks that the frame just read ended its last record: a frame
// always starts a record.
func (c *channel) endFrame() error {
	if len(c.left) > 0 {
		return fmt.Errorf("%w: %d bytes after a frame's end in its last record", ErrBadFrame, len(c.left))
	}
	return nil
}

// readFrame reads one whole frame of at most limit bytes into buf (see
// ReadFrame) and checks that it ended its record.
func (c *channel) readFrame(buf []byte, limit int) ([]byte, error) {
	frame, err := ReadFrame(c, buf, limit)
	if err != nil {
		return nil, err
	}
	return frame, c.endFrame()
}

// bulk returns the reader of w's bulk of n bytes, which follows the frame
// up to it (it must have ended its record).
func (c *channel) bulk(w *RowWrite, n uint64) (io.Reader, error) {
	if err := c.endFrame(); err != nil {
		return nil, err
	}
	aead, err := bulkCipher(&w.Key)
	if err != nil {
		return nil, err
	}
	return &bulkReader{c: c, aead: aead, left: n}, nil
}

// bulkReader reads a row's bulk records from the channel's connection.
type bulkReader struct {
	c     *channel
	aead  cipher.AEAD
	index uint64 // of the next record
	left  uint64 // bulk bytes in records not read yet
	plain []byte // plaintext of the current record not yet read
}

// Read reads plaintext of the bulk, opening the next record when the
// current one is used up; a record that fits p is opened straight into it.
// A record that fails authentication, or whose length is not the one its
// place in the bulk has, is an error wrapping ErrAuth.
func (b *bulkReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(b.plain) == 0 {
		if b.left == 0 {
			return 0, io.EOF
		}
		head, err := b.c.readRecord()
		if err != nil {
			return 0, err
		}
		want := min(b.left, maxRecordPlain)
		if n := len(b.c.in) - tagBytes; uint64(n) != want {
			return 0, fmt.Errorf("%w: bulk record %d holds %d bytes, its place in the bulk %d", ErrAuth, b.index, n, want)
		}
		dst := b.c.in[:0]
		if uint64(len(p)) >= want {
			dst = p[:0]
		}
		plain, err := b.aead.Open(dst, bulkNonce(b.index), b.c.in, head[:])
		if err != nil {
			return 0, fmt.Errorf("%w: bulk record %d failed authentication: changed, moved, replayed or not sealed under this row's key", ErrAuth, b.index)
		}
		b.index++
		b.left -= want
		if uint64(len(p)) >= want {
			return len(plain), nil
		}
		b.plain = plain
	}
	n := copy(p, b.plain)
	b.plain = b.plain[n:]
	return n, nil
}

// bulkCipher returns the AES-256-GCM of a row's key.
func bulkCipher(key *[BulkKeyBytes]byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key[:])
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// bulkNonce is the nonce of bulk record index: as a lane record's, the
// index big endian after four zero bytes.
func bulkNonce(index uint64) []byte {
	var nonce [12]byte
	binary.BigEndian.PutUint64(nonce[4:], index)
	return nonce[:]
}

// sealedBulk is a row's bulk sealed once for every peer: record i at
// i*bulkStride of out, sealed by sealWorkers goroutines, a chunk of
// bulkChunkRecords records at a time in order, each chunk's ready closed
// once it is sealed.
type sealedBulk struct {
	key        [BulkKeyBytes]byte
	extents    []Extent
	starts     []uint64 // of each extent in the bulk
	plainBytes uint64
	records    int
	out        *[]byte
	ready      []chan struct{}
	next       atomic.Int64 // the next chunk to seal
	sealers    sync.WaitGroup
	writers    atomic.Int32 // lanes not done writing it (written)
}

// sealedBuffers holds the out buffers of sealed bulks no longer written,
// of at least pooledBytes: a smaller one, of a row of no or a few non-zero
// pages, is cheaper to allocate than to keep, and a row given it from the
// pool would allocate afresh anyway.
var sealedBuffers sync.Pool

// pooledBytes is the smallest sealed buffer kept for another row: one full
// bulk record.
const pooledBytes = bulkStride

// newBulkKey returns a fresh random key for a row's bulk.
func newBulkKey() (key [BulkKeyBytes]byte, err error) {
	if _, err := rand.Read(key[:]); err != nil {
		return key, fmt.Errorf("rowsync: a row's key: %w", err)
	}
	return key, nil
}

// sealBulk starts sealing the bytes of extents under key, which must never
// seal another bulk (newBulkKey), with workers goroutines, for writers
// lanes, each of which must call written once its write returned.
func sealBulk(key [BulkKeyBytes]byte, extents []Extent, workers, writers int) (*sealedBulk, error) {
	b := &sealedBulk{key: key, extents: extents, starts: make([]uint64, len(extents))}
	b.writers.Store(int32(writers))
	for i, e := range extents {
		b.starts[i] = b.plainBytes
		b.plainBytes += uint64(len(e.Data))
	}
	b.records = int((b.plainBytes + maxRecordPlain - 1) / maxRecordPlain)
	size := int(b.plainBytes) + b.records*(2+tagBytes)
	if size >= pooledBytes {
		b.out, _ = sealedBuffers.Get().(*[]byte)
	}
	if b.out == nil || cap(*b.out) < size {
		out := make([]byte, size)
		b.out = &out
	}
	*b.out = (*b.out)[:size]
	b.ready = make([]chan struct{}, (b.records+bulkChunkRecords-1)/bulkChunkRecords)
	for i := range b.ready {
		b.ready[i] = make(chan struct{})
	}
	for range min(workers, len(b.ready)) {
		aead, err := bulkCipher(&b.key)
		if err != nil {
			b.release()
			return nil, err
		}
		b.sealers.Go(func() { b.seal(aead) })
	}
	return b, nil
}

// seal seals the next chunk not taken by another worker until none is left.
func (b *sealedBulk) seal(aead cipher.AEAD) {
	var gather []byte
	for c := int(b.next.Add(1)) - 1; c < len(b.ready); c = int(b.next.Add(1)) - 1 {
		for i := c * bulkChunkRecords; i < min((c+1)*bulkChunkRecords, b.records); i++ {
			plain := b.plain(i, &gather)
			rec := (*b.out)[i*bulkStride:]
			binary.BigEndian.PutUint16(rec, uint16(len(plain)+tagBytes))
			aead.Seal(rec[2:2:2+len(plain)+tagBytes], bulkNonce(uint64(i)), plain, rec[:2])
		}
		close(b.ready[c])
	}
}

// plain returns the plaintext of record i: the bulk's bytes where they lie
// when one extent holds them all, else gathered into *gather.
func (b *sealedBulk) plain(i int, gather *[]byte) []byte {
	from := uint64(i) * maxRecordPlain
	to := min(from+maxRecordPlain, b.plainBytes)
	j, found := slices.BinarySearch(b.starts, from)
	if !found {
		j-- // the extent before the first starting past from
	}
	if e := b.extents[j]; to <= b.starts[j]+uint64(len(e.Data)) {
		return e.Data[from-b.starts[j] : to-b.starts[j]]
	}
	*gather = (*gather)[:0]
	for at := from; at < to; j++ {
		e := b.extents[j]
		piece := e.Data[at-b.starts[j] : min(to, b.starts[j]+uint64(len(e.Data)))-b.starts[j]]
		*gather = append(*gather, piece...)
		at += uint64(len(piece))
	}
	return *gather
}

// chunk returns the sealed records of chunk i.
func (b *sealedBulk) chunk(i int) []byte {
	out := *b.out
	return out[i*bulkChunkRecords*bulkStride : min((i+1)*bulkChunkRecords*bulkStride, len(out))]
}

// written tells b that a lane's write of it returned, whether it wrote it
// or not; after the last, b's buffer goes to another row: it is not held
// while the peers' acknowledgements are awaited.
func (b *sealedBulk) written() {
	if b.writers.Add(-1) == 0 {
		b.release()
	}
}

// release waits for the sealers and keeps the buffer for another row; b
// holds it no more.
func (b *sealedBulk) release() {
	b.sealers.Wait()
	if cap(*b.out) >= pooledBytes {
		sealedBuffers.Put(b.out)
	}
	b.out = nil
}
