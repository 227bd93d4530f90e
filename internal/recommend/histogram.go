// Package recommend turns what a workload's pods held and used of their GPU shares into a recommended
// share size, the way Kubernetes' VPA recommender turns container usage into requests: samples go into
// decaying histograms with exponential buckets, and the recommendation is a percentile of them plus a
// safety margin. It is pure: no clock, no API; the caller passes the time of every sample.
package recommend

import (
	"math"
	"sort"
	"time"
)

// Buckets lays out a histogram's exponential buckets: bucket i starts at
// First*(Ratio^i-1)/(Ratio-1), so the first is First wide and each is Ratio times wider than the one
// before; values past the last bucket fall into it.
type Buckets struct {
	// First is the width of the first bucket, in the histogram's unit.
	First float64
	// Ratio is how much wider each bucket is than the one before; above 1.
	Ratio float64
	// Count is the number of buckets.
	Count int
}

// Start is where bucket i begins.
func (b Buckets) Start(i int) float64 {
	if i <= 0 {
		return 0
	}
	return b.First * (math.Pow(b.Ratio, float64(i)) - 1) / (b.Ratio - 1)
}

// Index is the bucket that holds v.
func (b Buckets) Index(v float64) int {
	if v < b.First {
		return 0
	}
	i := int(math.Floor(math.Log(v*(b.Ratio-1)/b.First+1) / math.Log(b.Ratio)))
	// Floating point can put a value that sits on a boundary one bucket off either way.
	if i < b.Count && b.Start(i+1) <= v {
		i++
	}
	if i > 0 && b.Start(i) > v {
		i--
	}
	return min(i, b.Count-1)
}

// MemoryBuckets cover 16 MiB to beyond 300 GiB in steps of 5 %: a percentile lands at most 5 % above the
// value it stands for.
var MemoryBuckets = Buckets{First: 16 << 20, Ratio: 1.05, Count: 140}

// ComputeBuckets cover 0.5 % to 100 % of the SMs in steps of 5 %.
var ComputeBuckets = Buckets{First: 0.5, Ratio: 1.05, Count: 52}

// maxDecayExponent bounds how far a sample's weight may grow (2^maxDecayExponent) before the histogram
// moves its reference time forward and scales every weight down, so float64 never overflows.
const maxDecayExponent = 100

// epsilon is the weight below which a bucket counts as empty.
const epsilon = 1e-10

// Histogram is a decaying histogram: a sample's weight halves every HalfLife relative to newer ones. It
// stores weights relative to a reference time (a sample added at ref+k*HalfLife weighs 2^k), which keeps
// adding O(1) and makes old samples fade without touching them.
type Histogram struct {
	buckets  Buckets
	halfLife time.Duration
	ref      time.Time
	weights  []float64
	total    float64
}

// NewHistogram is an empty histogram over b whose samples halve in weight every halfLife.
func NewHistogram(b Buckets, halfLife time.Duration) *Histogram {
	return &Histogram{buckets: b, halfLife: halfLife, weights: make([]float64, b.Count)}
}

// factor is the weight multiplier of a sample taken at t.
func (h *Histogram) factor(t time.Time) float64 {
	return math.Exp2(float64(t.Sub(h.ref)) / float64(h.halfLife))
}

// Add records v with weight w taken at t.
func (h *Histogram) Add(v, w float64, t time.Time) {
	if h.ref.IsZero() {
		h.ref = t
	}
	if float64(t.Sub(h.ref))/float64(h.halfLife) > maxDecayExponent {
		h.shift(t)
	}
	i := h.buckets.Index(v)
	d := w * h.factor(t)
	h.weights[i] += d
	h.total += d
}

// Subtract takes back a sample added with Add(v, w, t).
func (h *Histogram) Subtract(v, w float64, t time.Time) {
	if h.ref.IsZero() {
		return
	}
	i := h.buckets.Index(v)
	d := math.Min(w*h.factor(t), h.weights[i])
	h.weights[i] -= d
	h.total -= d
	if h.weights[i] < epsilon {
		h.total -= h.weights[i]
		h.weights[i] = 0
	}
	if h.total < epsilon {
		h.total = 0
	}
}

// shift moves the reference to t, scaling the weights so their ratios stay.
func (h *Histogram) shift(t time.Time) {
	f := 1 / h.factor(t)
	h.total = 0
	for i, w := range h.weights {
		w *= f
		if w < epsilon {
			w = 0
		}
		h.weights[i] = w
		h.total += w
	}
	h.ref = t
}

// Empty says whether the histogram holds no weight.
func (h *Histogram) Empty() bool { return h.total < epsilon }

// Percentile is the end of the bucket where the weight below reaches p (0..1) of the total: the value at
// most that share of the weight lies above. 1 is the end of the highest bucket with weight, so the
// result is never below any sample still in the histogram. An empty histogram answers 0.
func (h *Histogram) Percentile(p float64) float64 {
	if h.Empty() {
		return 0
	}
	threshold := p * h.total
	sum := 0.0
	last := 0
	for i, w := range h.weights {
		if w < epsilon {
			continue
		}
		last = i
		sum += w
		if p < 1 && sum >= threshold*(1-1e-12) {
			return h.buckets.Start(i + 1)
		}
	}
	return h.buckets.Start(last + 1)
}

// Checkpoint is a histogram in a form to store: each non-empty bucket's weight scaled so the largest is
// MaxCheckpointWeight (the ratios are what percentiles need), and the reference time.
type Checkpoint struct {
	// Reference is the time a weight of 1 stands for.
	Reference time.Time
	// Weights maps a bucket index to its scaled weight.
	Weights map[int]uint32
}

// MaxCheckpointWeight is the weight of the heaviest bucket in a checkpoint.
const MaxCheckpointWeight = 10000

// Checkpoint saves the histogram. A bucket lighter than 1/MaxCheckpointWeight of the heaviest keeps
// weight 1, never 0, so the highest sample (Percentile(1)) survives a save and load.
func (h *Histogram) Checkpoint() Checkpoint {
	c := Checkpoint{Reference: h.ref, Weights: map[int]uint32{}}
	top := 0.0
	for _, w := range h.weights {
		top = math.Max(top, w)
	}
	if top < epsilon {
		return c
	}
	for i, w := range h.weights {
		if w < epsilon {
			continue
		}
		c.Weights[i] = uint32(max(1, math.Round(w/top*MaxCheckpointWeight)))
	}
	return c
}

// Restore replaces the histogram's content with c; bucket indexes out of range are dropped.
func (h *Histogram) Restore(c Checkpoint) {
	h.ref = c.Reference
	h.total = 0
	clear(h.weights)
	idx := make([]int, 0, len(c.Weights))
	for i := range c.Weights {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	for _, i := range idx {
		if i < 0 || i >= len(h.weights) {
			continue
		}
		h.weights[i] = float64(c.Weights[i])
		h.total += h.weights[i]
	}
}
