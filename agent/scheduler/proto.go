package scheduler

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Wire protocol between the shim and the scheduler. The numbers are defined
// once, in shim/include/gpushare_proto.h; proto_test.go parses that header and
// fails when these constants drift from it.
const (
	Magic      uint32 = 0x48535047 // bytes "GPSH"
	Version    uint16 = 7
	MaxMsgSize        = 256
	UUIDLen           = 64

	HeaderSize    = 12
	HelloSize     = 84
	WelcomeSize   = 36
	AcquireSize   = 20
	GrantSize     = 28
	ReleaseSize   = 28
	ContendedSize = 20
	RevokedSize   = 16
	MemReqSize    = 20
	MemReplySize  = 28
	EvictSize     = 24
	UsageSize     = 84
	RejoinSize    = 44
	RaiseSize     = 28
	PaceSize      = 16
	IdleSize      = 16
	LedgerSize    = 68
	ChargeSize    = 28
	ChargedSize   = 52
	ReturnSize    = 28
	PingSize      = 16
	PongSize      = 16
	PolicySize    = 16
	PacingSize    = 20
	SettleSize    = 16
	PaceTimeSize  = 16
)

// MinVersion is the oldest peer the scheduler still serves (in that peer's version, without what
// came later: a version 2 client never gets a partial Grant or a Raise).
const MinVersion uint16 = 2

// MsgType names a message; each type has one fixed size.
type MsgType uint16

const (
	MsgHello     MsgType = 1  // client -> scheduler, first message
	MsgWelcome   MsgType = 2  // scheduler -> client, answer to hello
	MsgAcquire   MsgType = 3  // client -> scheduler
	MsgGrant     MsgType = 4  // scheduler -> client
	MsgRelease   MsgType = 5  // client -> scheduler
	MsgContended MsgType = 6  // scheduler -> holder: someone waits
	MsgRevoked   MsgType = 7  // scheduler -> holder: held past quantum + grace
	MsgMemReq    MsgType = 8  // holder -> scheduler: raise my reservation to Need
	MsgMemReply  MsgType = 9  // scheduler -> holder: answer to MemReq
	MsgEvict     MsgType = 10 // scheduler -> non-holder: bring resident bytes down to Target
	MsgUsage     MsgType = 11 // client -> scheduler: memory state and swap counters
	MsgRejoin    MsgType = 12 // client -> scheduler, right after Welcome on a reconnection (rebuild.go)
	MsgRaise     MsgType = 13 // scheduler -> holder filling in after a partial Grant (version 3): reservation raised
	MsgPace      MsgType = 14 // scheduler -> opportunistic client (version 4): keep at most MaxQueued launches outstanding
	MsgIdle      MsgType = 15 // scheduler -> client (version 5): release after IdleUS without a GPU call; 0: its own window
	MsgLedger    MsgType = 16 // scheduler -> client (version 6): its claim's ledger, after Welcome and on every change (ledger.go)
	MsgCharge    MsgType = 17 // client -> scheduler (version 6): raise my grant by at least Bytes
	MsgCharged   MsgType = 18 // scheduler -> client (version 6): answer to Charge
	MsgReturn    MsgType = 19 // client -> scheduler (version 6): give Bytes of my grant back; ReturnHold: my grant is Bytes
	MsgPing      MsgType = 20 // client -> scheduler (version 6): a waiter asks whether the scheduler still answers
	MsgPong      MsgType = 21 // scheduler -> client (version 6): the answer to Ping, with its Seq
	MsgPolicy    MsgType = 22 // scheduler -> client (version 6), right after Welcome: Flags (PolicyEnvOverrides)
	MsgPacing    MsgType = 23 // client -> scheduler (version 6): the launch bound in force (MaxQueued) and its PacingState
	MsgSettle    MsgType = 24 // scheduler -> client (version 7): release once its work completed and FloorUS passed without a call; 0: off
	MsgPaceTime  MsgType = 25 // scheduler -> opportunistic client (version 7): keep at most QueueUS of GPU time outstanding; 0: Pace's count
)

