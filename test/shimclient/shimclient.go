// Package shimclient is a shim process speaking the GPU scheduler's protocol from Go, as libgpushare.so
// would, for the tests of the packages that run a scheduler (the node agent, its app). It speaks the
// current protocol version and opens a connection as the shim does: HELLO, then WELCOME and the claim
// LEDGER that follows it on every connection of protocol 6, read together.
package shimclient

import (
	"net"
	"os"
	"testing"
	"time"

	"github.com/gpusharing/gpusharing/agent/scheduler"
)

// ReadTimeout bounds every read: a scheduler that does not answer fails the test, never hangs it.
const ReadTimeout = 5 * time.Second

// Client is one connected shim process.
type Client struct {
	t    testing.TB
	Conn net.Conn
	// Welcome and Ledger are the connection's opening: the scheduler's terms and the claim's ledger
	// (flags 0: in none).
	Welcome, Ledger scheduler.Message
}

// Dial connects to the scheduler at sock as this process, for the GPU gpuUUID (empty: any), and reads
// the WELCOME and the LEDGER behind it. The connection closes when the test ends.
func Dial(t testing.TB, sock, gpuUUID string) *Client {
	t.Helper()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("connecting to the GPU's scheduler at %s: %v", sock, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c := &Client{t: t, Conn: conn}
	c.Send(scheduler.Message{Type: scheduler.MsgHello, PID: uint32(os.Getpid()), GPUUUID: gpuUUID})
	c.Welcome = c.Expect(scheduler.MsgWelcome)
	c.Ledger = c.Expect(scheduler.MsgLedger)
	return c
}

// Send writes m in the current protocol version.
func (c *Client) Send(m scheduler.Message) {
	c.t.Helper()
	b, err := scheduler.Encode(m)
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.Conn.Write(b); err != nil {
		c.t.Fatal(err)
	}
}

// Expect reads the scheduler's next message and fails the test unless it is of type typ.
func (c *Client) Expect(typ scheduler.MsgType) scheduler.Message {
	c.t.Helper()
	_ = c.Conn.SetReadDeadline(time.Now().Add(ReadTimeout))
	m, err := scheduler.ReadMessage(c.Conn)
	if err != nil {
		c.t.Fatalf("waiting for %s from the scheduler: %v", typ, err)
	}
	if m.Type != typ {
		c.t.Fatalf("the scheduler sent %s, want %s", m.Type, typ)
	}
	return m
}

// Until reads the scheduler's messages until one of type typ and returns it, skipping the others (the
// terms and the notices a scheduler may send first); it fails the test after ReadTimeout.
func (c *Client) Until(typ scheduler.MsgType) scheduler.Message {
	c.t.Helper()
	_ = c.Conn.SetReadDeadline(time.Now().Add(ReadTimeout))
	for {
		m, err := scheduler.ReadMessage(c.Conn)
		if err != nil {
			c.t.Fatalf("waiting for %s from the scheduler: %v", typ, err)
		}
		if m.Type == typ {
			return m
		}
	}
}
