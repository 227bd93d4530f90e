package scheduler

import (
	"bytes"
	"testing"
)

// seedMessages is one message of every type of the protocol, with fields set; TestSeedsCoverEveryType
// fails when a type is added without a seed here.
func seedMessages() []Message {
	return []Message{
		{Type: MsgHello, PID: 42, Priority: ClassProduction, GPUUUID: "GPU-1"},
		{Type: MsgWelcome, ClientID: 1, QuantumMS: 100, GraceMS: 50, Mode: ModeAlways, Budget: 64 << 20},
		{Type: MsgAcquire, Need: 16 << 20},
		{Type: MsgGrant, Epoch: 3, QuantumMS: 100, Resident: 8 << 20},
		{Type: MsgRelease, Epoch: 3, Resident: 4 << 20},
		{Type: MsgContended, Epoch: 3, Waiters: 1},
		{Type: MsgRevoked, Epoch: 3},
		{Type: MsgMemReq, Need: 32 << 20},
		{Type: MsgMemReply, Status: MemBusy, Resident: 8 << 20},
		{Type: MsgEvict, Target: 2 << 20},
		{Type: MsgUsage, Reason: UsageEvicted, Acks: 2, Need: 9, Resident: 8, Stats: SwapStats{Swapped: 7, SwapOuts: 6,
			SwapIns: 5, BytesOut: 4, BytesIn: 3, SwapNS: 2}},
		{Type: MsgRejoin, Flags: RejoinHeld, Need: 3 << 20, Resident: 2 << 20, Stats: SwapStats{Swapped: 1 << 20}},
		{Type: MsgRaise, Epoch: 3, Resident: 6 << 20},
		{Type: MsgPace, MaxQueued: 16},
		{Type: MsgIdle, IdleUS: 1000},
		{Type: MsgPing, Seq: 5},
		{Type: MsgPong, Seq: 5},
		{Type: MsgPolicy, Flags: PolicyEnvOverrides},
		{Type: MsgPacing, MaxQueued: 3, Pacing: PacingBackoff},
		{Type: MsgSettle, FloorUS: 100},
		{Type: MsgPaceTime, QueueUS: 500},
		{Type: MsgUsage, Reason: UsageProgress, Acks: 1, Need: 9, Resident: 4},
		{Type: MsgAcquire, Version: MinVersion, Need: 16 << 20},
		{Type: MsgLedger, Flags: LedgerOn, Processes: 2, Claim: 8 << 30, Reserve: 768 << 20, Total: 6656 << 20,
			Granted: 1 << 30, Grant: 512 << 20, Bytes: 64 << 20},
		{Type: MsgCharge, Seq: 7, Bytes: 3 << 20},
		{Type: MsgCharged, Seq: 7, Charge: ChargeRefused, Added: 0, Grant: 1 << 20, Total: 2 << 20, Granted: 2 << 20},
		{Type: MsgReturn, Flags: ReturnHold, Bytes: 5 << 20},
	}
}

func TestSeedsCoverEveryType(t *testing.T) {
	seen := map[MsgType]bool{}
	for _, m := range seedMessages() {
		seen[m.Type] = true
	}
	for typ := range msgSizes {
		if !seen[typ] {
			t.Errorf("no fuzz seed for %v", typ)
		}
	}
}

// FuzzDecode pins that no byte string makes the decoder panic, and that
// anything it accepts is canonical: re-encoding gives back the same bytes.
// The seed corpus runs as an ordinary test in CI; `go test -fuzz FuzzDecode`
// explores further.
func FuzzDecode(f *testing.F) {
	for _, m := range seedMessages() {
		b, err := Encode(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte{})
	f.Add([]byte("GPSH\x02\x00\x03\x00\x14\x00\x00\x00"))
	f.Add(bytes.Repeat([]byte{0xff}, 300))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			return
		}
		again, err := Encode(m)
		if err != nil {
			t.Fatalf("Decode accepted %x as %+v but Encode refuses it: %v", b, m, err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("Decode(%x) = %+v re-encodes to %x", b, m, again)
		}
		if _, err := ReadMessage(bytes.NewReader(b)); err != nil {
			t.Fatalf("Decode accepts %x but ReadMessage does not: %v", b, err)
		}
	})
}

// FuzzReadMessage pins that a stream reader never panics or reads past one
// message, whatever the peer sends.
func FuzzReadMessage(f *testing.F) {
	for _, m := range seedMessages() {
		b, _ := Encode(m)
		f.Add(append(b, b...))
	}
	f.Add([]byte("GPSH\x02\x00\x01\x00\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		m, err := ReadMessage(r)
		if err != nil {
			return
		}
		consumed := len(in) - r.Len()
		if consumed != msgSizes[m.Type] {
			t.Fatalf("ReadMessage consumed %d bytes for a %v", consumed, m.Type)
		}
	})
}
