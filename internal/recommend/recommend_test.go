package recommend

import (
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// small buckets whose bounds are easy by hand: 0, 1, 3, 7, 15, 31, 63, 127.
var small = Buckets{First: 1, Ratio: 2, Count: 8}

func TestBucketsIndex(t *testing.T) {
	for _, tt := range []struct {
		v    float64
		want int
	}{{0, 0}, {0.9, 0}, {1, 1}, {2.9, 1}, {3, 2}, {6.99, 2}, {7, 3}, {126, 6}, {127, 7}, {1e9, 7}} {
		if got := small.Index(tt.v); got != tt.want {
			t.Errorf("Index(%v) = %d, want %d", tt.v, got, tt.want)
		}
	}
}

func TestPercentiles(t *testing.T) {
	type sample struct {
		v  float64
		at time.Duration
	}
	for _, tt := range []struct {
		name    string
		samples []sample
		p       float64
		want    float64
	}{
		// 2 falls in [1,3), 5 and 5 in [3,7), 10 in [7,15): total weight 4.
		// p50: 2 of 4 reached in [3,7) (1+2=3 >= 2) -> its end, 7.
		{"median is the end of the bucket reaching half the weight", []sample{{2, 0}, {5, 0}, {5, 0}, {10, 0}}, 0.5, 7},
		// p25: 1 of 4 reached in [1,3) -> 3.
		{"p25", []sample{{2, 0}, {5, 0}, {5, 0}, {10, 0}}, 0.25, 3},
		// p90: 3.6 of 4 needs [7,15) -> 15.
		{"p90", []sample{{2, 0}, {5, 0}, {5, 0}, {10, 0}}, 0.9, 15},
		// p100 is the end of the highest non-empty bucket.
		{"p100 covers the highest sample", []sample{{2, 0}, {5, 0}, {5, 0}, {10, 0}}, 1, 15},
		// Half-life 1h: 10 at 0h weighs 1, 2 at 2h weighs 2^2 = 4; total 5. p75 needs 3.75: [1,3) holds 4
		// -> 3. Without decay p75 would need 1.5 of 2 and land in [7,15).
		{"old samples weigh less", []sample{{10, 0}, {2, 2 * time.Hour}}, 0.75, 3},
		// The old sample still bounds p100: decay never drops a peak while it has weight.
		{"p100 keeps an old peak", []sample{{10, 0}, {2, 2 * time.Hour}}, 1, 15},
		{"empty is zero", nil, 0.5, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := NewHistogram(small, time.Hour)
			for _, s := range tt.samples {
				h.Add(s.v, 1, t0.Add(s.at))
			}
			if got := h.Percentile(tt.p); got != tt.want {
				t.Errorf("Percentile(%v) = %v, want %v", tt.p, got, tt.want)
			}
		})
	}
}

func TestDecayShiftKeepsRatios(t *testing.T) {
	h := NewHistogram(small, time.Minute)
	h.Add(10, 1, t0)
	// 200 half-lives later the reference moves; a new sample then weighs 2^200 times the old one, so the
	// median is the new one's bucket and the old one is gone.
	h.Add(2, 1, t0.Add(200*time.Minute))
	if got := h.Percentile(1); got != 3 {
		t.Errorf("Percentile(1) = %v, want 3 (the old sample decayed away)", got)
	}
}

func TestSubtractTakesBackASample(t *testing.T) {
	h := NewHistogram(small, time.Hour)
	h.Add(10, 1, t0)
	h.Add(2, 1, t0.Add(time.Hour))
	h.Subtract(10, 1, t0)
	if got := h.Percentile(1); got != 3 {
		t.Errorf("Percentile(1) = %v, want 3", got)
	}
}

func TestCheckpointRoundTrip(t *testing.T) {
	h := NewHistogram(small, time.Hour)
	for _, v := range []float64{2, 5, 5, 10} {
		h.Add(v, 1, t0)
	}
	// A tiny bucket (1e-6 of the heaviest) keeps weight 1 so p100 survives.
	h.Add(100, 1e-6, t0)
	r := NewHistogram(small, time.Hour)
	r.Restore(h.Checkpoint())
	for _, p := range []float64{0.25, 0.5, 0.9, 1} {
		if a, b := h.Percentile(p), r.Percentile(p); a != b {
			t.Errorf("p%v: %v before, %v after restore", p*100, a, b)
		}
	}
}

const mi = 1 << 20

