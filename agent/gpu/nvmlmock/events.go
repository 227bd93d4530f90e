package nvmlmock

import (
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// DefaultSupportedEventTypes is what a mock GPU reports from GetSupportedEventTypes: the health events
// and two the agent does not register (P-state and clock changes), so masking shows.
const DefaultSupportedEventTypes = uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError |
	nvml.EventTypeSingleBitEccError | nvml.EventTypePState | nvml.EventTypeClock)

// Events is the server's NVML event plumbing with an injectable queue: EventSetCreate, RegisterEvents,
// GetSupportedEventTypes, EventSet Wait and Free, on the library (EventSetWait, DeviceRegisterEvents,
// ...) and on the handles. Push delivers an event to every live set on which the GPU registered its
// type, as the driver does; Wait blocks (in real time) until an event or its timeout.
type Events struct {
	s *Server

	mu sync.Mutex
	// supported and registerResult are per GPU index; missing means DefaultSupportedEventTypes and SUCCESS.
	supported      map[int]uint64
	supportedRet   map[int]nvml.Return
	registerResult map[int]nvml.Return
	// waitErrs are returned by the next Waits, in order, before any queued event.
	waitErrs []nvml.Return
	// createErrs are returned by the next EventSetCreates, in order.
	createErrs []nvml.Return
	sets       []*EventSet
}

// EventSet is one mock event set.
type EventSet struct {
	*mock.EventSet
	ev *Events

	queue chan nvml.EventData
	// registered maps a GPU index to the event types registered on this set.
	registered map[int]uint64
	waits      int
	freed      int
	waitAfter  int
}

// NewEvents installs the event overrides on s and its GPUs.
func NewEvents(s *Server) *Events {
	e := &Events{s: s, supported: map[int]uint64{}, supportedRet: map[int]nvml.Return{}, registerResult: map[int]nvml.Return{}}
	s.Server.EventSetCreateFunc = e.create
	s.Server.EventSetWaitFunc = func(set nvml.EventSet, timeout uint32) (nvml.EventData, nvml.Return) {
		return set.Wait(timeout)
	}
	s.Server.EventSetFreeFunc = func(set nvml.EventSet) nvml.Return { return set.Free() }
	s.Server.DeviceRegisterEventsFunc = func(d nvml.Device, types uint64, set nvml.EventSet) nvml.Return {
		return d.RegisterEvents(types, set)
	}
	s.Server.DeviceGetSupportedEventTypesFunc = func(d nvml.Device) (uint64, nvml.Return) {
		return d.GetSupportedEventTypes()
	}
	for i, g := range s.GPUs {
		i := i
		g.Device.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
			e.mu.Lock()
			defer e.mu.Unlock()
			if r, ok := e.supportedRet[i]; ok {
				return 0, r
			}
			if t, ok := e.supported[i]; ok {
				return t, nvml.SUCCESS
			}
			return DefaultSupportedEventTypes, nvml.SUCCESS
		}
		g.Device.RegisterEventsFunc = func(types uint64, set nvml.EventSet) nvml.Return {
			return e.register(i, types, set)
		}
	}
	return e
}

// SetSupportedEventTypes sets what GPU i reports from GetSupportedEventTypes.
func (e *Events) SetSupportedEventTypes(i int, types uint64) {
	e.mu.Lock()
	e.supported[i] = types
	e.mu.Unlock()
}

// FailSupportedEventTypes makes GPU i's GetSupportedEventTypes return r.
func (e *Events) FailSupportedEventTypes(i int, r nvml.Return) {
	e.mu.Lock()
	e.supportedRet[i] = r
	e.mu.Unlock()
}

// FailRegisterEvents makes GPU i's RegisterEvents return r (ERROR_NOT_SUPPORTED on a GPU too old for
// health events).
func (e *Events) FailRegisterEvents(i int, r nvml.Return) {
	e.mu.Lock()
	e.registerResult[i] = r
	e.mu.Unlock()
}

// FailWait makes the next Waits return rs, one each, before any event.
func (e *Events) FailWait(rs ...nvml.Return) {
	e.mu.Lock()
	e.waitErrs = append(e.waitErrs, rs...)
	e.mu.Unlock()
}

