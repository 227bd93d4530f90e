package recommend

import (
	"math"
	"time"
)

// Config tunes a workload's recommendation.
type Config struct {
	// MemoryHalfLife and ComputeHalfLife are how long a sample takes to weigh half a new one.
	MemoryHalfLife  time.Duration
	ComputeHalfLife time.Duration
	// Margin is the safety margin over the percentile: 0.1 recommends 10 % above it.
	Margin float64
	// ComputePercentile is the percentile of SM use the compute target covers (0..1). Memory always
	// covers the highest peak still in the histogram: a share too small for memory fails, one too small
	// for compute only runs slower.
	ComputePercentile float64
	// MinMemorySamples is the fewest pod peaks before memory is recommended.
	MinMemorySamples int64
	// MinHistory is how long samples must have come in before anything is recommended.
	MinHistory time.Duration
	// PeakWindow is how long one pod's peak counts as one sample; a pod that lives longer adds a new
	// peak per window, so a long-lived pod does not stand for one sample forever.
	PeakWindow time.Duration
	// OverClaimBump and OverClaimMinBump raise the memory after a pod went over its claim or an
	// allocation was refused at the cap: a sample at max(claim*(1+OverClaimBump), claim+OverClaimMinBump).
	OverClaimBump    float64
	OverClaimMinBump int64
}

// DefaultConfig mirrors VPA's recommender where the two meet (24 h half-life, 24 h peak windows) and
// keeps a 10 % margin over the peak.
func DefaultConfig() Config {
	return Config{
		MemoryHalfLife:    24 * time.Hour,
		ComputeHalfLife:   24 * time.Hour,
		Margin:            0.10,
		ComputePercentile: 0.90,
		MinMemorySamples:  3,
		MinHistory:        10 * time.Minute,
		PeakWindow:        24 * time.Hour,
		OverClaimBump:     0.20,
		OverClaimMinBump:  256 << 20,
	}
}

// peak is one pod's highest memory within its current window, as it stands in the histogram.
type peak struct {
	bytes       float64
	at          time.Time
	windowStart time.Time
}

// Workload is the history of one workload's sized request: a histogram of its pods' memory peaks and
// one of its SM use.
type Workload struct {
	cfg     Config
	memory  *Histogram
	compute *Histogram
	// first is the time of the first sample.
	first          time.Time
	memorySamples  int64
	computeSamples int64
	pods           map[string]*peak
}

// NewWorkload is a workload with no history.
func NewWorkload(cfg Config) *Workload {
	return &Workload{
		cfg:     cfg,
		memory:  NewHistogram(MemoryBuckets, cfg.MemoryHalfLife),
		compute: NewHistogram(ComputeBuckets, cfg.ComputeHalfLife),
		pods:    map[string]*peak{},
	}
}

func (w *Workload) seen(t time.Time) {
	if w.first.IsZero() || t.Before(w.first) {
		w.first = t
	}
}

// ObserveMemory records that pod holds bytes at t. Only a pod's peak per window enters the histogram:
// a higher reading replaces the pod's sample, a lower one changes nothing.
func (w *Workload) ObserveMemory(pod string, bytes int64, t time.Time) {
	w.seen(t)
	v := float64(bytes)
	p := w.pods[pod]
	if p != nil && t.Sub(p.windowStart) >= w.cfg.PeakWindow {
		p = nil // the old window's peak stays a sample of its own
	}
	switch {
	case p == nil:
		w.pods[pod] = &peak{bytes: v, at: t, windowStart: t}
		w.memory.Add(v, 1, t)
		w.memorySamples++
	case v > p.bytes:
		w.memory.Subtract(p.bytes, 1, p.at)
		w.memory.Add(v, 1, t)
		p.bytes, p.at = v, t
	}
}

// ObserveCompute records a reading of the workload's SM use in percent at t.
func (w *Workload) ObserveCompute(percent float64, t time.Time) {
	w.seen(t)
	w.compute.Add(math.Max(percent, 0), 1, t)
	w.computeSamples++
}

// OverClaim records that a pod went over a claim of claimBytes (reported, evicted or refused an
// allocation at the cap) at t: the peak it would have reached is unknown, so the sample stands above
// the claim by the configured bump.
func (w *Workload) OverClaim(claimBytes int64, t time.Time) {
	w.seen(t)
	c := float64(claimBytes)
	v := math.Max(c*(1+w.cfg.OverClaimBump), c+float64(w.cfg.OverClaimMinBump))
	w.memory.Add(v, 1, t)
	w.memorySamples++
}

