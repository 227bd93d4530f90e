package node

import (
	"context"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/mig"
	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/agent/timeslice"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// The strategies are values over the shared Strategies, so two of the same kind compare equal.

// migStrategy partitions the GPU into MIG instances (agent/mig).
type migStrategy struct{ s *Strategies }

func (migStrategy) Name() string { return "MIG" }

func (migStrategy) Check(dev gpu.Device, want v1alpha1.Sharing) error {
	if err := checkDynamicMIG(dev, *want.MIG); err != nil {
		return err
	}
	return mig.Check(dev, mig.Wants(*want.MIG))
}

// Satisfied and Apply leave the instances created for claims (dynamic MIG) alone: the layout is the
// fixed instances, placed around them.
func (m migStrategy) Satisfied(ctx context.Context, dev gpu.Device, want v1alpha1.Sharing) (bool, error) {
	var ok bool
	err := m.s.around(dev.UUID, func(held []gpu.Placement) error {
		var err error
		ok, err = m.s.MIG.SatisfiedAround(ctx, dev.UUID, mig.Wants(*want.MIG), held)
		return err
	})
	return ok, err
}

func (m migStrategy) Apply(ctx context.Context, dev gpu.Device, want v1alpha1.Sharing) error {
	return m.s.around(dev.UUID, func(held []gpu.Placement) error {
		_, err := m.s.MIG.ApplyAround(ctx, dev.UUID, mig.Wants(*want.MIG), held)
		return err
	})
}

// Teardown destroys the instances and disables MIG mode (which may wait for a GPU reset:
// MIGModeChangePending); strategies that share the whole GPU refuse a MIG GPU in Check, so this runs
// only for the whole GPU (Exclusive) or on a GPU whose MIG mode is already off.
func (m migStrategy) Teardown(ctx context.Context, dev gpu.Device) error {
	return m.s.MIG.Teardown(ctx, dev.UUID)
}

// mpsStrategy runs one MPS control daemon for the GPU (agent/mps), optionally with the GPU in
// EXCLUSIVE_PROCESS compute mode.
type mpsStrategy struct{ s *Strategies }

func (mpsStrategy) Name() string { return "MPS" }

func (mpsStrategy) Check(dev gpu.Device, want v1alpha1.Sharing) error {
	return needsMIGOff(dev, want.Strategy)
}

func (m mpsStrategy) Satisfied(_ context.Context, dev gpu.Device, want v1alpha1.Sharing) (bool, error) {
	if m.s.MPSExclusiveProcess && dev.ComputeMode != gpu.ComputeModeExclusiveProcess {
		return false, nil
	}
	return m.s.MPS.Satisfied(dev.UUID, mpsSettingsFor(want))
}

func (m mpsStrategy) Apply(ctx context.Context, dev gpu.Device, want v1alpha1.Sharing) error {
	if m.s.MPSExclusiveProcess && dev.ComputeMode != gpu.ComputeModeExclusiveProcess {
		if err := m.s.GPU.SetComputeMode(ctx, dev.UUID, gpu.ComputeModeExclusiveProcess); err != nil {
			return err
		}
	}
	_, err := m.s.MPS.Ensure(ctx, dev.UUID, mpsSettingsFor(want))
	return err
}

// Teardown quits the GPU's daemon, if any, and restores the compute mode MPS set.
func (m mpsStrategy) Teardown(ctx context.Context, dev gpu.Device) error {
	if err := m.s.MPS.Stop(ctx, dev.UUID); err != nil {
		return err
	}
	if m.s.MPSExclusiveProcess && dev.ComputeMode == gpu.ComputeModeExclusiveProcess {
		return m.s.GPU.SetComputeMode(ctx, dev.UUID, gpu.ComputeModeDefault)
	}
	return nil
}

// timeSliceStrategy sets the driver's time slice (agent/timeslice).
type timeSliceStrategy struct{ s *Strategies }

func (timeSliceStrategy) Name() string { return "TimeSlicing" }

func (timeSliceStrategy) Check(dev gpu.Device, want v1alpha1.Sharing) error {
	return needsMIGOff(dev, want.Strategy)
}

func (t timeSliceStrategy) Satisfied(_ context.Context, dev gpu.Device, want v1alpha1.Sharing) (bool, error) {
	return t.s.TimeSlice.Satisfied(dev.UUID, timeSliceSetting(want))
}

func (t timeSliceStrategy) Apply(ctx context.Context, dev gpu.Device, want v1alpha1.Sharing) error {
	return t.s.TimeSlice.Apply(ctx, dev.UUID, timeSliceSetting(want))
}

// Teardown returns the GPU to the driver's default time slice.
func (t timeSliceStrategy) Teardown(ctx context.Context, dev gpu.Device) error {
	return t.s.TimeSlice.Reset(ctx, dev.UUID)
}

func timeSliceSetting(want v1alpha1.Sharing) timeslice.Setting {
	return timeslice.Setting{Interval: want.TimeSlicing.Interval, Replicas: want.TimeSlicing.Replicas}
}

// shimStrategy runs the GPU's shim scheduler (ShimSchedulers) beside time-slicing or the whole GPU.
type shimStrategy struct{ s *Strategies }

func (shimStrategy) Name() string { return "ShimScheduler" }

// Check accepts any GPU: the scheduler needs nothing of the hardware, and its settings are validated
// at admission.
func (shimStrategy) Check(gpu.Device, v1alpha1.Sharing) error { return nil }

func (m shimStrategy) Satisfied(_ context.Context, dev gpu.Device, want v1alpha1.Sharing) (bool, error) {
	return m.s.Shim.Satisfied(dev, *want.Oversubscription, want.QoS)
}

func (m shimStrategy) Apply(ctx context.Context, dev gpu.Device, want v1alpha1.Sharing) error {
	return m.s.Shim.Ensure(ctx, dev, *want.Oversubscription, want.QoS)
}

// Teardown closes the scheduler (its clients run without the lock, reconnecting) and removes its socket.
func (m shimStrategy) Teardown(ctx context.Context, dev gpu.Device) error {
	return m.s.Shim.Stop(ctx, dev.UUID)
}

// wholeGPU is the explicit no-op: the GPU shared by nothing (Exclusive). It is in force once every
// other strategy is torn down.
type wholeGPU struct{}

func (wholeGPU) Name() string                             { return "Exclusive" }
func (wholeGPU) Check(gpu.Device, v1alpha1.Sharing) error { return nil }
func (wholeGPU) Satisfied(context.Context, gpu.Device, v1alpha1.Sharing) (bool, error) {
	return true, nil
}
func (wholeGPU) Apply(context.Context, gpu.Device, v1alpha1.Sharing) error { return nil }
func (wholeGPU) Teardown(context.Context, gpu.Device) error                { return nil }

// needsMIGOff refuses MPS and time-slicing on a GPU whose MIG mode is on: they share the whole GPU, and
// the agent disables MIG only when Exclusive is asked for, never as a side effect.
func needsMIGOff(dev gpu.Device, s v1alpha1.Strategy) error {
	if dev.MIGMode.Current || dev.MIGMode.Pending {
		return outcome.Newf(v1alpha1.ReasonStrategyNeedsMIGDisabled, "%s needs MIG mode disabled on GPU %d, which has it enabled (%d instances); ask for Exclusive first to disable it", s, dev.Index, len(dev.Instances))
	}
	return nil
}

// mpsSettingsFor is the daemon's settings for a desired sharing. Shares sized per claim leave the
// daemon at the GPU's defaults (every SM, no pinned limit): a client can lower the daemon's defaults,
// never raise them, so a default of 100/replicas would cap a claim that asked for more.
func mpsSettingsFor(want v1alpha1.Sharing) mps.Settings {
	if want.Sizing.PerClaim() {
		return mps.Settings{}
	}
	return MPSSettings(*want.MPS)
}

// MPSSettings turns the API's MPS block into daemon settings: the active thread percentage defaults to
// 100/replicas, the pinned memory limit is rounded down to MiB.
func MPSSettings(m v1alpha1.MPSSharing) mps.Settings {
	s := mps.Settings{}
	if m.ActiveThreadPercentage != nil {
		s.ActiveThreadPercentage = *m.ActiveThreadPercentage
	} else if m.Replicas > 0 {
		s.ActiveThreadPercentage = max(1, 100/m.Replicas)
	}
	if m.PinnedMemoryLimit != nil {
		s.PinnedMemoryLimitMiB = m.PinnedMemoryLimit.Value() / (1 << 20)
	}
	return s
}
