package scheduler

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
)

// The C header is the definition; this test fails when proto.go drifts from it.
func TestProtocolConstantsMatchShimHeader(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "shim", "include", "gpushare_proto.h"))
	if err != nil {
		t.Fatalf("reading the shim's protocol header: %v", err)
	}
	defs := map[string]uint64{}
	re := regexp.MustCompile(`(?m)^#define\s+(GS_[A-Z0-9_]+)\s+(0x[0-9a-fA-F]+|[0-9]+)u?\b`)
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		v, err := strconv.ParseUint(m[2], 0, 64)
		if err != nil {
			t.Fatalf("parsing %s: %v", m[1], err)
		}
		defs[m[1]] = v
	}
	want := map[string]uint64{
		"GS_PROTO_MAGIC":          uint64(Magic),
		"GS_PROTO_VERSION":        uint64(Version),
		"GS_PROTO_MIN_VERSION":    uint64(MinVersion),
		"GS_MSG_RAISE":            uint64(MsgRaise),
		"GS_RAISE_SIZE":           RaiseSize,
		"GS_MSG_PACE":             uint64(MsgPace),
		"GS_PACE_SIZE":            PaceSize,
		"GS_MSG_IDLE":             uint64(MsgIdle),
		"GS_IDLE_SIZE":            IdleSize,
		"GS_MSG_PING":             uint64(MsgPing),
		"GS_PING_SIZE":            PingSize,
		"GS_MSG_PONG":             uint64(MsgPong),
		"GS_PONG_SIZE":            PongSize,
		"GS_MSG_POLICY":           uint64(MsgPolicy),
		"GS_POLICY_SIZE":          PolicySize,
		"GS_POLICY_ENV_OVERRIDES": uint64(PolicyEnvOverrides),
		"GS_MSG_PACING":           uint64(MsgPacing),
		"GS_PACING_SIZE":          PacingSize,
		"GS_MSG_SETTLE":           uint64(MsgSettle),
		"GS_SETTLE_SIZE":          SettleSize,
		"GS_MSG_PACE_TIME":        uint64(MsgPaceTime),
		"GS_PACE_TIME_SIZE":       PaceTimeSize,
		"GS_PACING_SCHEDULER":     uint64(PacingScheduler),
		"GS_PACING_OVERRIDE":      uint64(PacingOverride),
		"GS_PACING_BACKOFF":       uint64(PacingBackoff),
		"GS_PACING_OFF":           uint64(PacingOff),
		"GS_USAGE_PROGRESS":       uint64(UsageProgress),
		"GS_MAX_MSG_SIZE":         MaxMsgSize,
		"GS_UUID_LEN":             UUIDLen,
		"GS_MSG_HELLO":            uint64(MsgHello),
		"GS_MSG_WELCOME":          uint64(MsgWelcome),
		"GS_MSG_ACQUIRE":          uint64(MsgAcquire),
		"GS_MSG_GRANT":            uint64(MsgGrant),
		"GS_MSG_RELEASE":          uint64(MsgRelease),
		"GS_MSG_CONTENDED":        uint64(MsgContended),
		"GS_MSG_REVOKED":          uint64(MsgRevoked),
		"GS_PRIORITY_NORMAL":      uint64(ClassOpportunistic),
		"GS_PRIORITY_HIGH":        uint64(ClassProduction),
		"GS_HEADER_SIZE":          HeaderSize,
		"GS_HELLO_SIZE":           HelloSize,
		"GS_WELCOME_SIZE":         WelcomeSize,
		"GS_ACQUIRE_SIZE":         AcquireSize,
		"GS_GRANT_SIZE":           GrantSize,
		"GS_RELEASE_SIZE":         ReleaseSize,
		"GS_CONTENDED_SIZE":       ContendedSize,
		"GS_REVOKED_SIZE":         RevokedSize,
		"GS_MSG_MEMREQ":           uint64(MsgMemReq),
		"GS_MSG_MEMREPLY":         uint64(MsgMemReply),
		"GS_MSG_EVICT":            uint64(MsgEvict),
		"GS_MSG_USAGE":            uint64(MsgUsage),
		"GS_MEMREQ_SIZE":          MemReqSize,
		"GS_MEMREPLY_SIZE":        MemReplySize,
		"GS_EVICT_SIZE":           EvictSize,
		"GS_USAGE_SIZE":           UsageSize,
		"GS_MSG_REJOIN":           uint64(MsgRejoin),
		"GS_REJOIN_SIZE":          RejoinSize,
		"GS_REJOIN_HELD":          uint64(RejoinHeld),
		"GS_MODE_AUTO":            uint64(ModeAuto),
		"GS_MODE_ALWAYS":          uint64(ModeAlways),
		"GS_MODE_OFF":             uint64(ModeOff),
		"GS_MEM_OK":               uint64(MemOK),
		"GS_MEM_BUSY":             uint64(MemBusy),
		"GS_MEM_TOO_LARGE":        uint64(MemTooLarge),
		"GS_USAGE_REPORT":         uint64(UsageReport),
		"GS_USAGE_EVICTED":        uint64(UsageEvicted),
		"GS_MSG_LEDGER":           uint64(MsgLedger),
		"GS_MSG_CHARGE":           uint64(MsgCharge),
		"GS_MSG_CHARGED":          uint64(MsgCharged),
		"GS_MSG_RETURN":           uint64(MsgReturn),
		"GS_LEDGER_SIZE":          LedgerSize,
		"GS_CHARGE_SIZE":          ChargeSize,
		"GS_CHARGED_SIZE":         ChargedSize,
		"GS_RETURN_SIZE":          ReturnSize,
		"GS_LEDGER_ON":            uint64(LedgerOn),
		"GS_LEDGER_REFUSED":       uint64(LedgerRefused),
		"GS_CHARGE_OK":            uint64(ChargeOK),
		"GS_CHARGE_REFUSED":       uint64(ChargeRefused),
		"GS_RETURN_HOLD":          uint64(ReturnHold),
	}
	for name, v := range want {
		got, ok := defs[name]
		if !ok {
			t.Errorf("%s is not defined in gpushare_proto.h", name)
			continue
		}
		if got != v {
			t.Errorf("%s: header says %#x, proto.go says %#x", name, got, v)
		}
	}
	for name := range defs {
		if _, ok := want[name]; !ok {
			t.Errorf("%s is in gpushare_proto.h but not mirrored in proto.go", name)
		}
	}
	for typ, size := range msgSizes {
		b, err := Encode(Message{Type: typ})
		if err != nil || len(b) != size {
			t.Errorf("Encode(%v) = %d bytes, %v; want %d", typ, len(b), err, size)
		}
	}
}