// Refused adds the sample of an allocation the shim refused at the cap of a claim of claimBytes, which
// would have brought the claim's processes to demandBytes: OverClaim's bump, or the demand where it is
// higher (what the workload asked is known to be at least that).
func (w *Workload) Refused(claimBytes, demandBytes int64, t time.Time) {
	w.seen(t)
	c := float64(claimBytes)
	v := math.Max(math.Max(c*(1+w.cfg.OverClaimBump), c+float64(w.cfg.OverClaimMinBump)), float64(demandBytes))
	w.memory.Add(v, 1, t)
	w.memorySamples++
}

// ForgetPod stops tracking pod's peak window (the pod is gone); its samples stay in the histogram.
func (w *Workload) ForgetPod(pod string) { delete(w.pods, pod) }

// Samples is the number of memory peaks and compute readings behind the recommendation.
func (w *Workload) Samples() (memory, compute int64) { return w.memorySamples, w.computeSamples }

// Recommendation is a recommended share: a target with the range it is confident in. Compute fields
// are 0 where no SM use was read (MIG takes no per-process samples).
type Recommendation struct {
	// Memory is the target in bytes: the highest peak still in the history plus the margin.
	Memory int64
	// MemoryLower is the median peak plus the margin: below it, half the pods would go over.
	MemoryLower int64
	// MemoryUpper widens the target by 1/sqrt(samples): loose with few pods, tight with many.
	MemoryUpper int64
	// Compute is the target percent of the SMs: ComputePercentile of the readings plus the margin.
	Compute      int32
	ComputeLower int32
	ComputeUpper int32
}

// Recommend is the recommendation at t; false until MinMemorySamples peaks over MinHistory came in.
func (w *Workload) Recommend(t time.Time) (Recommendation, bool) {
	if w.memorySamples < w.cfg.MinMemorySamples || w.first.IsZero() || t.Sub(w.first) < w.cfg.MinHistory || w.memory.Empty() {
		return Recommendation{}, false
	}
	m := 1 + w.cfg.Margin
	target := w.memory.Percentile(1) * m
	r := Recommendation{
		Memory:      int64(math.Ceil(target)),
		MemoryLower: int64(math.Ceil(w.memory.Percentile(0.5) * m)),
		MemoryUpper: int64(math.Ceil(target * (1 + 1/math.Sqrt(float64(w.memorySamples))))),
	}
	if !w.compute.Empty() {
		pct := func(p float64) int32 { return int32(math.Min(100, math.Ceil(w.compute.Percentile(p)*m))) }
		r.Compute, r.ComputeLower, r.ComputeUpper = pct(w.cfg.ComputePercentile), pct(0.5), pct(0.95)
	}
	return r, true
}

// State is a workload's history in a form to store across restarts. The pods' current windows are not
// kept: after a restart a running pod's next reading starts a new window.
type State struct {
	Memory, Compute Checkpoint
	First           time.Time
	MemorySamples   int64
	ComputeSamples  int64
}

// Save is the workload's state.
func (w *Workload) Save() State {
	return State{Memory: w.memory.Checkpoint(), Compute: w.compute.Checkpoint(), First: w.first,
		MemorySamples: w.memorySamples, ComputeSamples: w.computeSamples}
}

// LoadWorkload is a workload restored from s.
func LoadWorkload(cfg Config, s State) *Workload {
	w := NewWorkload(cfg)
	w.memory.Restore(s.Memory)
	w.compute.Restore(s.Compute)
	w.first, w.memorySamples, w.computeSamples = s.First, s.MemorySamples, s.ComputeSamples
	return w
}

// Fit turns a recommended size into a claim's size: rounded up to a multiple of step, at least minimum
// and lo, at most hi (rounded down to step, and never below one step). Zero lo or hi is no bound.
func Fit(bytes, step, minimum, lo, hi int64) int64 {
	if step <= 0 {
		step = 1
	}
	up := func(v int64) int64 { return (v + step - 1) / step * step }
	v := max(up(bytes), up(minimum), up(lo), step)
	if hi > 0 {
		v = min(v, max(hi/step*step, step))
	}
	return v
}

// Config is the workload's configuration.
func (w *Workload) Config() Config { return w.cfg }
