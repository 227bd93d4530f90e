package node

import (
	"testing"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

func TestClaimedBySummaryNamesEachGPUsClaimPods(t *testing.T) {
	gpus := []v1alpha1.GPUStatus{{Index: 4}, {Index: 0}, {Index: 1}}
	for _, tc := range []struct {
		name string
		pods map[int32][]string
		want string
	}{
		{"no plugin or no claims", nil, ""},
		{"one pod, and a GPU the node does not list", map[int32][]string{0: {"ml/notebook"}, 9: {"ml/gone"}}, "0:ml/notebook"},
		{"in index order", map[int32][]string{4: {"ml/a", "ml/b"}, 0: {"ml/notebook"}}, "0:ml/notebook 4:ml/a,ml/b"},
		{"bounded per GPU", map[int32][]string{1: {"a/1", "a/2", "a/3", "a/4", "a/5"}}, "1:a/1,a/2,a/3,+2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := claimedBySummary(gpus, tc.pods); got != tc.want {
				t.Errorf("claimedBySummary = %q, want %q", got, tc.want)
			}
		})
	}
}