func TestWorkedMemoryExample(t *testing.T) {
	cfg := DefaultConfig()
	w := NewWorkload(cfg)
	// Three pods of a workload with 10 GiB claims each climb to 3 GiB and fall back.
	for i, pod := range []string{"a", "b", "c"} {
		at := t0.Add(time.Duration(i) * 5 * time.Minute)
		for _, v := range []int64{1024 * mi, 3072 * mi, 2560 * mi} {
			w.ObserveMemory(pod, v, at)
		}
	}
	if _, ok := w.Recommend(t0.Add(9 * time.Minute)); ok {
		t.Fatal("recommended before MinHistory (10 min) passed")
	}
	r, ok := w.Recommend(t0.Add(10 * time.Minute))
	if !ok {
		t.Fatal("no recommendation after 3 peaks over 10 min")
	}
	// By hand: bucket i of MemoryBuckets starts at 16Mi*(1.05^i-1)/0.05 = 320Mi*(1.05^i-1). 3072Mi sits
	// where 1.05^i = 3072/320+1 = 10.6, i = ln 10.6/ln 1.05 = 48.39: bucket 48, whose end is
	// 320Mi*(1.05^49-1) = 320Mi*9.9213 = 3174.8Mi. Plus 10 %: 3492.3Mi. Every pod peaked there, so the
	// median is the same, and the upper bound adds 1/sqrt(3) = 57.7 %: 5508.6Mi.
	near := func(name string, got int64, wantMi float64) {
		if math.Abs(float64(got)/mi-wantMi) > 1 {
			t.Errorf("%s = %.1fMi, want %.1fMi", name, float64(got)/mi, wantMi)
		}
	}
	near("memory", r.Memory, 3492.3)
	near("lower", r.MemoryLower, 3492.3)
	near("upper", r.MemoryUpper, 5508.6)
	// With a 512Mi step the claim is 3.5Gi: 7 steps, the first multiple above 3492.3Mi.
	if got := Fit(r.Memory, 512*mi, 0, 0, 0); got != 3584*mi {
		t.Errorf("Fit = %dMi, want 3584Mi", got/mi)
	}
	if r.Compute != 0 {
		t.Errorf("compute = %d with no SM readings, want 0", r.Compute)
	}
	if ms, _ := w.Samples(); ms != 3 {
		t.Errorf("memory samples = %d, want 3 (one peak per pod)", ms)
	}
}

func TestNeverBelowTheObservedPeakPlusMargin(t *testing.T) {
	w := NewWorkload(DefaultConfig())
	peaks := []int64{500 * mi, 700 * mi, 9000 * mi, 650 * mi, 800 * mi}
	for i, p := range peaks {
		w.ObserveMemory(string(rune('a'+i)), p, t0.Add(time.Duration(i)*time.Hour))
	}
	r, ok := w.Recommend(t0.Add(5 * time.Hour))
	if !ok {
		t.Fatal("no recommendation")
	}
	if float64(r.Memory) < 9000*mi*1.1 {
		t.Errorf("memory %dMi is below the peak 9000Mi plus 10 %%", r.Memory/mi)
	}
}

func TestOverClaimRaisesTheTarget(t *testing.T) {
	w := NewWorkload(DefaultConfig())
	for i, pod := range []string{"a", "b", "c"} {
		w.ObserveMemory(pod, 3072*mi, t0.Add(time.Duration(i)*5*time.Minute))
	}
	before, _ := w.Recommend(t0.Add(time.Hour))
	// A pod with a 4Gi claim is evicted over it: the sample is max(4Gi*1.2, 4Gi+256Mi) = 4915.2Mi.
	// 1.05^i = 4915.2/320+1 = 16.36, i = 57.28: bucket 57, end 320Mi*(1.05^58-1) = 320Mi*15.943 =
	// 5101.8Mi; plus 10 %: 5611.9Mi.
	w.OverClaim(4096*mi, t0.Add(time.Hour))
	after, _ := w.Recommend(t0.Add(time.Hour))
	if after.Memory <= before.Memory {
		t.Fatalf("target %dMi did not rise from %dMi", after.Memory/mi, before.Memory/mi)
	}
	if math.Abs(float64(after.Memory)/mi-5611.9) > 1 {
		t.Errorf("target = %.1fMi, want 5611.9Mi", float64(after.Memory)/mi)
	}
}

