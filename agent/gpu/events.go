package gpu

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// EventKind names an NVML health event type.
type EventKind string

// The health events the agent registers, as NVIDIA's device plugin does: critical Xids and ECC errors.
const (
	EventXid          EventKind = "Xid"
	EventDoubleBitECC EventKind = "DoubleBitECC"
	EventSingleBitECC EventKind = "SingleBitECC"
	// EventOther is any other type NVML delivers (none is registered, so it should not happen).
	EventOther EventKind = "Other"
)

// healthEventTypes are registered on every GPU, less what the GPU does not support.
const healthEventTypes = uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError)

// NoInstance is the GPU or compute instance id of an event that belongs to no MIG instance (NVML's
// 0xFFFFFFFF).
const NoInstance = -1

// Event is one NVML health event.
type Event struct {
	// UUID is the GPU's uuid; for an event of a MIG instance, the parent GPU's. Empty when NVML could
	// not say which GPU it came from.
	UUID string
	// Kind is the event type.
	Kind EventKind
	// Data is the Xid for EventXid, NVML's event data otherwise.
	Data uint64
	// GIID and CIID are the MIG GPU and compute instance the event belongs to, NoInstance when none.
	GIID, CIID int
}

// Registration is how one GPU's health events were registered.
type Registration struct {
	// UUID and Index identify the GPU; UUID is empty when NVML could not name it.
	UUID  string
	Index int
	// Kinds are the event types watched on the GPU.
	Kinds []EventKind
	// Err is nil when the GPU is watched; ErrEventsNotSupported (wrapped) when the GPU reports no
	// health events; another error (an NVMLError) when registering failed.
	Err error
}

// ErrEventsNotSupported is the registration error of a GPU that does not report Xid events.
var ErrEventsNotSupported = errors.New("the GPU does not report Xid events")

// ErrEventTimeout is EventSet.Wait's error when no event came before the timeout.
var ErrEventTimeout = errors.New("no event before the timeout")

// ErrGPULost is returned (wrapped) when NVML says the GPU has fallen off the bus.
var ErrGPULost = errors.New("the GPU is lost")

// EventSet is an NVML event set with every GPU's health events registered. Wait and Free must not run
// at the same time (NVML's event set is not safe for that); Free must be called once.
type EventSet interface {
	// Wait blocks until the next event or the timeout (ErrEventTimeout).
	Wait(timeout time.Duration) (Event, error)
	// Free releases the set.
	Free() error
}

// HealthEvents creates an event set and registers every GPU's health events on it. A GPU whose
// registration fails does not fail the call: its Registration carries the error and the others are
// watched. The error is for the event set itself (or counting the GPUs); then nothing needs freeing.
func (n *NVML) HealthEvents() (EventSet, []Registration, error) {
	set, r := n.lib.EventSetCreate()
	if err := check("EventSetCreate", r); err != nil {
		return nil, nil, err
	}
	count, r := n.lib.DeviceGetCount()
	if err := check("DeviceGetCount", r); err != nil {
		_ = set.Free()
		return nil, nil, err
	}
	es := &eventSet{set: set, handles: map[nvml.Device]string{}}
	regs := make([]Registration, 0, count)
	for i := 0; i < count; i++ {
		reg, h := register(n.lib, i, set)
		if reg.Err == nil {
			es.handles[h] = reg.UUID
		}
		regs = append(regs, reg)
	}
	return es, regs, nil
}