// PolicyEnvOverrides in a Policy's Flags lets the pod's environment loosen pacing and waits
// (GPUSHARE_PACE_OVERRIDE and its siblings, docs/shim.md): Options.EnvOverrides, for benchmarks.
const PolicyEnvOverrides uint32 = 1

// PacingState says where a client's launch bound in force comes from (Pacing).
type PacingState uint32

const (
	PacingScheduler PacingState = 0 // the scheduler's Pace (0: unbounded)
	PacingOverride  PacingState = 1 // GPUSHARE_PACE_OVERRIDE, where the scheduler allows it
	PacingBackoff   PacingState = 2 // off after a stall or a driver error, re-armed after a back-off
	PacingOff       PacingState = 3 // off for good: the driver lacks the event calls pacing needs
)

func (p PacingState) String() string {
	switch p {
	case PacingScheduler:
		return "Scheduler"
	case PacingOverride:
		return "Override"
	case PacingBackoff:
		return "Backoff"
	case PacingOff:
		return "Off"
	}
	return fmt.Sprintf("PacingState(%d)", uint32(p))
}

// Mode is a GPU's anti-thrashing policy.
type Mode uint32

const (
	// ModeAuto lets clients run concurrently while their working sets fit the
	// budget together, and serializes them with the quantum when they do not.
	ModeAuto Mode = 0
	// ModeAlways gives the GPU to one client at a time, always.
	ModeAlways Mode = 1
	// ModeOff never serializes; memory beyond the budget fails to allocate.
	ModeOff Mode = 2
)

func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "Auto"
	case ModeAlways:
		return "Always"
	case ModeOff:
		return "Off"
	}
	return fmt.Sprintf("Mode(%d)", uint32(m))
}

// ParseMode reads "Auto", "Always" or "Off" (case-insensitive).
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(s) {
	case "auto", "":
		return ModeAuto, nil
	case "always":
		return ModeAlways, nil
	case "off":
		return ModeOff, nil
	}
	return 0, fmt.Errorf("anti-thrashing mode %q: want Auto, Always or Off", s)
}

// MemStatus answers a MemReq.
type MemStatus uint32

const (
	MemOK       MemStatus = 0 // reservation raised
	MemBusy     MemStatus = 1 // others hold the memory: release and acquire with the larger need
	MemTooLarge MemStatus = 2 // can never fit
)

// Usage reasons.
const (
	UsageReport  uint32 = 0
	UsageEvicted uint32 = 1 // answers an Evict
	// UsageProgress (version 3): an eviction under way has released this much so far; the
	// eviction goes on and ends with UsageEvicted.
	UsageProgress uint32 = 2
)

var msgSizes = map[MsgType]int{
	MsgHello:     HelloSize,
	MsgWelcome:   WelcomeSize,
	MsgAcquire:   AcquireSize,
	MsgGrant:     GrantSize,
	MsgRelease:   ReleaseSize,
	MsgContended: ContendedSize,
	MsgRevoked:   RevokedSize,
	MsgMemReq:    MemReqSize,
	MsgMemReply:  MemReplySize,
	MsgEvict:     EvictSize,
	MsgUsage:     UsageSize,
	MsgRejoin:    RejoinSize,
	MsgRaise:     RaiseSize,
	MsgPace:      PaceSize,
	MsgIdle:      IdleSize,
	MsgLedger:    LedgerSize,
	MsgCharge:    ChargeSize,
	MsgCharged:   ChargedSize,
	MsgReturn:    ReturnSize,
	MsgPing:      PingSize,
	MsgPong:      PongSize,
	MsgPolicy:    PolicySize,
	MsgPacing:    PacingSize,
	MsgSettle:    SettleSize,
	MsgPaceTime:  PaceTimeSize,
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
	case MsgMemReq:
		return "MemReq"
	case MsgMemReply:
		return "MemReply"
	case MsgEvict:
		return "Evict"
	case MsgUsage:
		return "Usage"
	case MsgRejoin:
		return "Rejoin"
	case MsgRaise:
		return "Raise"
	case MsgPace:
		return "Pace"
	case MsgIdle:
		return "Idle"
	case MsgLedger:
		return "Ledger"
	case MsgCharge:
		return "Charge"
	case MsgCharged:
		return "Charged"
	case MsgReturn:
		return "Return"
	case MsgPing:
		return "Ping"
	case MsgPong:
		return "Pong"
	case MsgPolicy:
		return "Policy"
	case MsgPacing:
		return "Pacing"
	case MsgSettle:
		return "Settle"
	case MsgPaceTime:
		return "PaceTime"
	}
	return fmt.Sprintf("MsgType(%d)", uint16(t))
}

