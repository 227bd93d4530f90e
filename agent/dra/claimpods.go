package dra

import (
	"slices"
	"strconv"
	"strings"
)

// ClaimPods names, per GPU index, the pods ("namespace/name") of the claims the checkpoint holds with a
// device of that GPU, sorted, each once: the pods a claim was reserved for when it was prepared,
// including the claims the kube-scheduler makes for extended resources served through DRA.
func (p *KubeletPlugin) ClaimPods() map[int32][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[int32][]string{}
	for _, c := range p.cp.Claims {
		for _, d := range c.Devices {
			index, ok := GPUIndex(d.Device)
			if !ok {
				continue
			}
			for _, pod := range c.Pods {
				out[index] = append(out[index], c.Namespace+"/"+pod)
			}
		}
	}
	for i, pods := range out {
		slices.Sort(pods)
		out[i] = slices.Compact(pods)
	}
	return out
}

// GPUIndex is the GPU index every published device name starts with (gpu-<index>, OfGPU).
func GPUIndex(device string) (int32, bool) {
	rest, ok := strings.CutPrefix(device, "gpu-")
	if !ok {
		return 0, false
	}
	digits, _, _ := strings.Cut(rest, "-")
	i, err := strconv.ParseInt(digits, 10, 32)
	if err != nil || i < 0 || strconv.FormatInt(i, 10) != digits {
		return 0, false
	}
	return int32(i), true
}
