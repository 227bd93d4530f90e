package scheduler

import "k8s.io/utils/clock"

// Clock is the scheduler's only source of time, so tests can drive quantum, grace and hold-time
// accounting without sleeping. It is the agent's one clock type, k8s.io/utils/clock's; the scheduler
// uses Now and AfterFunc.
type Clock = clock.WithDelayedExecution

// Timer is a pending AfterFunc call.
type Timer = clock.Timer