// Class is a client's class (qos.go): ClassProduction preempts ClassOpportunistic. In a hello it is
// what the process asks (the wire's priority field, 1 and 0), which only the standalone scheduler trusts.
type Class uint32

const (
	ClassOpportunistic Class = 0
	ClassProduction    Class = 1
)

func (p Class) String() string {
	if p == ClassProduction {
		return "production"
	}
	return "opportunistic"
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
	// Version is the protocol version of the frame: 0 is the current Version (so that messages
	// built in code need not say it); an older peer's frames carry and get its own.
	Version uint16

	PID      uint32 // Hello
	Priority Class  // Hello
	GPUUUID  string // Hello; empty means "whatever GPU this socket serves"

	ClientID  uint32 // Welcome
	QuantumMS uint32 // Welcome, Grant
	GraceMS   uint32 // Welcome
	Mode      Mode   // Welcome
	Budget    uint64 // Welcome

	Epoch   uint32 // Grant, Release, Contended, Revoked, Raise
	Waiters uint32 // Contended

	Need     uint64    // Acquire, MemReq, Usage
	Resident uint64    // Grant, Release, MemReply, Usage, Raise
	Status   MemStatus // MemReply
	Target   uint64    // Evict
	Reason   uint32    // Usage
	Acks     uint32    // Usage
	Stats    SwapStats // Usage; Rejoin carries Stats.Swapped
	Flags    uint32    // Rejoin, Ledger, Return, Policy

	MaxQueued uint32 // Pace: launches the client may keep outstanding on the GPU; 0: unbounded
	IdleUS    uint32 // Idle: microseconds without a GPU call after which the client releases; 0: its own window
	Seq       uint32 // Charge, Charged, Ping, Pong
	FloorUS   uint32 // Settle: release once the submitted work completed and this long passed without a GPU call; 0: off
	QueueUS   uint32 // PaceTime: microseconds of GPU time the client may keep outstanding; 0: Pace's count bound

	// The claim's ledger (version 6, ledger.go).
	Processes uint32       // Ledger: n, the ledger's connected processes
	Claim     uint64       // Ledger: M
	Reserve   uint64       // Ledger: the client's context charge (R until measured)
	Total     uint64       // Ledger, Charged: M less the context charges (0 when negative)
	Granted   uint64       // Ledger, Charged: the ledger's grants together
	Grant     uint64       // Ledger, Charged: this client's grant
	Added     uint64       // Charged
	Bytes     uint64       // Charge, Return; Ledger: the chunk a Charge adds at least
	Charge    ChargeStatus // Charged

	// MaxQueued (above) and Pacing: the launch bound in force in a client and where it comes from.
	Pacing PacingState
}

// SwapStats are a client's swap counters as it reports them.
type SwapStats struct {
	Swapped  uint64 // bytes currently swapped out to host staging
	SwapOuts uint64 // allocations copied out and released
	SwapIns  uint64 // allocations mapped and copied back in
	BytesOut uint64
	BytesIn  uint64
	SwapNS   uint64 // time spent swapping, ns
}

var le = binary.LittleEndian

