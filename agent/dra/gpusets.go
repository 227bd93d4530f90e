package dra

import (
	"slices"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
)

// AttrGPU is the attribute a claim names in a distinctAttribute constraint to have its devices on
// distinct GPUs: every share's uuid attribute is its GPU's (a MIG instance's is the instance's).
const AttrGPU = DriverName + "/" + AttrUUID

// gpuSets splits a claim's requests (those with devices of this driver, in allocation order) into
// the units prepared as one CDI device each. Requests that a constraint `distinctAttribute:
// gpu.gpusharing.io/uuid` ties together (all requests of the claim when it names none) are one GPU
// set: the claim asked for them on distinct GPUs to be used together, so a container gets all of
// them in one environment (CUDA_VISIBLE_DEVICES naming every GPU; docs/dra.md). Every other request is a
// unit of its own, which a container can name alone. A request in two sets joins them.
func gpuSets(constraints []resourcev1.DeviceConstraint, requests []string) [][]string {
	set := make(map[string]int, len(requests)) // request -> set id
	for i, r := range requests {
		set[r] = i
	}
	for _, c := range constraints {
		if c.DistinctAttribute == nil || string(*c.DistinctAttribute) != AttrGPU {
			continue
		}
		var members []string
		for _, r := range requests {
			if len(c.Requests) == 0 || slices.ContainsFunc(c.Requests, func(name string) bool { return names(name, r) }) {
				members = append(members, r)
			}
		}
		for _, m := range members[min(1, len(members)):] {
			from, to := set[m], set[members[0]]
			for r, id := range set {
				if id == from {
					set[r] = to
				}
			}
		}
	}
	var out [][]string
	at := map[int]int{}
	for _, r := range requests {
		i, ok := at[set[r]]
		if !ok {
			i = len(out)
			at[set[r]] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], r)
	}
	return out
}

// names reports whether a constraint's request name covers an allocation result's request: the same
// name, or the request whose subrequest ("gpu/large") the result names.
func names(constraintRequest, resultRequest string) bool {
	return constraintRequest == resultRequest || strings.HasPrefix(resultRequest, constraintRequest+"/")
}