func TestEncodeDecodeRoundTripsEveryType(t *testing.T) {
	msgs := []Message{
		{Type: MsgHello, PID: 42, Priority: ClassProduction, GPUUUID: "GPU-8e0f6a1c-0000-1111-2222-333344445555"},
		{Type: MsgHello, PID: 1},
		{Type: MsgWelcome, ClientID: 7, QuantumMS: 2000, GraceMS: 1000},
		{Type: MsgWelcome, ClientID: 8, QuantumMS: 50, GraceMS: 100, Mode: ModeAlways, Budget: 16 << 30},
		{Type: MsgAcquire},
		{Type: MsgAcquire, Need: 3 << 30},
		{Type: MsgGrant, Epoch: 9, QuantumMS: 50},
		{Type: MsgGrant, Epoch: 9, QuantumMS: 50, Resident: 1 << 40},
		{Type: MsgRelease, Epoch: 9},
		{Type: MsgRelease, Epoch: 9, Resident: 7 << 21},
		{Type: MsgMemReq, Need: 5 << 21},
		{Type: MsgMemReply, Status: MemBusy, Resident: 4 << 21},
		{Type: MsgEvict, Target: 2 << 21},
		{Type: MsgUsage, Reason: UsageEvicted, Acks: 3, Need: 10, Resident: 4, Stats: SwapStats{Swapped: 6, SwapOuts: 1, SwapIns: 2, BytesOut: 3, BytesIn: 4, SwapNS: 5}},
		{Type: MsgContended, Epoch: 9, Waiters: 3},
		{Type: MsgRevoked, Epoch: 9},
		{Type: MsgRaise, Epoch: 9, Resident: 6 << 21},
		{Type: MsgUsage, Reason: UsageProgress, Acks: 1, Need: 10, Resident: 2},
		{Type: MsgPace, MaxQueued: 16},
		{Type: MsgPace},
		{Type: MsgPace, MaxQueued: 1<<32 - 1},
		{Type: MsgIdle, IdleUS: 1000},
		{Type: MsgIdle},
		{Type: MsgPace, Version: 4, MaxQueued: 3},
		{Type: MsgPing, Seq: 7},
		{Type: MsgPong, Seq: 1<<32 - 1},
		{Type: MsgPolicy, Flags: PolicyEnvOverrides},
		{Type: MsgPacing, MaxQueued: 3, Pacing: PacingBackoff},
		{Type: MsgIdle, Version: 5, IdleUS: 1000},
		// older peers' frames keep their version
		{Type: MsgGrant, Version: MinVersion, Epoch: 9, QuantumMS: 50, Resident: 1 << 40},
		{Type: MsgUsage, Version: MinVersion, Reason: UsageEvicted, Acks: 3, Need: 10, Resident: 4},
		{Type: MsgRaise, Version: 3, Epoch: 9, Resident: 6 << 21},
	}
	for _, m := range msgs {
		b, err := Encode(m)
		if err != nil {
			t.Fatalf("Encode(%+v): %v", m, err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(Encode(%+v)): %v", m, err)
		}
		if got != m {
			t.Errorf("round trip: got %+v, want %+v", got, m)
		}
	}
}

func TestDecodeRejectsMalformedMessages(t *testing.T) {
	good, _ := Encode(Message{Type: MsgRelease, Epoch: 1})
	hello, _ := Encode(Message{Type: MsgHello, GPUUUID: "GPU-x"})
	mutate := func(b []byte, f func([]byte)) []byte {
		c := append([]byte(nil), b...)
		f(c)
		return c
	}
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"short header", good[:5], ErrShortMessage},
		{"bad magic", mutate(good, func(b []byte) { b[0] ^= 0xff }), ErrBadMagic},
		{"future version", mutate(good, func(b []byte) { le.PutUint16(b[4:], Version+1) }), ErrBadVersion},
		{"raise from a version 2 peer", mutate(mustEncode(Message{Type: MsgRaise}), func(b []byte) { le.PutUint16(b[4:], 2) }), ErrUnknownType},
		{"pace in a version 3 frame", mutate(mustEncode(Message{Type: MsgPace, MaxQueued: 16}), func(b []byte) { le.PutUint16(b[4:], 3) }), ErrUnknownType},
		{"ping in a version 5 frame", mutate(mustEncode(Message{Type: MsgPing}), func(b []byte) { le.PutUint16(b[4:], 5) }), ErrUnknownType},
		{"pacing state unknown", mutate(mustEncode(Message{Type: MsgPacing}), func(b []byte) { le.PutUint32(b[16:], 4) }), ErrBadField},
		{"idle in a version 4 frame", mutate(mustEncode(Message{Type: MsgIdle, IdleUS: 1000}), func(b []byte) { le.PutUint16(b[4:], 4) }), ErrUnknownType},
		{"pace of 20 bytes", mutate(append(mustEncode(Message{Type: MsgPace}), 0, 0, 0, 0), func(b []byte) { le.PutUint32(b[8:], 20) }), ErrBadSize},
		{"progress from a version 2 peer", mutate(mustEncode(Message{Type: MsgUsage, Reason: UsageProgress}), func(b []byte) { le.PutUint16(b[4:], 2) }), ErrBadField},
		{"version 1 peer", mutate(good, func(b []byte) { le.PutUint16(b[4:], 1) }), ErrBadVersion},
		{"unknown type", mutate(good, func(b []byte) { le.PutUint16(b[6:], 99) }), ErrUnknownType},
		{"size field lies", mutate(good, func(b []byte) { le.PutUint32(b[8:], 17) }), ErrBadSize},
		{"trailing bytes", append(append([]byte(nil), good...), 0), ErrBadSize},
		{"truncated body", good[:14], ErrBadSize},
		{"mode out of range", mutate(mustEncode(Message{Type: MsgWelcome}), func(b []byte) { le.PutUint32(b[24:], 3) }), ErrBadField},
		{"usage reason out of range", mutate(mustEncode(Message{Type: MsgUsage}), func(b []byte) { le.PutUint32(b[12:], 9) }), ErrBadField},
		{"priority out of range", mutate(hello, func(b []byte) { le.PutUint32(b[16:], 7) }), ErrBadField},
		{"uuid without NUL", mutate(hello, func(b []byte) {
			for i := 20; i < HelloSize; i++ {
				b[i] = 'a'
			}
		}), ErrBadField},
		{"uuid padding not zero", mutate(hello, func(b []byte) { b[HelloSize-1] = 'z' }), ErrBadField},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Decode(tc.in); !errors.Is(err, tc.want) {
				t.Errorf("Decode = %v, want %v", err, tc.want)
			}
		})
	}
}