// Encode returns the wire form of m.
func Encode(m Message) ([]byte, error) {
	size, ok := msgSizes[m.Type]
	if !ok {
		return nil, fmt.Errorf("encode %v: %w", m.Type, ErrUnknownType)
	}
	v := m.Version
	if v == 0 {
		v = Version
	}
	if err := checkVersion(v, m.Type, m.Reason); err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	b := make([]byte, size)
	le.PutUint32(b[0:], Magic)
	le.PutUint16(b[4:], v)
	le.PutUint16(b[6:], uint16(m.Type))
	le.PutUint32(b[8:], uint32(size))
	p := b[HeaderSize:]
	switch m.Type {
	case MsgHello:
		if len(m.GPUUUID) >= UUIDLen || bytes.IndexByte([]byte(m.GPUUUID), 0) >= 0 {
			return nil, fmt.Errorf("encode hello uuid %q: %w", m.GPUUUID, ErrBadField)
		}
		if m.Priority > ClassProduction {
			return nil, fmt.Errorf("encode hello priority %d: %w", m.Priority, ErrBadField)
		}
		le.PutUint32(p[0:], m.PID)
		le.PutUint32(p[4:], uint32(m.Priority))
		copy(p[8:8+UUIDLen], m.GPUUUID)
	case MsgWelcome:
		le.PutUint32(p[0:], m.ClientID)
		le.PutUint32(p[4:], m.QuantumMS)
		le.PutUint32(p[8:], m.GraceMS)
		le.PutUint32(p[12:], uint32(m.Mode))
		le.PutUint64(p[16:], m.Budget)
	case MsgAcquire, MsgMemReq:
		le.PutUint64(p[0:], m.Need)
	case MsgGrant:
		le.PutUint32(p[0:], m.Epoch)
		le.PutUint32(p[4:], m.QuantumMS)
		le.PutUint64(p[8:], m.Resident)
	case MsgRelease, MsgRaise:
		le.PutUint32(p[0:], m.Epoch)
		le.PutUint64(p[8:], m.Resident)
	case MsgRevoked:
		le.PutUint32(p[0:], m.Epoch)
	case MsgContended:
		le.PutUint32(p[0:], m.Epoch)
		le.PutUint32(p[4:], m.Waiters)
	case MsgMemReply:
		le.PutUint32(p[0:], uint32(m.Status))
		le.PutUint64(p[8:], m.Resident)
	case MsgEvict:
		le.PutUint64(p[4:], m.Target)
	case MsgRejoin:
		encodeRejoin(p, m)
	case MsgPace:
		le.PutUint32(p[0:], m.MaxQueued)
	case MsgIdle:
		le.PutUint32(p[0:], m.IdleUS)
	case MsgSettle:
		le.PutUint32(p[0:], m.FloorUS)
	case MsgPaceTime:
		le.PutUint32(p[0:], m.QueueUS)
	case MsgLedger, MsgCharge, MsgCharged, MsgReturn:
		encodeLedger(p, m)
	case MsgPing, MsgPong:
		le.PutUint32(p[0:], m.Seq)
	case MsgPolicy:
		le.PutUint32(p[0:], m.Flags)
	case MsgPacing:
		le.PutUint32(p[0:], m.MaxQueued)
		le.PutUint32(p[4:], uint32(m.Pacing))
	case MsgUsage:
		le.PutUint32(p[0:], m.Reason)
		le.PutUint32(p[4:], m.Acks)
		for i, v := range []uint64{m.Need, m.Resident, m.Stats.Swapped, m.Stats.SwapOuts, m.Stats.SwapIns,
			m.Stats.BytesOut, m.Stats.BytesIn, m.Stats.SwapNS} {
			le.PutUint64(p[8+8*i:], v)
		}
	}
	return b, nil
}

