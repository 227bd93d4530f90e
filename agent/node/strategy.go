package node

import (
	"context"
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/mig"
	"github.com/gpusharing/gpusharing/agent/mps"
	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/agent/timeslice"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Strategy is one way of sharing a GPU as the agent puts it in force: MIG, MPS, time-slicing, the shim
// scheduler, or nothing (the whole GPU). A desired sharing is in force when its strategies are applied
// and every other strategy is torn down, so no strategy needs to know what another leaves behind.
type Strategy interface {
	// Name names the strategy in logs and tests.
	Name() string
	// Check says, changing nothing, whether the GPU as it is can take want; the error is an outcome
	// (a reason that waits for a spec or hardware change) when it cannot.
	Check(dev gpu.Device, want v1alpha1.Sharing) error
	// Satisfied says whether want is in force; an error means "could not check", never "differs".
	Satisfied(ctx context.Context, dev gpu.Device, want v1alpha1.Sharing) (bool, error)
	// Apply puts want in force.
	Apply(ctx context.Context, dev gpu.Device, want v1alpha1.Sharing) error
	// Teardown undoes whatever the strategy left on the GPU; on a GPU where it left nothing it runs no
	// command and changes nothing.
	Teardown(ctx context.Context, dev gpu.Device) error
}

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
	// ClaimedMIG, when set, holds the MIG instances created for claims on dynamic MIG GPUs, which the
	// layout applier leaves alone.
	ClaimedMIG ClaimedMIG
}

// all lists every strategy in teardown order: what runs beside the GPU's sharing first (the shim's
// scheduler, the MPS daemon), the GPU's own mode last (MIG, which refuses while processes remain).
func (s *Strategies) all() []Strategy {
	return []Strategy{shimStrategy{s}, mpsStrategy{s}, timeSliceStrategy{s}, migStrategy{s}, wholeGPU{}}
}

// forSharing names the strategies a desired sharing is made of: its strategy, plus the shim's
// scheduler where the sharing oversubscribes (time-slicing or the whole GPU). A sharing no agent can
// apply is a terminal InvalidSharing, not an error to retry.
func (s *Strategies) forSharing(want v1alpha1.Sharing) ([]Strategy, error) {
	var use []Strategy
	switch want.Strategy {
	case v1alpha1.StrategyMIG:
		if want.MIG == nil {
			return nil, outcome.Newf(v1alpha1.ReasonInvalidSharing, "strategy MIG needs sharing.mig, which is missing")
		}
		return []Strategy{migStrategy{s}}, nil
	case v1alpha1.StrategyMPS:
		if want.MPS == nil {
			return nil, outcome.Newf(v1alpha1.ReasonInvalidSharing, "strategy MPS needs sharing.mps, which is missing")
		}
		return []Strategy{mpsStrategy{s}}, nil
	case v1alpha1.StrategyTimeSlicing:
		if want.TimeSlicing == nil {
			return nil, outcome.Newf(v1alpha1.ReasonInvalidSharing, "strategy TimeSlicing needs sharing.timeSlicing, which is missing")
		}
		use = []Strategy{timeSliceStrategy{s}}
	case v1alpha1.StrategyExclusive:
		use = []Strategy{wholeGPU{}}
	default:
		return nil, outcome.Newf(v1alpha1.ReasonInvalidSharing, "unknown strategy %q", want.Strategy)
	}
	if want.Oversubscription != nil {
		use = append(use, shimStrategy{s})
	}
	return use, nil
}

// Admit is the one place that decides whether a GPU, as it is, can take a desired sharing; converge
// asks it before changing anything, and the drain before it evicts a pod for a change that could not
// be applied. It returns the sharing's strategies.
func (s *Strategies) Admit(dev gpu.Device, want v1alpha1.Sharing) ([]Strategy, error) {
	use, err := s.forSharing(want)
	if err != nil {
		return nil, err
	}
	for _, st := range use {
		if err := st.Check(dev, want); err != nil {
			return nil, err
		}
	}
	if err := checkSizing(dev, want.Sizing); err != nil {
		return nil, err
	}
	return use, nil
}

// checkSizing refuses per-claim sizes the GPU cannot publish: a device with consumable capacity must
// hold at least the minimum plus one step (the API server refuses a ResourceSlice otherwise), so a step
// or minimum meant for larger GPUs leaves this one as it was, with the reason in its status.
func checkSizing(dev gpu.Device, s *v1alpha1.Sizing) error {
	if !s.PerClaim() || dev.MemoryBytes == 0 {
		return nil
	}
	if need := s.Min() + s.Step(); uint64(need) > dev.MemoryBytes {
		return outcome.Newf(v1alpha1.ReasonSizingDoesNotFit,
			"sizing PerClaim needs at least minMemory %s plus memoryStep %s (%s) of GPU memory; this GPU has %s",
			resource.NewQuantity(s.Min(), resource.BinarySI), resource.NewQuantity(s.Step(), resource.BinarySI),
			resource.NewQuantity(need, resource.BinarySI), resource.NewQuantity(int64(dev.MemoryBytes), resource.BinarySI))
	}
	return nil
}

// converge puts the desired sharing in force on one GPU: every strategy it does not use is torn down,
// then each it uses is applied unless already satisfied. Each step asserts before it acts, so a GPU
// already as desired costs no command and no NVML change.
func (s *Strategies) converge(ctx context.Context, dev gpu.Device, want v1alpha1.Sharing) error {
	use, err := s.Admit(dev, want)
	if err != nil {
		return err
	}
	for _, st := range s.all() {
		if slices.Contains(use, st) {
			continue
		}
		if err := st.Teardown(ctx, dev); err != nil {
			return err
		}
	}
	for _, st := range use {
		ok, err := st.Satisfied(ctx, dev, want)
		if err != nil {
			return err
		}
		if ok {
			continue
		}
		if err := st.Apply(ctx, dev, want); err != nil {
			return err
		}
	}
	return nil
}
