package kvevents

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The publishing side of ZMTP 3.0 with the NULL mechanism
// (rfc.zeromq.org/spec/23), as a PUB socket speaks it to SUB sockets. Every
// size a peer sends is checked against what a subscriber can legitimately
// send before anything is allocated for it: a peer is a subscriber, which
// sends a handshake, subscriptions and heartbeats, all small.

const (
	greetingLen = 64
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
	// maxPeerFrame bounds any frame a peer sends: its READY command (socket
	// type and identity), a subscription (one byte and a topic prefix), a
	// SUBSCRIBE, CANCEL or PING command.
	maxPeerFrame = 4096
	// maxTopics bounds the subscriptions one peer holds.
	maxTopics = 64
)

var (
	errFrameTooLarge = errors.New("ZMTP frame larger than a subscriber sends")
	errBadFrame      = errors.New("not a ZMTP 3 frame")
	errBadGreeting   = errors.New("not a ZMTP 3 NULL-mechanism greeting")
)

// greeting is what the publisher sends first: signature, version 3.0,
// mechanism NULL, as-server 0 (the NULL mechanism has no roles).
func greeting() []byte {
	g := make([]byte, greetingLen)
	g[0], g[9] = 0xFF, 0x7F
	g[10], g[11] = 3, 0
	copy(g[12:32], "NULL")
	return g
}

// readGreeting reads the peer's 64-byte greeting and checks it offers ZMTP 3
// or later with the NULL mechanism.
func readGreeting(r io.Reader) error {
	var g [greetingLen]byte
	if _, err := io.ReadFull(r, g[:]); err != nil {
		return err
	}
	if g[0] != 0xFF || g[9] != 0x7F || g[10] < 3 || string(bytes.TrimRight(g[12:32], "\x00")) != "NULL" {
		return errBadGreeting
	}
	return nil
}

// readFrame reads one frame of at most maxPeerFrame bytes; a header claiming
// more is an error before any byte of the body is read.
func readFrame(r *bufio.Reader) (flags byte, body []byte, err error) {
	if flags, err = r.ReadByte(); err != nil {
		return 0, nil, err
	}
	if flags&^(flagMore|flagLong|flagCommand) != 0 || flags&(flagCommand|flagMore) == flagCommand|flagMore {
		return 0, nil, errBadFrame
	}
	var size uint64
	if flags&flagLong != 0 {
		var b [8]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, err
		}
		size = binary.BigEndian.Uint64(b[:])
	} else {
		b, err := r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		size = uint64(b)
	}
	if size > maxPeerFrame {
		return 0, nil, fmt.Errorf("%w: %d bytes, at most %d", errFrameTooLarge, size, maxPeerFrame)
	}
	body = make([]byte, size)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	return flags, body, nil
}

// command splits a command frame's body into its name and data.
func command(body []byte) (name string, data []byte, err error) {
	if len(body) == 0 || int(body[0]) > len(body)-1 {
		return "", nil, errBadFrame
	}
	n := int(body[0])
	return string(body[1 : 1+n]), body[1+n:], nil
}

// appendCommand appends a command frame.
func appendCommand(dst []byte, name string, data []byte) []byte {
	return appendFrame(dst, flagCommand, append(append([]byte{byte(len(name))}, name...), data...))
}

// readyCommand is the publisher's READY: its socket type.
func readyCommand() []byte {
	props := []byte{byte(len("Socket-Type"))}
	props = append(props, "Socket-Type"...)
	props = binary.BigEndian.AppendUint32(props, uint32(len("PUB")))
	props = append(props, "PUB"...)
	return appendCommand(nil, "READY", props)
}

// socketType reads the Socket-Type property of a READY command's data.
func socketType(props []byte) (string, error) {
	for len(props) > 0 {
		n := int(props[0])
		if len(props) < 1+n+4 {
			return "", errBadFrame
		}
		name := string(props[1 : 1+n])
		size := binary.BigEndian.Uint32(props[1+n:])
		props = props[1+n+4:]
		if uint64(size) > uint64(len(props)) {
			return "", errBadFrame
		}
		if bytes.EqualFold([]byte(name), []byte("Socket-Type")) {
			return string(props[:size]), nil
		}
		props = props[size:]
	}
	return "", errors.New("READY without a Socket-Type")
}

// appendFrame appends one frame with the given flags (the long-size flag is
// set here when the body needs it).
func appendFrame(dst []byte, flags byte, body []byte) []byte {
	if len(body) > 255 {
		dst = append(dst, flags|flagLong)
		dst = binary.BigEndian.AppendUint64(dst, uint64(len(body)))
	} else {
		dst = append(dst, flags, byte(len(body)))
	}
	return append(dst, body...)
}

// encodeMessage encodes a multipart message, ready to be written to every
// subscriber.
func encodeMessage(frames ...[]byte) []byte {
	var msg []byte
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = flagMore
		}
		msg = appendFrame(msg, flags, f)
	}
	return msg
}