// checkVersion refuses what a version does not have: Raise and UsageProgress came with version 3,
// Pace with version 4, Idle with version 5, the ledger's messages, Ping, Pong, Policy and Pacing
// with version 6, Settle and PaceTime with version 7.
func checkVersion(v uint16, t MsgType, reason uint32) error {
	if v < MinVersion || v > Version {
		return fmt.Errorf("%w %d", ErrBadVersion, v)
	}
	if !typeInVersion(t, v) {
		return fmt.Errorf("%w %d in version %d", ErrUnknownType, uint16(t), v)
	}
	if v < 3 && t == MsgUsage && reason == UsageProgress {
		return fmt.Errorf("usage reason %d in version %d: %w", reason, v, ErrBadField)
	}
	return nil
}

// typeInVersion says whether protocol version v has message type t (t known to msgSizes).
func typeInVersion(t MsgType, v uint16) bool {
	switch t {
	case MsgRaise:
		return v >= 3
	case MsgPace:
		return v >= 4
	case MsgIdle:
		return v >= 5
	case MsgLedger, MsgCharge, MsgCharged, MsgReturn, MsgPing, MsgPong, MsgPolicy, MsgPacing:
		return v >= 6
	case MsgSettle, MsgPaceTime:
		return v >= 7
	}
	return true
}

// parseHeader validates a header and returns the type, total size and version.
func parseHeader(h []byte) (MsgType, int, uint16, error) {
	if len(h) < HeaderSize {
		return 0, 0, 0, ErrShortMessage
	}
	if le.Uint32(h[0:]) != Magic {
		return 0, 0, 0, ErrBadMagic
	}
	v := le.Uint16(h[4:])
	if v < MinVersion || v > Version {
		return 0, 0, 0, fmt.Errorf("%w %d", ErrBadVersion, v)
	}
	t := MsgType(le.Uint16(h[6:]))
	want, ok := msgSizes[t]
	if !ok || !typeInVersion(t, v) {
		return 0, 0, 0, fmt.Errorf("%w %d", ErrUnknownType, uint16(t))
	}
	if got := le.Uint32(h[8:]); got != uint32(want) {
		return 0, 0, 0, fmt.Errorf("%v of %d bytes: %w", t, got, ErrBadSize)
	}
	return t, want, v, nil
}

// Decode parses exactly one message; b must hold exactly its bytes.
func Decode(b []byte) (Message, error) {
	t, size, v, err := parseHeader(b)
	if err != nil {
		return Message{}, err
	}
	if len(b) != size {
		return Message{}, fmt.Errorf("%v: %d bytes for a %d-byte message: %w", t, len(b), size, ErrBadSize)
	}
	m := Message{Type: t}
	if v != Version {
		m.Version = v
	}
	p := b[HeaderSize:]
	switch t {
	case MsgHello:
		if err := decodeHello(p, &m); err != nil {
			return Message{}, err
		}
	case MsgWelcome:
		m.ClientID = le.Uint32(p[0:])
		m.QuantumMS = le.Uint32(p[4:])
		m.GraceMS = le.Uint32(p[8:])
		m.Mode = Mode(le.Uint32(p[12:]))
		if m.Mode > ModeOff {
			return Message{}, fmt.Errorf("welcome mode %d: %w", m.Mode, ErrBadField)
		}
		m.Budget = le.Uint64(p[16:])
	case MsgAcquire, MsgMemReq:
		m.Need = le.Uint64(p[0:])
	case MsgGrant:
		m.Epoch = le.Uint32(p[0:])
		m.QuantumMS = le.Uint32(p[4:])
		m.Resident = le.Uint64(p[8:])
	case MsgRelease, MsgRaise:
		m.Epoch = le.Uint32(p[0:])
		if le.Uint32(p[4:]) != 0 {
			return Message{}, fmt.Errorf("%v padding not zero: %w", t, ErrBadField)
		}
		m.Resident = le.Uint64(p[8:])
	case MsgRevoked:
		m.Epoch = le.Uint32(p[0:])
	case MsgPace:
		m.MaxQueued = le.Uint32(p[0:])
	case MsgIdle:
		m.IdleUS = le.Uint32(p[0:])
	case MsgSettle:
		m.FloorUS = le.Uint32(p[0:])
	case MsgPaceTime:
		m.QueueUS = le.Uint32(p[0:])
	case MsgLedger, MsgCharge, MsgCharged, MsgReturn:
		if err := decodeLedger(t, p, &m); err != nil {
			return Message{}, err
		}
	case MsgPing, MsgPong:
		m.Seq = le.Uint32(p[0:])
	case MsgPolicy:
		m.Flags = le.Uint32(p[0:])
	case MsgPacing:
		m.MaxQueued = le.Uint32(p[0:])
		m.Pacing = PacingState(le.Uint32(p[4:]))
		if m.Pacing > PacingOff {
			return Message{}, fmt.Errorf("pacing state %d: %w", m.Pacing, ErrBadField)
		}
	case MsgContended:
		m.Epoch = le.Uint32(p[0:])
		m.Waiters = le.Uint32(p[4:])
	case MsgMemReply:
		m.Status = MemStatus(le.Uint32(p[0:]))
		if m.Status > MemTooLarge || le.Uint32(p[4:]) != 0 {
			return Message{}, fmt.Errorf("memreply status %d: %w", m.Status, ErrBadField)
		}
		m.Resident = le.Uint64(p[8:])
	case MsgEvict:
		if le.Uint32(p[0:]) != 0 {
			return Message{}, fmt.Errorf("evict padding not zero: %w", ErrBadField)
		}
		m.Target = le.Uint64(p[4:])
	case MsgRejoin:
		if err := decodeRejoin(p, &m); err != nil {
			return Message{}, err
		}
	case MsgUsage:
		if err := decodeUsage(v, p, &m); err != nil {
			return Message{}, err
		}
	}
	return m, nil
}

