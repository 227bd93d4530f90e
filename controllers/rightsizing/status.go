package rightsizing

import (
	"fmt"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/gpusharing/gpusharing/api/v1alpha1"
	"github.com/gpusharing/gpusharing/internal/recommend"
)

// bounds are a namespace's bounds on what Initial gives a claim; zero is no bound.
type bounds struct {
	min, max int64
	// err says which annotation cannot be read; Initial then sizes nothing.
	err error
}

// boundsOf reads the namespace's bound annotations.
func boundsOf(annotations map[string]string) bounds {
	var b bounds
	read := func(key string) int64 {
		s, ok := annotations[key]
		if !ok || b.err != nil {
			return 0
		}
		q, err := resource.ParseQuantity(s)
		if err != nil || q.Sign() < 0 {
			b.err = fmt.Errorf("annotation %s=%q is not a quantity of bytes such as 2Gi", key, s)
			return 0
		}
		return q.Value()
	}
	b.min, b.max = read(v1.RightsizingMinMemoryKey), read(v1.RightsizingMaxMemoryKey)
	if b.err == nil && b.max > 0 && b.min > b.max {
		b.err = fmt.Errorf("annotation %s (%d bytes) exceeds %s (%d bytes)", v1.RightsizingMinMemoryKey, b.min, v1.RightsizingMaxMemoryKey, b.max)
	}
	return b
}

// modeOf is the mode in force: the workload's annotation, else the namespace's label, else its
// annotation, else Off. A value other than Off or Initial counts as Off.
func modeOf(workload, nsLabels, nsAnnotations map[string]string) v1.RightsizingMode {
	for _, m := range []map[string]string{workload, nsLabels, nsAnnotations} {
		if v, ok := m[v1.RightsizingModeKey]; ok {
			if v == string(v1.RightsizingInitial) {
				return v1.RightsizingInitial
			}
			return v1.RightsizingOff
		}
	}
	return v1.RightsizingOff
}

// statusInput is what a recommendation's status is computed from.
type statusInput struct {
	t               target
	w               *recommend.Workload
	claimMemory     int64
	step, minMemory int64
	overClaims      []string
	mode            v1.RightsizingMode
	bounds          bounds
	now             time.Time
	prev            []metav1.Condition
}

// statusFor computes the status from in; it is recomputed whole each time.
func statusFor(in statusInput) v1.GPUShareRecommendationStatus {
	s := v1.GPUShareRecommendationStatus{
		Mode:           in.mode,
		PodNamePattern: PodNamePattern(in.t.Workload),
		History:        historyFrom(in.w.Save(), in.overClaims),
		Conditions:     append([]metav1.Condition(nil), in.prev...),
	}
	ms, _ := in.w.Samples()
	s.Samples = ms
	if in.claimMemory > 0 {
		s.ClaimMemory = resource.NewQuantity(in.claimMemory, resource.BinarySI)
	}
	cond := metav1.Condition{Type: v1.ConditionRecommended}
	rec, ok := in.w.Recommend(in.now)
	switch {
	case !ok:
		// The message names no elapsed time: it would change, and be written, at every pass.
		cfg := in.w.Config()
		first := "none"
		if h := s.History.FirstSample; h != nil {
			first = h.UTC().Format(time.RFC3339)
		}
		cond.Status, cond.Reason = metav1.ConditionFalse, v1.ReasonNotEnoughSamples
		cond.Message = fmt.Sprintf("%d of %d pod peaks; needs %s of history, first sample %s", ms, cfg.MinMemorySamples, cfg.MinHistory, first)
	default:
		s.Memory = &v1.RecommendedMemory{
			Target:     resource.NewQuantity(rec.Memory, resource.BinarySI),
			LowerBound: resource.NewQuantity(rec.MemoryLower, resource.BinarySI),
			UpperBound: resource.NewQuantity(rec.MemoryUpper, resource.BinarySI),
		}
		if rec.Compute > 0 {
			s.Compute = &v1.RecommendedCompute{Target: rec.Compute, LowerBound: rec.ComputeLower, UpperBound: rec.ComputeUpper}
		}
		if in.bounds.err != nil {
			cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, v1.ReasonBoundsInvalid, in.bounds.err.Error()
			break
		}
		initial := recommend.Fit(rec.Memory, in.step, in.minMemory, in.bounds.min, in.bounds.max)
		s.InitialMemory = resource.NewQuantity(initial, resource.BinarySI)
		s.MemoryFreed = resource.NewQuantity(max(in.claimMemory-initial, 0), resource.BinarySI)
		cond.Status, cond.Reason = metav1.ConditionTrue, v1.ReasonRecommended
		cond.Message = fmt.Sprintf("%s from %d pod peaks; new claims get %s in mode Initial", s.Memory.Target, ms, s.InitialMemory)
	}
	meta.SetStatusCondition(&s.Conditions, cond)
	return s
}

// visiblyDiffers says whether a and b differ in more than their history: what a reader sees moved.
func visiblyDiffers(a, b *v1.GPUShareRecommendationStatus) bool {
	if a == nil || b == nil {
		return a != b
	}
	x, y := *a, *b
	x.History, y.History = v1.RecommendationHistory{}, v1.RecommendationHistory{}
	return !equality.Semantic.DeepEqual(x, y)
}

func historyFrom(s recommend.State, overClaims []string) v1.RecommendationHistory {
	h := v1.RecommendationHistory{MemorySamples: s.MemorySamples, ComputeSamples: s.ComputeSamples,
		Memory: checkpointFrom(s.Memory), Compute: checkpointFrom(s.Compute), OverClaims: append([]string(nil), overClaims...)}
	if !s.First.IsZero() {
		h.FirstSample = &metav1.Time{Time: s.First}
	}
	return h
}

func checkpointFrom(c recommend.Checkpoint) v1.HistogramCheckpoint {
	var out v1.HistogramCheckpoint
	if !c.Reference.IsZero() {
		out.Reference = &metav1.Time{Time: c.Reference}
	}
	for i, w := range c.Weights {
		out.Buckets = append(out.Buckets, v1.HistogramBucket{Index: int32(i), Weight: int32(w)})
	}
	sort.Slice(out.Buckets, func(i, j int) bool { return out.Buckets[i].Index < out.Buckets[j].Index })
	return out
}

// stateFrom is the history as recommend's state. Stored times have a second's precision, which moves
// a weight by at most a second's worth of decay.
func stateFrom(h v1.RecommendationHistory) recommend.State {
	s := recommend.State{MemorySamples: h.MemorySamples, ComputeSamples: h.ComputeSamples,
		Memory: checkpointTo(h.Memory), Compute: checkpointTo(h.Compute)}
	if h.FirstSample != nil {
		s.First = h.FirstSample.Time
	}
	return s
}

func checkpointTo(c v1.HistogramCheckpoint) recommend.Checkpoint {
	out := recommend.Checkpoint{Weights: map[int]uint32{}}
	if c.Reference != nil {
		out.Reference = c.Reference.Time
	}
	for _, b := range c.Buckets {
		out.Weights[int(b.Index)] = uint32(b.Weight)
	}
	return out
}
