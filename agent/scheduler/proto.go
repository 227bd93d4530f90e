package scheduler

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Wire protocol between the shim and the scheduler. The numbers are defined
// once, in shim/include/gpushare_proto.h; proto_test.go parses that header and
// fails when these constants drift from it.
const (
	Magic      uint32 = 0x48535047 // bytes "GPSH"
	Version    uint16 = 1
	MaxMsgSize        = 256
	UUIDLen           = 64

	HeaderSize    = 12
	HelloSize     = 84
	WelcomeSize   = 24
	AcquireSize   = 12
	GrantSize     = 20
	ReleaseSize   = 16
	ContendedSize = 20
	RevokedSize   = 16
)

// MsgType names a message; each type has one fixed size.
type MsgType uint16

const (
	MsgHello     MsgType = 1 // client -> scheduler, first message
	MsgWelcome   MsgType = 2 // scheduler -> client, answer to hello
	MsgAcquire   MsgType = 3 // client -> scheduler
	MsgGrant     MsgType = 4 // scheduler -> client
	MsgRelease   MsgType = 5 // client -> scheduler
	MsgContended MsgType = 6 // scheduler -> holder: someone waits
	MsgRevoked   MsgType = 7 // scheduler -> holder: held past quantum + grace
)

var msgSizes = map[MsgType]int{
	MsgHello:     HelloSize,
	MsgWelcome:   WelcomeSize,
	MsgAcquire:   AcquireSize,
	MsgGrant:     GrantSize,
	MsgRelease:   ReleaseSize,
	MsgContended: ContendedSize,
	MsgRevoked:   RevokedSize,
}

func (t MsgType) String() string {
	switch t {
	case MsgHello:
		return "Hello"
	case MsgWelcome:
		return "Welcome"
	case MsgAcquire:
		return "Acquire"
	case MsgGrant:
		return "Grant"
	case MsgRelease:
		return "Release"
	case MsgContended:
		return "Contended"
	case MsgRevoked:
		return "Revoked"
	}
	return fmt.Sprintf("MsgType(%d)", uint16(t))
}

// Priority is a client's class; high-priority waiters go first at each hand-off.
type Priority uint32

const (
	PriorityNormal Priority = 0
	PriorityHigh   Priority = 1
)

func (p Priority) String() string {
	if p == PriorityHigh {
		return "High"
	}
	return "Normal"
}

// Sentinel decode errors; a peer that triggers any of them is disconnected.
var (
	ErrBadMagic     = errors.New("bad magic")
	ErrBadVersion   = errors.New("unsupported protocol version")
	ErrUnknownType  = errors.New("unknown message type")
	ErrBadSize      = errors.New("message size does not match its type")
	ErrBadField     = errors.New("invalid field value")
	ErrShortMessage = errors.New("short message")
)

// Message is any protocol message; only the fields of its Type are meaningful.
type Message struct {
	Type MsgType

	PID      uint32   // Hello
	Priority Priority // Hello
	GPUUUID  string   // Hello; empty means "whatever GPU this socket serves"

	ClientID  uint32 // Welcome
	QuantumMS uint32 // Welcome, Grant
	GraceMS   uint32 // Welcome

	Epoch   uint32 // Grant, Release, Contended, Revoked
	Waiters uint32 // Contended
}

var le = binary.LittleEndian

// Encode returns the wire form of m.
func Encode(m Message) ([]byte, error) {
	size, ok := msgSizes[m.Type]
	if !ok {
		return nil, fmt.Errorf("encode %v: %w", m.Type, ErrUnknownType)
	}
	b := make([]byte, size)
	le.PutUint32(b[0:], Magic)
	le.PutUint16(b[4:], Version)
	le.PutUint16(b[6:], uint16(m.Type))
	le.PutUint32(b[8:], uint32(size))
	p := b[HeaderSize:]
	switch m.Type {
	case MsgHello:
		if len(m.GPUUUID) >= UUIDLen || bytes.IndexByte([]byte(m.GPUUUID), 0) >= 0 {
			return nil, fmt.Errorf("encode hello uuid %q: %w", m.GPUUUID, ErrBadField)
		}
		if m.Priority > PriorityHigh {
			return nil, fmt.Errorf("encode hello priority %d: %w", m.Priority, ErrBadField)
		}
		le.PutUint32(p[0:], m.PID)
		le.PutUint32(p[4:], uint32(m.Priority))
		copy(p[8:8+UUIDLen], m.GPUUUID)
	case MsgWelcome:
		le.PutUint32(p[0:], m.ClientID)
		le.PutUint32(p[4:], m.QuantumMS)
		le.PutUint32(p[8:], m.GraceMS)
	case MsgAcquire:
	case MsgGrant:
		le.PutUint32(p[0:], m.Epoch)
		le.PutUint32(p[4:], m.QuantumMS)
	case MsgRelease, MsgRevoked:
		le.PutUint32(p[0:], m.Epoch)
	case MsgContended:
		le.PutUint32(p[0:], m.Epoch)
		le.PutUint32(p[4:], m.Waiters)
	}
	return b, nil
}

