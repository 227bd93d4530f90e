package deviceid

import "testing"

func TestParseReadsWhatStringWrites(t *testing.T) {
	tests := []struct {
		in   string
		want ID
	}{
		{"GPU-1234", Whole("GPU-1234")},
		{"MIG-5678", Whole("MIG-5678")},
		{"GPU-1234::0", Replica("GPU-1234", 0)},
		{"GPU-1234::17", Replica("GPU-1234", 17)},
		// Not ours to number: the GPU is still the one before the separator.
		{"GPU-1234::x", ID{UUID: "GPU-1234"}},
	}
	for _, tt := range tests {
		got := Parse(tt.in)
		if got != tt.want {
			t.Errorf("Parse(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
		if got.IsReplica && got.String() != tt.in {
			t.Errorf("Parse(%q).String() = %q, want the input back", tt.in, got.String())
		}
	}
	if got := Replica("GPU-a", 3).String(); got != "GPU-a::3" {
		t.Errorf("Replica(GPU-a, 3) = %q, want GPU-a::3", got)
	}
	if got := Whole("GPU-a").String(); got != "GPU-a" {
		t.Errorf("Whole(GPU-a) = %q", got)
	}
}
