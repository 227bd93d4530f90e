package node

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/mig"
	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/agent/runner"
	"github.com/gpusharing/gpusharing/agent/timeslice"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Strategies holds what applies each sharing strategy to a GPU.
type Strategies struct {
	GPU       gpu.Interface
	MIG       *mig.Applier
	MPS       *mps.Manager
	TimeSlice *timeslice.Manager
	// MPSExclusiveProcess sets EXCLUSIVE_PROCESS compute mode on MPS GPUs (and back to Default when
	// they leave MPS), so only the MPS server can open a context. Off by default.
	MPSExclusiveProcess bool
	// Shim runs the shim's scheduler of GPUs whose sharing has oversubscription; nil runs none (and such
	// a sharing fails to apply).
	Shim *ShimSchedulers
}

// converge applies the desired sharing to one GPU, first undoing what another strategy left behind.
// Each step asserts before it acts, so a GPU already as desired costs no command and no NVML change.
func (s *Strategies) converge(ctx context.Context, dev gpu.Device, want v1alpha1.Sharing) error {
	switch want.Strategy {
	case v1alpha1.StrategyMIG:
		if want.MIG == nil {
			return outcome.Newf(v1alpha1.ReasonLayoutDoesNotFit, "sharing.mig is missing")
		}
		if err := s.Shim.Stop(ctx, dev.UUID); err != nil {
			return err
		}
		if err := s.leaveMPS(ctx, dev); err != nil {
			return err
		}
		if err := s.TimeSlice.Reset(ctx, dev.UUID); err != nil {
			return err
		}
		_, err := s.MIG.Apply(ctx, dev.UUID, mig.Wants(*want.MIG))
		return err

	case v1alpha1.StrategyMPS:
		if want.MPS == nil {
			return outcome.Newf(v1alpha1.ReasonMPSDaemonFailed, "sharing.mps is missing")
		}
		if err := needsMIGOff(dev, want.Strategy); err != nil {
			return err
		}
		if err := s.Shim.Stop(ctx, dev.UUID); err != nil {
			return err
		}
		if err := s.TimeSlice.Reset(ctx, dev.UUID); err != nil {
			return err
		}
		if s.MPSExclusiveProcess && dev.ComputeMode != gpu.ComputeModeExclusiveProcess {
			if err := s.GPU.SetComputeMode(ctx, dev.UUID, gpu.ComputeModeExclusiveProcess); err != nil {
				return err
			}
		}
		_, err := s.MPS.Ensure(ctx, dev.UUID, MPSSettings(*want.MPS))
		return err

	case v1alpha1.StrategyTimeSlicing:
		if want.TimeSlicing == nil {
			return outcome.Newf(v1alpha1.ReasonCommandFailed, "sharing.timeSlicing is missing")
		}
		if err := needsMIGOff(dev, want.Strategy); err != nil {
			return err
		}
		if err := s.leaveMPS(ctx, dev); err != nil {
			return err
		}
		if err := s.TimeSlice.Apply(ctx, dev.UUID, timeslice.Setting{Interval: want.TimeSlicing.Interval, Replicas: want.TimeSlicing.Replicas}); err != nil {
			return err
		}
		return s.convergeShim(ctx, dev, want.Oversubscription)

	case v1alpha1.StrategyExclusive:
		if err := s.leaveMPS(ctx, dev); err != nil {
			return err
		}
		if err := s.TimeSlice.Reset(ctx, dev.UUID); err != nil {
			return err
		}
		// Exclusive hands the whole GPU to one pod, so a MIG GPU leaves MIG: its instances are destroyed
		// and MIG mode is disabled (which may wait for a GPU reset: MIGModeChangePending).
		if err := s.MIG.Teardown(ctx, dev.UUID); err != nil {
			return err
		}
		return s.convergeShim(ctx, dev, want.Oversubscription)
	}
	return fmt.Errorf("unknown strategy %q", want.Strategy)
}

// convergeShim runs the GPU's shim scheduler with the policy's oversubscription settings, or stops it
// when the sharing has none.
func (s *Strategies) convergeShim(ctx context.Context, dev gpu.Device, o *v1alpha1.Oversubscription) error {
	if o == nil {
		return s.Shim.Stop(ctx, dev.UUID)
	}
	return s.Shim.Ensure(ctx, dev, *o)
}

// needsMIGOff refuses MPS and time-slicing on a GPU whose MIG mode is on: they share the whole GPU, and
// the agent disables MIG only when Exclusive is asked for, never as a side effect.
func needsMIGOff(dev gpu.Device, s v1alpha1.Strategy) error {
	if dev.MIGMode.Current || dev.MIGMode.Pending {
		return outcome.Newf(v1alpha1.ReasonStrategyNeedsMIGDisabled, "%s needs MIG mode disabled on GPU %d, which has it enabled (%d instances); ask for Exclusive first to disable it", s, dev.Index, len(dev.Instances))
	}
	return nil
}

// leaveMPS quits the GPU's MPS daemon, if any, and restores the compute mode MPS set.
func (s *Strategies) leaveMPS(ctx context.Context, dev gpu.Device) error {
	if err := s.MPS.Stop(ctx, dev.UUID); err != nil {
		return err
	}
	if s.MPSExclusiveProcess && dev.ComputeMode == gpu.ComputeModeExclusiveProcess {
		return s.GPU.SetComputeMode(ctx, dev.UUID, gpu.ComputeModeDefault)
	}
	return nil
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

// reasonFor names the condition reason of a failed pass on a GPU.
func reasonFor(err error) (reason, message string) {
	if o, ok := outcome.As(err); ok {
		return o.Reason, o.Message
	}
	var exit *runner.ExitError
	switch {
	case gpu.IsNVMLError(err), errors.Is(err, gpu.ErrUnavailable), errors.Is(err, gpu.ErrNotFound):
		return v1alpha1.ReasonNVMLError, err.Error()
	case errors.As(err, &exit), errors.Is(err, runner.ErrTimeout):
		return v1alpha1.ReasonCommandFailed, err.Error()
	}
	return v1alpha1.ReasonCommandFailed, err.Error()
}

// transient reports whether an error is worth retrying with backoff rather than waiting for a change
// (a layout that does not fit or a busy GPU stays so until the spec or the workload changes).
func transient(err error) bool {
	_, ok := outcome.As(err)
	return err != nil && !ok
}

func quantityMiB(mib int64) *resource.Quantity {
	if mib <= 0 {
		return nil
	}
	return resource.NewQuantity(mib<<20, resource.BinarySI)
}
