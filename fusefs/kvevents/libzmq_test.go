package kvevents

import (
	"bufio"
	"encoding/hex"
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

// libzmqSubscriber is a router's SUB socket in libzmq (pyzmq, Debian's
// python3-zmq: `make deps`), the library routers use. With "bind" it binds
// a loopback port and prints it; otherwise it connects to argv[2]. It
// subscribes to "kv@" and prints the frames of the first message in hex.
const libzmqSubscriber = `
import sys, zmq
sub = zmq.Context.instance().socket(zmq.SUB)
sub.setsockopt(zmq.RCVTIMEO, 60000)
sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
if sys.argv[1] == "bind":
    print(sub.bind_to_random_port("tcp://127.0.0.1"), flush=True)
else:
    sub.connect(sys.argv[2])
print(" ".join(f.hex() for f in sub.recv_multipart()), flush=True)
`

// startLibzmqSubscriber runs libzmqSubscriber and returns its output lines.
func startLibzmqSubscriber(t *testing.T, args ...string) *bufio.Scanner {
	t.Helper()
	cmd := exec.Command("/usr/bin/python3", append([]string{"-c", libzmqSubscriber}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("libzmq subscriber (python3-zmq, make deps): %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("libzmq subscriber's stderr: %s", stderr.String())
		}
	})
	return bufio.NewScanner(out)
}

// checkLibzmqMessage reads the subscriber's message and checks it is the
// batch of blockG0 with topic and sequence number 0.
func checkLibzmqMessage(t *testing.T, lines *bufio.Scanner, topic string) {
	t.Helper()
	if !lines.Scan() {
		t.Fatalf("the libzmq subscriber received nothing: %v", lines.Err())
	}
	var frames [][]byte
	for _, f := range strings.Fields(lines.Text()) {
		b, err := hex.DecodeString(f)
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, b)
	}
	if len(frames) != 3 || string(frames[0]) != topic || hex.EncodeToString(frames[1]) != "0000000000000000" {
		t.Fatalf("frames %q: want topic %q, sequence number 0, payload", frames, topic)
	}
	if got := decodeBatch(t, frames[2]); len(got) != 1 || !reflect.DeepEqual(got[0].Hashes, []uint64{blockG0ID}) {
		t.Fatalf("events %+v, want block %d", got, blockG0ID)
	}
}

// TestPublisherServesLibzmqSubscriber: libzmq's SUB socket connects to a
// bound publisher, and a connecting publisher reaches libzmq's bound SUB;
// both receive the batch.
func TestPublisherServesLibzmqSubscriber(t *testing.T) {
	t.Run("bound", func(t *testing.T) {
		p, err := Start(Options{Endpoint: "tcp://*:0", Topic: "kv@node"})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		lines := startLibzmqSubscriber(t, "connect", "tcp://"+p.Addr().String())
		waitSubscribed(t, p)
		p.BlockGone(blockG0)
		checkLibzmqMessage(t, lines, "kv@node")
	})
	t.Run("connecting", func(t *testing.T) {
		lines := startLibzmqSubscriber(t, "bind")
		if !lines.Scan() {
			t.Fatalf("the libzmq subscriber bound nothing: %v", lines.Err())
		}
		p, err := Start(Options{Endpoint: "tcp://127.0.0.1:" + lines.Text(), Topic: "kv@node"})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		waitSubscribed(t, p)
		p.BlockGone(blockG0)
		checkLibzmqMessage(t, lines, "kv@node")
	})
}
