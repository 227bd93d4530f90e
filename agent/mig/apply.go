package mig

import (
	"context"
	"fmt"
	"slices"

	"github.com/go-logr/logr"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/outcome"
	"github.com/gpusharing/gpusharing/api/v1alpha1"
)

// Applier converges one GPU to a MIG layout.
type Applier struct {
	GPU gpu.Interface
}

// Wants converts the API's request into the planner's.
func Wants(s v1alpha1.MIGSharing) []Want {
	out := make([]Want, 0, len(s.Instances))
	for _, in := range s.Instances {
		out = append(out, Want{Profile: in.Profile, Count: int(in.Count)})
	}
	return out
}

// Satisfied reports whether the GPU already runs exactly the wanted layout: MIG mode on now and after a
// reset, and the instances (each with its compute instance) are the wanted profiles and counts. An error
// means the GPU could not be read, which is not the same as "differs".
func (a *Applier) Satisfied(ctx context.Context, uuid string, want []Want) (bool, error) {
	return a.SatisfiedAround(ctx, uuid, want, nil)
}

// SatisfiedAround is Satisfied on a GPU where held placements hold instances created for claims, which
// are not the layout's (dynamic MIG).
func (a *Applier) SatisfiedAround(ctx context.Context, uuid string, want []Want, held []gpu.Placement) (bool, error) {
	d, err := a.GPU.Device(ctx, uuid)
	if err != nil {
		return false, err
	}
	return satisfied(without(d, held), want), nil
}

func satisfied(d gpu.Device, want []Want) bool {
	if !d.MIGCapable || !d.MIGMode.Current || !d.MIGMode.Pending {
		return false
	}
	counts := map[string]int{}
	for _, w := range want {
		counts[w.Profile] += w.Count
	}
	for _, in := range d.Instances {
		if in.CIID == gpu.NoComputeInstance {
			return false
		}
		counts[in.Profile]--
	}
	for _, c := range counts {
		if c != 0 {
			return false
		}
	}
	return true
}

// Check says, without changing anything, whether the layout can be applied to the GPU as it is now:
// NotMIGCapable or LayoutDoesNotFit when it cannot. The agent asks before it drains a GPU, so that pods
// are never evicted for a layout that cannot fit.
func Check(d gpu.Device, want []Want) error {
	return CheckAround(d, want, nil)
}

// CheckAround is Check on a GPU where held placements hold instances created for claims.
func CheckAround(d gpu.Device, want []Want, held []gpu.Placement) error {
	if !d.MIGCapable {
		return outcome.Newf(v1alpha1.ReasonNotMIGCapable, "GPU %d (%s) does not support MIG", d.Index, d.Product)
	}
	existing := without(d, held).Instances
	if !d.MIGMode.Current {
		existing, held = nil, nil
	}
	if _, err := MakePlanAround(d.Profiles, existing, want, held); err != nil {
		return layoutError(d, err)
	}
	return nil
}

// Apply converges the GPU to the wanted layout and returns the instances that exist afterwards. It
// asserts first: a GPU already as wanted gets no NVML call that changes anything. It refuses to destroy
// instances or change MIG mode while processes run (GPUBusy), enables MIG mode when it is off (and stops
// with MIGModeChangePending when that needs a GPU reset), and explains layouts that cannot fit.
func (a *Applier) Apply(ctx context.Context, uuid string, want []Want) ([]gpu.Instance, error) {
	return a.ApplyAround(ctx, uuid, want, nil)
}

// ApplyAround is Apply on a GPU where held placements hold instances created for claims (dynamic MIG):
// they are neither kept as the layout's nor destroyed, and the layout is placed around them.
func (a *Applier) ApplyAround(ctx context.Context, uuid string, want []Want, held []gpu.Placement) ([]gpu.Instance, error) {
	log := logr.FromContextOrDiscard(ctx).WithValues("gpu", uuid)
	d, err := a.GPU.Device(ctx, uuid)
	if err != nil {
		return nil, err
	}
	if satisfied(without(d, held), want) {
		return d.Instances, nil
	}
	// Plan before touching MIG mode: a layout that cannot fit must not cost the GPU its mode change.
	if err := CheckAround(d, want, held); err != nil {
		return nil, err
	}

	if !d.MIGMode.Current || !d.MIGMode.Pending {
		if !d.MIGMode.Current && len(d.Processes) > 0 {
			return nil, busy(d, "enabling MIG mode")
		}
		log.Info("Enabling MIG mode on GPU", "index", d.Index)
		if err := a.GPU.SetMIGMode(ctx, uuid, true); err != nil {
			return nil, err
		}
		if d, err = a.GPU.Device(ctx, uuid); err != nil {
			return nil, err
		}
		if !d.MIGMode.Current {
			return nil, outcome.Newf(v1alpha1.ReasonMIGModeChangePending, "MIG mode is enabled but pending on GPU %d: it takes effect after a GPU reset", d.Index)
		}
	}

	plan, err := MakePlanAround(d.Profiles, without(d, held).Instances, want, held)
	if err != nil {
		return nil, layoutError(d, err)
	}
	if busyNow, err := a.destroyBusy(ctx, d, plan.Destroy, held); err != nil || busyNow {
		if err != nil {
			return nil, err
		}
		return nil, busy(d, fmt.Sprintf("destroying %d MIG instances", len(plan.Destroy)))
	}
	for _, in := range plan.Destroy {
		log.Info("Destroying MIG instance", "profile", in.Profile, "placement", in.Placement.String(), "gi", in.GIID)
		if err := a.GPU.DestroyInstance(ctx, uuid, in.GIID); err != nil {
			return nil, err
		}
	}
	for _, in := range plan.Keep {
		if in.CIID != gpu.NoComputeInstance {
			continue
		}
		// A GPU instance left without its compute instance (an agent stopped between the two creates).
		log.Info("Creating missing compute instance", "profile", in.Profile, "gi", in.GIID)
		if _, err := a.GPU.CreateComputeInstance(ctx, uuid, in.GIID); err != nil {
			return nil, err
		}
	}
	for _, c := range plan.Create {
		log.Info("Creating MIG instance", "profile", c.Profile.Name, "placement", c.At.String())
		gi, err := a.GPU.CreateGPUInstance(ctx, uuid, c.Profile, c.At)
		if err != nil {
			return nil, err
		}
		if _, err := a.GPU.CreateComputeInstance(ctx, uuid, gi.GIID); err != nil {
			return nil, err
		}
	}

	if d, err = a.GPU.Device(ctx, uuid); err != nil {
		return nil, err
	}
	if !satisfied(without(d, held), want) {
		return d.Instances, fmt.Errorf("MIG layout on GPU %d still differs after applying the plan: have %s, want %s", d.Index, Summary(d.Instances), describe(want))
	}
	return d.Instances, nil
}