// parseHeader validates a header and returns the type and total size.
func parseHeader(h []byte) (MsgType, int, error) {
	if len(h) < HeaderSize {
		return 0, 0, ErrShortMessage
	}
	if le.Uint32(h[0:]) != Magic {
		return 0, 0, ErrBadMagic
	}
	if le.Uint16(h[4:]) != Version {
		return 0, 0, fmt.Errorf("%w %d", ErrBadVersion, le.Uint16(h[4:]))
	}
	t := MsgType(le.Uint16(h[6:]))
	want, ok := msgSizes[t]
	if !ok {
		return 0, 0, fmt.Errorf("%w %d", ErrUnknownType, uint16(t))
	}
	if got := le.Uint32(h[8:]); got != uint32(want) {
		return 0, 0, fmt.Errorf("%v of %d bytes: %w", t, got, ErrBadSize)
	}
	return t, want, nil
}

// Decode parses exactly one message; b must hold exactly its bytes.
func Decode(b []byte) (Message, error) {
	t, size, err := parseHeader(b)
	if err != nil {
		return Message{}, err
	}
	if len(b) != size {
		return Message{}, fmt.Errorf("%v: %d bytes for a %d-byte message: %w", t, len(b), size, ErrBadSize)
	}
	m := Message{Type: t}
	p := b[HeaderSize:]
	switch t {
	case MsgHello:
		m.PID = le.Uint32(p[0:])
		m.Priority = Priority(le.Uint32(p[4:]))
		if m.Priority > PriorityHigh {
			return Message{}, fmt.Errorf("hello priority %d: %w", m.Priority, ErrBadField)
		}
		raw := p[8 : 8+UUIDLen]
		n := bytes.IndexByte(raw, 0)
		if n < 0 {
			return Message{}, fmt.Errorf("hello uuid not NUL-terminated: %w", ErrBadField)
		}
		for _, c := range raw[n:] {
			if c != 0 {
				return Message{}, fmt.Errorf("hello uuid padding not zero: %w", ErrBadField)
			}
		}
		m.GPUUUID = string(raw[:n])
	case MsgWelcome:
		m.ClientID = le.Uint32(p[0:])
		m.QuantumMS = le.Uint32(p[4:])
		m.GraceMS = le.Uint32(p[8:])
	case MsgAcquire:
	case MsgGrant:
		m.Epoch = le.Uint32(p[0:])
		m.QuantumMS = le.Uint32(p[4:])
	case MsgRelease, MsgRevoked:
		m.Epoch = le.Uint32(p[0:])
	case MsgContended:
		m.Epoch = le.Uint32(p[0:])
		m.Waiters = le.Uint32(p[4:])
	}
	return m, nil
}

// ReadMessage reads one message from r, validating the header before reading
// the body so a hostile size never makes it allocate or block for long.
func ReadMessage(r io.Reader) (Message, error) {
	var buf [MaxMsgSize]byte
	if _, err := io.ReadFull(r, buf[:HeaderSize]); err != nil {
		return Message{}, err
	}
	_, size, err := parseHeader(buf[:HeaderSize])
	if err != nil {
		return Message{}, err
	}
	if _, err := io.ReadFull(r, buf[HeaderSize:size]); err != nil {
		return Message{}, fmt.Errorf("body: %w", err)
	}
	return Decode(buf[:size])
}
