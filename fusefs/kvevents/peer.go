package kvevents

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// peer is one subscriber's connection.
type peer struct {
	conn net.Conn
	in   *bufio.Reader
	// out holds encoded messages for the writer, at most socketHWM.
	out  chan []byte
	done chan struct{}
	once sync.Once

	mu     sync.Mutex
	topics [][]byte
}

func newPeer(conn net.Conn) *peer {
	return &peer{conn: conn, in: bufio.NewReaderSize(conn, 4096), out: make(chan []byte, socketHWM), done: make(chan struct{})}
}

// handshake exchanges greetings and READY commands within handshakeTimeout
// and checks the peer is a SUB or XSUB socket.
func (pr *peer) handshake() error {
	if err := pr.conn.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return err
	}
	if _, err := pr.conn.Write(greeting()); err != nil {
		return err
	}
	if err := readGreeting(pr.in); err != nil {
		return err
	}
	if _, err := pr.conn.Write(readyCommand()); err != nil {
		return err
	}
	flags, body, err := readFrame(pr.in)
	if err != nil {
		return err
	}
	name, props, err := command(body)
	if err != nil || flags&flagCommand == 0 || name != "READY" {
		return errors.New("the first frame is not READY")
	}
	typ, err := socketType(props)
	if err != nil {
		return err
	}
	if typ != "SUB" && typ != "XSUB" {
		return fmt.Errorf("peer socket type %q cannot subscribe", typ)
	}
	return pr.conn.SetDeadline(time.Time{})
}

// read applies the peer's subscriptions and answers its heartbeats until
// the connection fails or sends what a subscriber does not. A peer holding
// no subscription for handshakeTimeout is dropped: it only holds a slot.
func (pr *peer) read() error {
	for {
		deadline := time.Time{}
		if !pr.subscribed() {
			deadline = time.Now().Add(handshakeTimeout)
		}
		if err := pr.conn.SetReadDeadline(deadline); err != nil {
			return err
		}
		flags, body, err := readFrame(pr.in)
		if err != nil {
			return err
		}
		if flags&flagCommand == 0 {
			// A ZMTP 3.0 subscription: 1 or 0, then the topic prefix.
			// Other messages mean nothing to a PUB socket.
			if flags&flagMore == 0 && len(body) > 0 && body[0] <= 1 {
				if err := pr.subscribe(body[0] == 1, body[1:]); err != nil {
					return err
				}
			}
			continue
		}
		name, data, err := command(body)
		if err != nil {
			return err
		}
		switch name {
		case "SUBSCRIBE", "CANCEL": // ZMTP 3.1
			if err := pr.subscribe(name == "SUBSCRIBE", data); err != nil {
				return err
			}
		case "PING":
			// TTL (2 bytes), then a context of at most 16 bytes, echoed.
			if len(data) < 2 || len(data) > 2+16 {
				return errBadFrame
			}
			pr.queue(appendCommand(nil, "PONG", data[2:]))
		case "ERROR":
			return errors.New("peer sent ERROR")
		}
	}
}

// subscribe adds or cancels one subscription; a peer holds at most maxTopics.
func (pr *peer) subscribe(add bool, topic []byte) error {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	for i, t := range pr.topics {
		if bytes.Equal(t, topic) {
			if !add {
				pr.topics = append(pr.topics[:i], pr.topics[i+1:]...)
			}
			return nil
		}
	}
	if !add {
		return nil
	}
	if len(pr.topics) >= maxTopics {
		return fmt.Errorf("more than %d subscriptions", maxTopics)
	}
	pr.topics = append(pr.topics, bytes.Clone(topic))
	return nil
}

// wants tells whether one of the peer's subscriptions is a prefix of topic.
func (pr *peer) wants(topic []byte) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	for _, t := range pr.topics {
		if bytes.HasPrefix(topic, t) {
			return true
		}
	}
	return false
}

// subscribed tells whether the peer holds any subscription.
func (pr *peer) subscribed() bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return len(pr.topics) > 0
}

// queue hands an encoded message to the writer, dropping it when the peer
// already has socketHWM waiting.
func (pr *peer) queue(msg []byte) {
	select {
	case pr.out <- msg:
	default:
	}
}

// write sends queued messages until close; a write that fails or takes
// longer than writeTimeout ends the connection.
func (pr *peer) write() {
	for {
		select {
		case <-pr.done:
			return
		case msg := <-pr.out:
			if err := pr.conn.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
				pr.conn.Close()
				return
			}
			if _, err := pr.conn.Write(msg); err != nil {
				pr.conn.Close()
				return
			}
		}
	}
}

// close stops the writer.
func (pr *peer) close() {
	pr.once.Do(func() { close(pr.done) })
}
