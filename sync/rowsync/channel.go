package rowsync

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"

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
// records and a row of 8.6 MB about 130. A receiver opens each record
// before it uses a byte of it, so a changed, dropped, replayed, reordered or
// injected record fails authentication (ErrAuth) and ends the connection.

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

// writeMessage seals the frame of m into records and writes them; extent
// data is sealed from where it lies.
func (c *channel) writeMessage(m Message) error {
	return c.writeFrame(encodeFrame(m))
}

// writeFrame seals one frame, given as consecutive pieces, into records and
// writes them. A piece that fills whole records is sealed in place; smaller
// pieces are gathered first.
func (c *channel) writeFrame(pieces net.Buffers) error {
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
		if err := c.seal(c.asm); err != nil {
			return err
		}
	}
	_, err := c.conn.Write(c.out)
	return err
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
