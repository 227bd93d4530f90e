package scheduler

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// Socket deadlines are compared by the kernel with the wall clock, so the functions here take time.Now,
// not the injected clock (which decides quanta and grace).

// readHello reads a connection's first message within HelloTimeout. false: no valid hello, or one
// configured for another GPU; the caller drops the connection.
func (s *Scheduler) readHello(conn net.Conn, q *queue) (Message, bool) {
	_ = conn.SetReadDeadline(time.Now().Add(s.opts.HelloTimeout))
	hello, err := ReadMessage(conn)
	if err != nil || hello.Type != MsgHello {
		q.log.V(1).Info("Dropping shim connection without a valid hello", "err", err, "type", hello.Type)
		s.metrics.dropped.WithLabelValues(q.uuid, DropNoHello).Inc()
		return Message{}, false
	}
	if hello.GPUUUID != "" && hello.GPUUUID != q.uuid {
		q.log.Info("Refusing shim client configured for another GPU", "clientGPU", hello.GPUUUID, "pid", hello.PID)
		return Message{}, false
	}
	_ = conn.SetReadDeadline(time.Time{})
	return hello, true
}

// readClient serves a client's messages until its connection ends or it breaks the protocol.
func (s *Scheduler) readClient(conn net.Conn, q *queue, c *client, lm *member, pid int32, version uint16) {
	for {
		m, err := readFrame(conn, s.opts.FrameTimeout)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) && !isEOF(err) {
				q.log.Info("Dropping shim client after a protocol error", "client", c.id, "pid", pid, "err", err.Error())
				s.countDrop(q, err)
			}
			return
		}
		if m.Version != version {
			q.log.Info("Dropping shim client that changed protocol version", "client", c.id, "pid", pid,
				"hello", version, "frame", m.Version)
			return
		}
		if err := s.dispatch(q, c, lm, s.crossCheck(q, pid, m)); err != nil {
			q.log.Info("Dropping shim client after a protocol error", "client", c.id, "pid", pid, "err", err.Error())
			return
		}
	}
}

// dispatch acts on one message of a connected client; an error ends the client.
func (s *Scheduler) dispatch(q *queue, c *client, lm *member, m Message) error {
	switch m.Type {
	case MsgAcquire:
		q.acquire(c, m.Need)
	case MsgRelease:
		q.release(c, m.Epoch, m.Resident)
	case MsgMemReq:
		q.memReq(c, m.Need)
	case MsgUsage:
		q.usage(c, m)
	case MsgRejoin:
		q.rejoin(c, m)
	case MsgCharge, MsgReturn:
		return s.chargeMessage(q, lm, c.pid, m)
	case MsgPing:
		q.pong(c, m.Seq)
	case MsgPacing:
		if q.pacing(c, m) {
			s.clientsChanged(q.uuid)
		}
	default:
		return fmt.Errorf("unexpected message %v from a client", m.Type)
	}
	return nil
}

// connWriter writes a client's messages from a goroutine of its own, so that a client that stops
// reading never blocks the queue: send never waits (a full outbox is the caller's to handle), and a
// write that misses its deadline closes the connection, which ends the client's reader.
type connWriter struct {
	conn    net.Conn
	out     chan []byte
	done    chan struct{} // closed by stop: the connection is over
	stopped chan struct{}
	once    sync.Once
}

func startConnWriter(conn net.Conn, timeout time.Duration) *connWriter {
	w := &connWriter{conn: conn, out: make(chan []byte, 64), done: make(chan struct{}), stopped: make(chan struct{})}
	go w.run(timeout)
	return w
}

func (w *connWriter) run(timeout time.Duration) {
	defer close(w.stopped)
	for {
		select {
		case b := <-w.out:
			_ = w.conn.SetWriteDeadline(time.Now().Add(timeout))
			if _, err := w.conn.Write(b); err != nil {
				w.drop()
				return
			}
		case <-w.done:
			return
		}
	}
}

// send queues b; false when the outbox is full.
func (w *connWriter) send(b []byte) bool {
	select {
	case w.out <- b:
		return true
	default:
		return false
	}
}

// drop closes the connection, once.
func (w *connWriter) drop() { w.once.Do(func() { _ = w.conn.Close() }) }

// stop ends the writer and waits for it.
func (w *connWriter) stop() {
	close(w.done)
	<-w.stopped
}