// decodeHello reads a hello's body: the client's pid, the class it asks for and the GPU it was
// configured for, a NUL-terminated string with zero padding.
func decodeHello(p []byte, m *Message) error {
	m.PID = le.Uint32(p[0:])
	m.Priority = Class(le.Uint32(p[4:]))
	if m.Priority > ClassProduction {
		return fmt.Errorf("hello priority %d: %w", m.Priority, ErrBadField)
	}
	raw := p[8 : 8+UUIDLen]
	n := bytes.IndexByte(raw, 0)
	if n < 0 {
		return fmt.Errorf("hello uuid not NUL-terminated: %w", ErrBadField)
	}
	for _, c := range raw[n:] {
		if c != 0 {
			return fmt.Errorf("hello uuid padding not zero: %w", ErrBadField)
		}
	}
	m.GPUUUID = string(raw[:n])
	return nil
}

// decodeUsage reads a usage report of protocol version v: its reason, acknowledgements, need,
// residency and swap counters.
func decodeUsage(v uint16, p []byte, m *Message) error {
	m.Reason = le.Uint32(p[0:])
	if m.Reason > UsageProgress {
		return fmt.Errorf("usage reason %d: %w", m.Reason, ErrBadField)
	}
	if err := checkVersion(v, MsgUsage, m.Reason); err != nil {
		return err
	}
	m.Acks = le.Uint32(p[4:])
	f := make([]uint64, 8)
	for i := range f {
		f[i] = le.Uint64(p[8+8*i:])
	}
	m.Need, m.Resident = f[0], f[1]
	m.Stats = SwapStats{Swapped: f[2], SwapOuts: f[3], SwapIns: f[4], BytesOut: f[5], BytesIn: f[6], SwapNS: f[7]}
	return nil
}

// ReadMessage reads one message from r, validating the header before reading
// the body so a hostile size never makes it allocate or block for long.
func ReadMessage(r io.Reader) (Message, error) {
	var buf [MaxMsgSize]byte
	if _, err := io.ReadFull(r, buf[:HeaderSize]); err != nil {
		return Message{}, err
	}
	_, size, _, err := parseHeader(buf[:HeaderSize])
	if err != nil {
		return Message{}, err
	}
	if _, err := io.ReadFull(r, buf[HeaderSize:size]); err != nil {
		return Message{}, fmt.Errorf("body: %w", err)
	}
	return Decode(buf[:size])
}
