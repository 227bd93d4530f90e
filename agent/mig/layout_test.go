package mig

import (
	"reflect"
	"testing"
)

func TestParseLayoutReadsWhatPeopleWrite(t *testing.T) {
	tests := []struct {
		in   string
		want []Want
		err  bool
	}{
		{"3g.40gb x1 + 1g.10gb x4", []Want{{"3g.40gb", 1}, {"1g.10gb", 4}}, false},
		{"7g.80gb", []Want{{"7g.80gb", 1}}, false},
		{"1g.10gb+me x1 + 1g.10gb x6", []Want{{"1g.10gb+me", 1}, {"1g.10gb", 6}}, false},
		{"3g.40gb 2", nil, true},
		{"3g.40gb x0", nil, true},
		{"", nil, true},
	}
	for _, tt := range tests {
		got, err := ParseLayout(tt.in)
		if (err != nil) != tt.err || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseLayout(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}