// FailEventSetCreate makes the next EventSetCreates return rs, one each.
func (e *Events) FailEventSetCreate(rs ...nvml.Return) {
	e.mu.Lock()
	e.createErrs = append(e.createErrs, rs...)
	e.mu.Unlock()
}

// Push delivers an event of type t with data (the Xid, for EventTypeXidCriticalError) from GPU i to
// every live set on which the GPU registered t, and returns how many sets got it. gi and ci are the MIG
// instance ids, 0xFFFFFFFF for none.
func (e *Events) Push(i int, t, data uint64, gi, ci uint32) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, s := range e.sets {
		if s.freed > 0 || s.registered[i]&t == 0 {
			continue
		}
		select {
		case s.queue <- nvml.EventData{Device: e.s.GPUs[i].Device, EventType: t, EventData: data, GpuInstanceId: gi, ComputeInstanceId: ci}:
			n++
		default:
			panic(fmt.Sprintf("nvmlmock: event queue of a set is full (%d events)", cap(s.queue)))
		}
	}
	return n
}

// PushXid delivers a critical Xid of GPU i that belongs to no MIG instance.
func (e *Events) PushXid(i int, xid uint64) int {
	return e.Push(i, nvml.EventTypeXidCriticalError, xid, 0xFFFFFFFF, 0xFFFFFFFF)
}

// Sets returns the event sets created so far.
func (e *Events) Sets() []*EventSet {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*EventSet(nil), e.sets...)
}

// Registered returns the event types GPU i registered on the set.
func (s *EventSet) Registered(i int) uint64 {
	s.ev.mu.Lock()
	defer s.ev.mu.Unlock()
	return s.registered[i]
}

// Waits is how many times Wait was called.
func (s *EventSet) Waits() int { s.ev.mu.Lock(); defer s.ev.mu.Unlock(); return s.waits }

// Freed is how many times Free was called (1 is right).
func (s *EventSet) Freed() int { s.ev.mu.Lock(); defer s.ev.mu.Unlock(); return s.freed }

// WaitsAfterFree is how many times Wait was called on the freed set (0 is right).
func (s *EventSet) WaitsAfterFree() int { s.ev.mu.Lock(); defer s.ev.mu.Unlock(); return s.waitAfter }

func (e *Events) create() (nvml.EventSet, nvml.Return) {
	e.mu.Lock()
	if len(e.createErrs) > 0 {
		r := e.createErrs[0]
		e.createErrs = e.createErrs[1:]
		e.mu.Unlock()
		return nil, r
	}
	e.mu.Unlock()
	s := &EventSet{EventSet: &mock.EventSet{}, ev: e, queue: make(chan nvml.EventData, 64), registered: map[int]uint64{}}
	s.WaitFunc = s.wait
	s.FreeFunc = s.free
	e.mu.Lock()
	e.sets = append(e.sets, s)
	e.mu.Unlock()
	return s, nvml.SUCCESS
}

func (e *Events) register(i int, types uint64, set nvml.EventSet) nvml.Return {
	s, ok := set.(*EventSet)
	if !ok {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if r, ok := e.registerResult[i]; ok {
		return r
	}
	supported, ok := e.supported[i]
	if !ok {
		supported = DefaultSupportedEventTypes
	}
	if types&^supported != 0 || s.freed > 0 {
		return nvml.ERROR_NOT_SUPPORTED // as the driver, for types the GPU does not report
	}
	s.registered[i] |= types
	return nvml.SUCCESS
}

func (s *EventSet) wait(timeoutMs uint32) (nvml.EventData, nvml.Return) {
	e := s.ev
	e.mu.Lock()
	s.waits++
	if s.freed > 0 {
		s.waitAfter++
		e.mu.Unlock()
		return nvml.EventData{}, nvml.ERROR_INVALID_ARGUMENT
	}
	if len(e.waitErrs) > 0 {
		r := e.waitErrs[0]
		e.waitErrs = e.waitErrs[1:]
		e.mu.Unlock()
		return nvml.EventData{}, r
	}
	e.mu.Unlock()
	t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer t.Stop()
	select {
	case d := <-s.queue:
		return d, nvml.SUCCESS
	case <-t.C:
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
}

func (s *EventSet) free() nvml.Return {
	s.ev.mu.Lock()
	defer s.ev.mu.Unlock()
	s.freed++
	if s.freed > 1 {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	return nvml.SUCCESS
}