// Teardown destroys every MIG instance and disables MIG mode, for a GPU whose desired strategy needs
// the whole GPU (Exclusive). It refuses while processes run and reports a disable that waits for a reset.
func (a *Applier) Teardown(ctx context.Context, uuid string) error {
	d, err := a.GPU.Device(ctx, uuid)
	if err != nil {
		return err
	}
	if !d.MIGCapable || (!d.MIGMode.Current && !d.MIGMode.Pending) {
		return nil
	}
	if d.MIGMode.Current && len(d.Processes) > 0 {
		return busy(d, "disabling MIG mode")
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("gpu", uuid)
	for _, in := range d.Instances {
		log.Info("Destroying MIG instance", "profile", in.Profile, "gi", in.GIID)
		if err := a.GPU.DestroyInstance(ctx, uuid, in.GIID); err != nil {
			return err
		}
	}
	if d.MIGMode.Pending {
		log.Info("Disabling MIG mode on GPU", "index", d.Index)
		if err := a.GPU.SetMIGMode(ctx, uuid, false); err != nil {
			return err
		}
	}
	if d, err = a.GPU.Device(ctx, uuid); err != nil {
		return err
	}
	if d.MIGMode.Current {
		return outcome.Newf(v1alpha1.ReasonMIGModeChangePending, "MIG mode is disabled but pending on GPU %d: it takes effect after a GPU reset", d.Index)
	}
	return nil
}

func layoutError(d gpu.Device, err error) error {
	if nf, ok := err.(*NoFitError); ok {
		return &outcome.Error{Reason: v1alpha1.ReasonLayoutDoesNotFit, Message: fmt.Sprintf("GPU %d (%s): %s", d.Index, d.Product, nf.Message), Err: err}
	}
	return err
}

func busy(d gpu.Device, what string) error {
	return &outcome.Error{
		Reason:  v1alpha1.ReasonGPUBusy,
		Message: fmt.Sprintf("GPU %d: %s would disturb %d running processes (pids %v)", d.Index, what, len(d.Processes), d.PIDs()),
		PIDs:    d.PIDs(),
	}
}

// Summary renders instances as "3g.40gb,1g.10gb×4" for status and messages.
func Summary(instances []gpu.Instance) string {
	var order []string
	counts := map[string]int{}
	for _, in := range instances {
		if counts[in.Profile] == 0 {
			order = append(order, in.Profile)
		}
		counts[in.Profile]++
	}
	out := ""
	for i, name := range order {
		if i > 0 {
			out += ","
		}
		out += name
		if counts[name] > 1 {
			out += fmt.Sprintf("×%d", counts[name])
		}
	}
	if out == "" {
		return "none"
	}
	return out
}

// without is d less the instances at held placements (those created for claims).
func without(d gpu.Device, held []gpu.Placement) gpu.Device {
	if len(held) == 0 {
		return d
	}
	out := d
	out.Instances = nil
	for _, in := range d.Instances {
		if !slices.Contains(held, in.Placement) {
			out.Instances = append(out.Instances, in)
		}
	}
	return out
}

// instanceProcesses reads the processes of one MIG instance; gpu.NVML has it.
type instanceProcesses interface {
	InstanceProcesses(ctx context.Context, uuid string, giID int) ([]gpu.Process, error)
}

// destroyBusy says whether processes keep the plan from destroying instances. Where claims hold
// instances beside the layout (held), their pods keep running through a fixed-layout change, so only
// processes on the instances the plan destroys count, read per instance; elsewhere, or where the GPU
// cannot say which instance a process runs on, any process on the GPU does.
func (a *Applier) destroyBusy(ctx context.Context, d gpu.Device, destroy []gpu.Instance, held []gpu.Placement) (bool, error) {
	if len(destroy) == 0 || len(d.Processes) == 0 {
		return false, nil
	}
	ip, ok := a.GPU.(instanceProcesses)
	if !ok || len(held) == 0 {
		return true, nil
	}
	for _, in := range destroy {
		procs, err := ip.InstanceProcesses(ctx, d.UUID, in.GIID)
		if err != nil {
			return false, err
		}
		if len(procs) > 0 {
			return true, nil
		}
	}
	return false, nil
}
