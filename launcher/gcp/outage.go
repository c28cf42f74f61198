package gcp

import (
	"time"
)

// outage is a run of failed calls to one part of the API (a zone's preemption operations, a
// VM's serial port) made by a loop: how many, since when, and when to call again. The wait
// doubles from the loop's own interval up to a limit, with ±20% jitter, so that a loop
// neither hammers an API that is down nor logs it every tick: it logs when the run starts and
// when it ends.
type outage struct {
	failures int
	since    time.Time
	retryAt  time.Time
}

// due reports whether a call may go at now.
func (o *outage) due(now time.Time) bool { return !now.Before(o.retryAt) }

// fail records a failed call at now and returns how long to wait before the next one; first is
// true for the first failure of a run (the one to log). jitter is a draw in [0, 1).
func (o *outage) fail(now time.Time, base, limit time.Duration, jitter float64) (wait time.Duration, first bool) {
	o.failures++
	first = o.failures == 1
	if first {
		o.since = now
	}
	wait = min(base<<min(o.failures-1, 16), max(limit, base))
	wait = time.Duration(float64(wait) * (0.8 + 0.4*jitter))
	o.retryAt = now.Add(wait)
	return wait, first
}

// end records an answer and returns the run it ended (zero failures: there was none).
func (o *outage) end() outage {
	run := *o
	*o = outage{}
	return run
}