func register(lib nvml.Interface, i int, set nvml.EventSet) (Registration, nvml.Device) {
	reg := Registration{Index: i}
	h, r := lib.DeviceGetHandleByIndex(i)
	if reg.Err = lost(check(fmt.Sprintf("DeviceGetHandleByIndex(%d)", i), r)); reg.Err != nil {
		return reg, nil
	}
	if reg.UUID, r = h.GetUUID(); r != nvml.SUCCESS {
		reg.Err = lost(check("GetUUID", r))
		return reg, nil
	}
	supported, r := h.GetSupportedEventTypes()
	if reg.Err = registrationErr(lost(check("GetSupportedEventTypes", r))); reg.Err != nil {
		return reg, nil
	}
	if supported&nvml.EventTypeXidCriticalError == 0 {
		reg.Err = ErrEventsNotSupported
		return reg, nil
	}
	types := healthEventTypes & supported
	err := lost(check(fmt.Sprintf("RegisterEvents(%s)", strings.Join(kindNames(types), ",")), h.RegisterEvents(types, set)))
	if reg.Err = registrationErr(err); reg.Err != nil {
		return reg, nil
	}
	for _, k := range kindNames(types) {
		reg.Kinds = append(reg.Kinds, EventKind(k))
	}
	return reg, h
}

// registrationErr marks a NOT_SUPPORTED answer as ErrEventsNotSupported, so that callers tell a GPU
// without health events from a failure; other errors stay as they are.
func registrationErr(err error) error {
	if notSupported(err) {
		return fmt.Errorf("%w: %w", ErrEventsNotSupported, err)
	}
	return err
}

// lost adds ErrGPULost to NVML's GPU_IS_LOST.
func lost(err error) error {
	if errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
		return fmt.Errorf("%w: %w", ErrGPULost, err)
	}
	return err
}

func kindNames(types uint64) []string {
	var out []string
	for _, k := range []struct {
		t    uint64
		kind EventKind
	}{{nvml.EventTypeXidCriticalError, EventXid}, {nvml.EventTypeDoubleBitEccError, EventDoubleBitECC}, {nvml.EventTypeSingleBitEccError, EventSingleBitECC}} {
		if types&k.t != 0 {
			out = append(out, string(k.kind))
		}
	}
	return out
}

type eventSet struct {
	set nvml.EventSet
	// handles maps each registered GPU's handle to its uuid: events carry the handle.
	handles map[nvml.Device]string
}

func (s *eventSet) Wait(timeout time.Duration) (Event, error) {
	ms := timeout.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	data, r := s.set.Wait(uint32(ms))
	if r == nvml.ERROR_TIMEOUT {
		return Event{}, ErrEventTimeout
	}
	if err := check("EventSetWait", r); err != nil {
		return Event{}, err
	}
	ev := Event{Kind: EventOther, Data: data.EventData, GIID: instanceID(data.GpuInstanceId), CIID: instanceID(data.ComputeInstanceId)}
	switch data.EventType {
	case nvml.EventTypeXidCriticalError:
		ev.Kind = EventXid
	case nvml.EventTypeDoubleBitEccError:
		ev.Kind = EventDoubleBitECC
	case nvml.EventTypeSingleBitEccError:
		ev.Kind = EventSingleBitECC
	}
	ev.UUID = s.uuid(data.Device)
	return ev, nil
}

// uuid names the GPU of an event: the handle NVML hands back is the one registered (the parent GPU's,
// also for MIG events); failing that, NVML is asked.
func (s *eventSet) uuid(h nvml.Device) string {
	if h == nil {
		return ""
	}
	if u, ok := s.handles[h]; ok {
		return u
	}
	u, r := h.GetUUID()
	if r != nvml.SUCCESS {
		return ""
	}
	if strings.HasPrefix(u, "MIG-") {
		// A MIG device's handle: the health of MIG devices is their parent GPU's.
		parent, r := h.GetDeviceHandleFromMigDeviceHandle()
		if r != nvml.SUCCESS {
			return ""
		}
		return s.uuid(parent)
	}
	return u
}

func instanceID(id uint32) int {
	if id == 0xFFFFFFFF {
		return NoInstance
	}
	return int(id)
}

func (s *eventSet) Free() error { return check("EventSetFree", s.set.Free()) }

// HealthEvents implements the health watcher's source: there is nothing to watch without NVML.
func (n Null) HealthEvents() (EventSet, []Registration, error) { return nil, nil, n.err() }