// PACE, IDLE, PING, SETTLE and PACE_TIME are 16 bytes: the header, then one little-endian uint32, as
// gs_pace, gs_idle, gs_ping, gs_settle and gs_pace_time in the shim's header; PACING 20, two of them, as
// gs_pacing.
func TestPaceAndIdleWireFormat(t *testing.T) {
	for _, c := range []struct {
		m    Message
		want []byte
	}{
		{Message{Type: MsgPace, MaxQueued: 0x01020304}, []byte{'G', 'P', 'S', 'H', 7, 0, 14, 0, 16, 0, 0, 0, 4, 3, 2, 1}},
		{Message{Type: MsgPing, Seq: 0x01020304}, []byte{'G', 'P', 'S', 'H', 7, 0, 20, 0, 16, 0, 0, 0, 4, 3, 2, 1}},
		{Message{Type: MsgPacing, MaxQueued: 3, Pacing: PacingOverride}, []byte{'G', 'P', 'S', 'H', 7, 0, 23, 0, 20, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0}},
		{Message{Type: MsgIdle, IdleUS: 0x01020304}, []byte{'G', 'P', 'S', 'H', 7, 0, 15, 0, 16, 0, 0, 0, 4, 3, 2, 1}},
		{Message{Type: MsgSettle, FloorUS: 0x01020304}, []byte{'G', 'P', 'S', 'H', 7, 0, 24, 0, 16, 0, 0, 0, 4, 3, 2, 1}},
		{Message{Type: MsgPaceTime, QueueUS: 0x01020304}, []byte{'G', 'P', 'S', 'H', 7, 0, 25, 0, 16, 0, 0, 0, 4, 3, 2, 1}},
		{Message{Type: MsgSettle, Version: 6, FloorUS: 1}, nil},
	} {
		if c.want == nil {
			if _, err := Encode(c.m); !errors.Is(err, ErrUnknownType) {
				t.Errorf("%v in version %d: %v, want %v", c.m.Type, c.m.Version, err, ErrUnknownType)
			}
			continue
		}
		if b := mustEncode(c.m); string(b) != string(c.want) {
			t.Errorf("%v = % x, want % x", c.m.Type, b, c.want)
		}
	}
}

// A peer of a version before a message's never gets it: it cannot be encoded in its version (PACE
// came with version 4, IDLE with 5).
func TestPaceAndIdleCannotBeEncodedForAnOlderPeer(t *testing.T) {
	for _, c := range []struct {
		m     Message
		older []uint16
	}{
		{Message{Type: MsgPace, MaxQueued: 16}, []uint16{MinVersion, 3}},
		{Message{Type: MsgIdle, IdleUS: 1000}, []uint16{MinVersion, 3, 4}},
	} {
		for _, v := range c.older {
			c.m.Version = v
			if _, err := Encode(c.m); !errors.Is(err, ErrUnknownType) {
				t.Errorf("Encode(%v, version %d) = %v, want ErrUnknownType", c.m.Type, v, err)
			}
		}
	}
}

func mustEncode(m Message) []byte {
	b, err := Encode(m)
	if err != nil {
		panic(err)
	}
	return b
}
