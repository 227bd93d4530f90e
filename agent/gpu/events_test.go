package gpu_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpusharing/gpusharing/agent/gpu"
	"github.com/gpusharing/gpusharing/agent/gpu/nvmlmock"
)

func TestHealthEventsRegistersXidAndECCOnlyWhereSupported(t *testing.T) {
	s := nvmlmock.NewA100(4)
	ev := nvmlmock.NewEvents(s)
	ev.SetSupportedEventTypes(1, nvml.EventTypeXidCriticalError|nvml.EventTypePState) // no ECC
	ev.FailRegisterEvents(2, nvml.ERROR_NOT_SUPPORTED)
	ev.FailSupportedEventTypes(3, nvml.ERROR_UNKNOWN)

	set, regs, err := gpu.NewNVML(s).HealthEvents()
	if err != nil {
		t.Fatalf("HealthEvents: %v", err)
	}
	defer set.Free()
	if len(regs) != 4 {
		t.Fatalf("registrations = %+v, want 4", regs)
	}
	for i, r := range regs {
		if r.Index != i || r.UUID != s.GPUs[i].UUID {
			t.Errorf("registration %d = %+v, want index %d uuid %s", i, r, i, s.GPUs[i].UUID)
		}
	}
	if regs[0].Err != nil || !reflect.DeepEqual(regs[0].Kinds, []gpu.EventKind{gpu.EventXid, gpu.EventDoubleBitECC, gpu.EventSingleBitECC}) {
		t.Errorf("GPU 0 = %+v, want Xid and both ECC kinds", regs[0])
	}
	if regs[1].Err != nil || !reflect.DeepEqual(regs[1].Kinds, []gpu.EventKind{gpu.EventXid}) {
		t.Errorf("GPU 1 = %+v, want Xid only", regs[1])
	}
	if !errors.Is(regs[2].Err, gpu.ErrEventsNotSupported) || !errors.Is(regs[2].Err, nvml.ERROR_NOT_SUPPORTED) {
		t.Errorf("GPU 2 error = %v, want ErrEventsNotSupported from NOT_SUPPORTED", regs[2].Err)
	}
	if regs[3].Err == nil || errors.Is(regs[3].Err, gpu.ErrEventsNotSupported) || !gpu.IsNVMLError(regs[3].Err) {
		t.Errorf("GPU 3 error = %v, want the NVML error, not 'not supported'", regs[3].Err)
	}
	mset := ev.Sets()[0]
	want := uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError)
	if got := mset.Registered(0); got != want {
		t.Errorf("GPU 0 registered %#x, want %#x (P-state and clock left out)", got, want)
	}
	if got := mset.Registered(1); got != nvml.EventTypeXidCriticalError {
		t.Errorf("GPU 1 registered %#x, want Xid only", got)
	}
}

func TestHealthEventsWaitNamesTheGPUAndTheMIGInstance(t *testing.T) {
	s := nvmlmock.NewA100(2)
	ev := nvmlmock.NewEvents(s)
	set, _, err := gpu.NewNVML(s).HealthEvents()
	if err != nil {
		t.Fatalf("HealthEvents: %v", err)
	}
	defer set.Free()

	if _, err := set.Wait(time.Millisecond); !errors.Is(err, gpu.ErrEventTimeout) {
		t.Fatalf("Wait on an empty set = %v, want ErrEventTimeout", err)
	}
	if n := ev.Push(1, nvml.EventTypeXidCriticalError, 79, 2, 0); n != 1 {
		t.Fatalf("Push reached %d sets, want 1", n)
	}
	got, err := set.Wait(time.Second)
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	want := gpu.Event{UUID: s.GPUs[1].UUID, Kind: gpu.EventXid, Data: 79, GIID: 2, CIID: 0}
	if got != want {
		t.Errorf("event = %+v, want %+v", got, want)
	}

	ev.PushXid(0, 48)
	got, err = set.Wait(time.Second)
	if want := (gpu.Event{UUID: s.GPUs[0].UUID, Kind: gpu.EventXid, Data: 48, GIID: gpu.NoInstance, CIID: gpu.NoInstance}); err != nil || got != want {
		t.Errorf("event = %+v, %v; want %+v", got, err, want)
	}

	ev.FailWait(nvml.ERROR_UNKNOWN)
	if _, err := set.Wait(time.Second); err == nil || errors.Is(err, gpu.ErrEventTimeout) || !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Errorf("Wait = %v, want NVML's ERROR_UNKNOWN", err)
	}
}

func TestHealthEventsNotSupportedFromSupportedEventTypesOrWithoutXid(t *testing.T) {
	s := nvmlmock.NewA100(2)
	ev := nvmlmock.NewEvents(s)
	ev.FailSupportedEventTypes(0, nvml.ERROR_NOT_SUPPORTED)
	ev.SetSupportedEventTypes(1, nvml.EventTypeDoubleBitEccError|nvml.EventTypePState)
	set, regs, err := gpu.NewNVML(s).HealthEvents()
	if err != nil {
		t.Fatalf("HealthEvents: %v", err)
	}
	defer set.Free()
	for i, r := range regs {
		if !errors.Is(r.Err, gpu.ErrEventsNotSupported) || r.Kinds != nil {
			t.Errorf("GPU %d = %+v, want ErrEventsNotSupported and no kinds", i, r)
		}
		if got := ev.Sets()[0].Registered(i); got != 0 {
			t.Errorf("GPU %d registered %#x, want nothing", i, got)
		}
	}
}

func TestHealthEventsFailsWhenTheEventSetCannotBeCreated(t *testing.T) {
	s := nvmlmock.NewA100(1)
	ev := nvmlmock.NewEvents(s)
	ev.FailEventSetCreate(nvml.ERROR_INSUFFICIENT_RESOURCES)
	if _, _, err := gpu.NewNVML(s).HealthEvents(); !errors.Is(err, nvml.ERROR_INSUFFICIENT_RESOURCES) {
		t.Errorf("HealthEvents = %v, want NVML's INSUFFICIENT_RESOURCES", err)
	}
}

func TestNullHasNoHealthEvents(t *testing.T) {
	if _, _, err := (gpu.Null{}).HealthEvents(); !errors.Is(err, gpu.ErrUnavailable) {
		t.Errorf("HealthEvents = %v, want ErrUnavailable", err)
	}
}
