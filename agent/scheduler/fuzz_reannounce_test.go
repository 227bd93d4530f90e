package scheduler

import (
	"errors"
	"testing"
)

// Rejoin (rebuild.go) on the wire: fields round-trip; flags other than
// RejoinHeld and a non-zero pad are refused. Seeds for FuzzDecode and
// FuzzReadMessage with this type are in testdata/fuzz.
func TestRejoinRoundTripsAndRefusesUnknownFlags(t *testing.T) {
	in := Message{Type: MsgRejoin, Flags: RejoinHeld, Need: 3 * mib, Resident: 2 * mib, Stats: SwapStats{Swapped: mib}}
	b, err := Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != RejoinSize {
		t.Fatalf("encoded %d bytes, want %d", len(b), RejoinSize)
	}
	out, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if out != in {
		t.Errorf("round trip: got %+v, want %+v", out, in)
	}
	for _, off := range []int{HeaderSize, HeaderSize + 4} { // flags, pad
		bad := append([]byte(nil), b...)
		bad[off] |= 0x80
		if _, err := Decode(bad); !errors.Is(err, ErrBadField) {
			t.Errorf("byte %d changed: err = %v, want ErrBadField", off, err)
		}
	}
}