func TestARefusedAllocationRaisesTheTargetToItsDemand(t *testing.T) {
	for _, c := range []struct {
		name           string
		demand, target float64 // MiB
	}{
		// A refusal just past a 4Gi claim counts as OverClaim's bump: 5611.9Mi (above).
		{"a demand under the bump", 4200, 5611.9},
		// 7Gi asked: 1.05^i = 7168/320+1 = 23.4, i = 64.6: bucket 64, end 320Mi*(1.05^65-1) = 7308.8Mi;
		// plus 10 %: 8039.6Mi.
		{"a demand over the bump", 7168, 8039.6},
	} {
		w := NewWorkload(DefaultConfig())
		for i, pod := range []string{"a", "b", "c"} {
			w.ObserveMemory(pod, 3072*mi, t0.Add(time.Duration(i)*5*time.Minute))
		}
		w.Refused(4096*mi, int64(c.demand*mi), t0.Add(time.Hour))
		r, _ := w.Recommend(t0.Add(time.Hour))
		if math.Abs(float64(r.Memory)/mi-c.target) > 1 {
			t.Errorf("%s: target = %.1fMi, want %.1fMi", c.name, float64(r.Memory)/mi, c.target)
		}
	}
}

func TestPeakPerPodWindow(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PeakWindow = time.Hour
	w := NewWorkload(cfg)
	w.ObserveMemory("a", 1024*mi, t0)
	w.ObserveMemory("a", 2048*mi, t0.Add(time.Minute))  // replaces the pod's sample
	w.ObserveMemory("a", 512*mi, t0.Add(2*time.Minute)) // lower: nothing
	if ms, _ := w.Samples(); ms != 1 {
		t.Fatalf("samples = %d within one window, want 1", ms)
	}
	w.ObserveMemory("a", 512*mi, t0.Add(61*time.Minute)) // a new window
	if ms, _ := w.Samples(); ms != 2 {
		t.Fatalf("samples = %d after the window, want 2", ms)
	}
}

func TestComputeFromAPercentile(t *testing.T) {
	w := NewWorkload(DefaultConfig())
	for i, pod := range []string{"a", "b", "c"} {
		w.ObserveMemory(pod, 1024*mi, t0.Add(time.Duration(i)*5*time.Minute))
	}
	for range 10 {
		w.ObserveCompute(30, t0)
	}
	r, _ := w.Recommend(t0.Add(time.Hour))
	// ComputeBuckets start at 0.5*(1.05^i-1)/0.05 = 10*(1.05^i-1). 30 % sits where 1.05^i = 4,
	// i = 28.41: bucket 28, end 10*(1.05^29-1) = 10*3.1161 = 31.16; plus 10 %: 34.28, rounded up 35.
	if r.Compute != 35 {
		t.Errorf("compute = %d, want 35", r.Compute)
	}
}

func TestStateRoundTrip(t *testing.T) {
	w := NewWorkload(DefaultConfig())
	for i, pod := range []string{"a", "b", "c"} {
		w.ObserveMemory(pod, int64(1024+i*1024)*mi, t0.Add(time.Duration(i)*5*time.Minute))
		w.ObserveCompute(float64(20+i*10), t0)
	}
	want, _ := w.Recommend(t0.Add(time.Hour))
	got, ok := LoadWorkload(DefaultConfig(), w.Save()).Recommend(t0.Add(time.Hour))
	if !ok || got != want {
		t.Errorf("after restore %+v (ok %v), want %+v", got, ok, want)
	}
}

func TestFit(t *testing.T) {
	for _, tt := range []struct {
		name                     string
		bytes, step, min, lo, hi int64
		want                     int64
	}{
		{"rounds up to the step", 3492 * mi, 512 * mi, 0, 0, 0, 3584 * mi},
		{"at least the policy's minimum", 1000 * mi, 1024 * mi, 4096 * mi, 0, 0, 4096 * mi},
		{"at least the admin's lower bound", 1000 * mi, 1024 * mi, 0, 2048 * mi, 0, 2048 * mi},
		{"at most the admin's upper bound", 9000 * mi, 1024 * mi, 0, 0, 8192 * mi, 8192 * mi},
		{"an upper bound off the step rounds down", 9000 * mi, 1024 * mi, 0, 0, 8500 * mi, 8192 * mi},
		{"never below one step", 0, 512 * mi, 0, 0, 0, 512 * mi},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := Fit(tt.bytes, tt.step, tt.min, tt.lo, tt.hi); got != tt.want {
				t.Errorf("Fit = %dMi, want %dMi", got/mi, tt.want/mi)
			}
		})
	}
}
