package node

import (
	"fmt"
	"sort"
	"strings"

	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// productionSummary renders each GPU's production pods for the wide table: "0:serving/web 1:-", only
// GPUs with production classes in force. A pod is named once, whether the accounting or the shim's
// scheduler (or both) saw it.
func productionSummary(gpus []v1alpha1.GPUStatus) string {
	return perGPUSummary(gpus, func(g *v1alpha1.GPUStatus) (string, bool) {
		if appliedQoS(g) == nil {
			return "", false
		}
		pods := productionPods(g)
		switch n := len(pods); {
		case n == 0:
			return "-", true
		case n > v1alpha1.MaxProductionPodsInSummary:
			return fmt.Sprintf("%s,+%d", strings.Join(pods[:v1alpha1.MaxProductionPodsInSummary], ","), n-v1alpha1.MaxProductionPodsInSummary), true
		default:
			return strings.Join(pods, ","), true
		}
	})
}

// productionPods are the distinct namespace/name of the GPU's consumers and shim clients classed
// Production, sorted.
func productionPods(g *v1alpha1.GPUStatus) []string {
	seen := map[string]bool{}
	if g.Usage != nil {
		for _, c := range g.Usage.Consumers {
			if c.Class == v1alpha1.ClassProduction {
				seen[c.Namespace+"/"+c.Pod] = true
			}
		}
	}
	if g.Applied != nil && g.Applied.Shim != nil {
		for _, c := range g.Applied.Shim.Clients {
			if c.Class == v1alpha1.ClassProduction && c.Pod != "" {
				seen[c.Pod] = true
			}
		}
	}
	pods := make([]string, 0, len(seen))
	for p := range seen {
		pods = append(pods, p)
	}
	sort.Strings(pods)
	return pods
}

// perGPUSummary joins "<index>:<part>" for each GPU, in index order, that part reports.
func perGPUSummary(gpus []v1alpha1.GPUStatus, part func(*v1alpha1.GPUStatus) (string, bool)) string {
	sorted := append([]v1alpha1.GPUStatus(nil), gpus...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Index < sorted[j].Index })
	var parts []string
	for i := range sorted {
		if p, ok := part(&sorted[i]); ok {
			parts = append(parts, fmt.Sprintf("%d:%s", sorted[i].Index, p))
		}
	}
	return strings.Join(parts, " ")
}
