package scheduler

import (
	"bytes"
	"testing"
)

// FuzzDecode pins that no byte string makes the decoder panic, and that
// anything it accepts is canonical: re-encoding gives back the same bytes.
// The seed corpus runs as an ordinary test in CI; `go test -fuzz FuzzDecode`
// explores further.
func FuzzDecode(f *testing.F) {
	for _, m := range []Message{
		{Type: MsgHello, PID: 42, Priority: PriorityHigh, GPUUUID: "GPU-1"},
		{Type: MsgWelcome, ClientID: 1, QuantumMS: 100, GraceMS: 50},
		{Type: MsgAcquire},
		{Type: MsgGrant, Epoch: 3, QuantumMS: 100},
		{Type: MsgRelease, Epoch: 3},
		{Type: MsgContended, Epoch: 3, Waiters: 1},
		{Type: MsgRevoked, Epoch: 3},
	} {
		b, err := Encode(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte{})
	f.Add([]byte("GPSH\x01\x00\x03\x00\x0c\x00\x00\x00"))
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
	b, _ := Encode(Message{Type: MsgAcquire})
	f.Add(append(b, b...))
	f.Add([]byte("GPSH\x01\x00\x01\x00\xff\xff\xff\xff"))
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
