package provision

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ferryserve/ferry/launcher"
)

// Health is a circuit breaker per infra, and per zone or region where the infra's API is
// zonal, fed by every call the provisioner makes. Consecutive failures of the infra itself
// (unavailable, unauthorized, not found for a zone) open it; one call that ran out its
// deadline opens it at once, so that nobody else waits on a hung endpoint. While it is open
// callers skip it at once (List reports a Gap, Launch the next infra) and a background probe
// (Run) asks the infra again after a cooldown that doubles up to MaxOpenFor, with jitter; an
// answer closes it. Throttling is not an outage: it backs off the same way without marking the
// infra down. Answers that are about the request or the location (no capacity, quota,
// invalid) count as the infra answering.
type Health struct {
	opts HealthOptions

	mu       sync.Mutex
	breakers map[string]*breaker // ZoneKey → breaker ("gcp", "gcp/us-central1-f")
	errs     map[ErrorKey]uint64
	// changed is closed and replaced whenever a breaker closes: the janitor waits on it.
	changed chan struct{}
}

// HealthOptions tune the breakers; zero values are the defaults.
type HealthOptions struct {
	// FailuresToOpen is how many failures in a row open a breaker (default 3); a call cut by
	// its deadline opens it at once.
	FailuresToOpen int
	// OpenFor is the first cooldown before a probe (default 2s); it doubles per failed probe
	// up to MaxOpenFor (default 30s).
	OpenFor, MaxOpenFor time.Duration
	// ThrottleFor is the first back-off after a throttling answer (default 1s), doubling up to
	// MaxThrottleFor (default 60s).
	ThrottleFor, MaxThrottleFor time.Duration
	// Now is the clock; nil is time.Now. Rand draws jitter; nil is a seeded source.
	Now  func() time.Time
	Rand *rand.Rand
	// OnChange, when set, is called (without the lock) when a breaker changes state.
	OnChange func(InfraState)
}

// Error classes, as counted and shown (ferry_infra_errors_total{infra,class}).
const (
	ClassTimeout      = "timeout"
	ClassUnavailable  = "unavailable"
	ClassThrottled    = "throttled"
	ClassUnauthorized = "unauthorized"
	ClassNotFound     = "not_found"
	ClassCapacity     = "capacity"
	ClassQuota        = "quota"
	ClassInvalid      = "invalid"
	ClassOther        = "other"
)

// Breaker states (launcher.InfraState.State).
const (
	StateUp        = launcher.InfraUp
	StateDown      = launcher.InfraDown
	StateThrottled = launcher.InfraThrottled
)

// ErrorKey counts errors of one class on one infra.
type ErrorKey struct {
	Infra, Class string
}

// InfraState is one breaker as `ferry check`, `serve status -v` and /metrics show it.
type InfraState = launcher.InfraState

type breaker struct {
	state                InfraState
	openFor, throttleFor time.Duration
	// probing is set while Run's probe of it is out.
	probing bool
	// answered is how long the infra's last successful List took (infra breakers only).
	answered time.Duration
}

// NewHealth returns breakers with no infra known yet (Register adds them).
func NewHealth(opts HealthOptions) *Health {
	launcher.SetDefault(&opts.FailuresToOpen, 3)
	opts.OpenFor = cmp.Or(opts.OpenFor, 2*time.Second)
	opts.MaxOpenFor = max(cmp.Or(opts.MaxOpenFor, 30*time.Second), opts.OpenFor)
	opts.ThrottleFor = cmp.Or(opts.ThrottleFor, time.Second)
	opts.MaxThrottleFor = max(cmp.Or(opts.MaxThrottleFor, time.Minute), opts.ThrottleFor)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Rand == nil {
		opts.Rand = rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x6665727279))
	}
	return &Health{opts: opts, breakers: map[string]*breaker{}, errs: map[ErrorKey]uint64{}, changed: make(chan struct{})}
}

// Register makes an infra known (up) so that it is shown before anything failed.
func (h *Health) Register(infra string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.breakerLocked(infra, "")
}

func (h *Health) breakerLocked(infra, zone string) *breaker {
	key := launcher.ZoneKey(infra, "", zone)
	b := h.breakers[key]
	if b == nil {
		b = &breaker{state: InfraState{Infra: infra, Zone: zone, State: StateUp, Since: h.opts.Now()}}
		h.breakers[key] = b
	}
	return b
}

// DownError is a call Health did not let through: the infra (or zone) is down or throttled.
type DownError struct {
	State InfraState
}

func (e *DownError) Error() string {
	s := e.State
	switch s.State {
	case StateThrottled:
		return fmt.Sprintf("%s throttled Ferry; next try after %s (%s)", s.Where(), s.RetryAt.Format(time.TimeOnly), s.LastError)
	default:
		return fmt.Sprintf("%s down since %s after %d failure(s): %s", s.Where(), s.Since.Format(time.TimeOnly), s.Failures, s.LastError)
	}
}

// Unwrap is ErrThrottled or ErrUnavailable, as the state says.
func (e *DownError) Unwrap() error {
	if e.State.State == StateThrottled {
		return launcher.ErrThrottled
	}
	return launcher.ErrUnavailable
}

// Allow says whether a call to infra (and to the parts named, a region and a zone of it,
// where not "") may go now: nil, or a *DownError saying why not. Callers never wait on an open
// breaker: Run probes it.
func (h *Health) Allow(infra string, parts ...string) error {
	now := h.opts.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	keys := []string{infra}
	for _, part := range parts {
		if part != "" {
			keys = append(keys, launcher.ZoneKey(infra, "", part))
		}
	}
	for _, key := range keys {
		b := h.breakers[key]
		if b == nil {
			continue
		}
		switch b.state.State {
		case StateDown:
			return &DownError{State: b.state}
		case StateThrottled:
			if now.Before(b.state.RetryAt) {
				return &DownError{State: b.state}
			}
		}
	}
	return nil
}

// Class names what kind of failure err is ("" for success, and for a caller's own cancel).
func Class(err error) string {
	var down *DownError
	switch {
	case err == nil, errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded):
		return ""
	case errors.As(err, &down):
		return "" // not a new answer from the infra
	case errors.Is(err, context.DeadlineExceeded):
		return ClassTimeout
	case errors.Is(err, launcher.ErrThrottled):
		return ClassThrottled
	case errors.Is(err, launcher.ErrUnavailable):
		return ClassUnavailable
	case errors.Is(err, launcher.ErrUnauthorized):
		return ClassUnauthorized
	case errors.Is(err, launcher.ErrNoCapacity), errors.Is(err, launcher.ErrPreempted):
		return ClassCapacity
	case errors.Is(err, launcher.ErrQuota):
		return ClassQuota
	case errors.Is(err, launcher.ErrInvalid), errors.Is(err, launcher.ErrQueued):
		return ClassInvalid
	case errors.Is(err, launcher.ErrNotFound):
		return ClassNotFound
	}
	return ClassOther
}

// down reports whether a failure of class cls counts against the infra's health: the infra
// failed, rather than answering about the request or the location.
func downClass(cls string, zonal bool) bool {
	switch cls {
	case ClassTimeout, ClassUnavailable, ClassUnauthorized, ClassOther:
		return true
	case ClassNotFound:
		return zonal // a zone that does not exist (or is not enabled) is down; an instance is not
	}
	return false
}

// Observe records the outcome of a call to infra (zone "" for the whole infra). A DownError
// (the call never went) and a caller's own cancel record nothing.
func (h *Health) Observe(infra, zone string, err error) {
	cls := Class(err)
	var down *DownError
	if errors.As(err, &down) || (err != nil && cls == "") {
		return
	}
	now := h.opts.Now()
	h.mu.Lock()
	if cls != "" {
		h.errs[ErrorKey{infra, cls}]++
	}
	b := h.breakerLocked(infra, zone)
	before := b.state
	switch {
	case cls == ClassThrottled:
		b.throttleFor = min(max(h.opts.ThrottleFor, 2*b.throttleFor), h.opts.MaxThrottleFor)
		if b.state.State != StateThrottled { // it answered, if only to say "slow down"
			b.state.State, b.state.Since = StateThrottled, now
		}
		b.state.Failures = 0
		b.state.RetryAt = now.Add(h.jitter(b.throttleFor))
		b.state.LastClass, b.state.LastError = cls, err.Error()
	case downClass(cls, zone != ""):
		b.state.Failures++
		b.state.LastClass, b.state.LastError = cls, err.Error()
		if b.state.State != StateDown && (b.state.Failures >= h.opts.FailuresToOpen || cls == ClassTimeout) {
			b.state.State, b.state.Since = StateDown, now
			b.openFor = h.opts.OpenFor
			b.state.RetryAt = now.Add(h.jitter(b.openFor))
		}
	default: // it answered
		b.throttleFor, b.openFor = 0, 0
		b.state.Failures = 0
		if b.state.State != StateUp {
			b.state.State, b.state.Since, b.state.RetryAt = StateUp, now, time.Time{}
		}
	}
	after := b.state
	h.noteLocked(before, after)
	h.mu.Unlock()
	h.notify(before, after)
}

// noteLocked wakes the janitor when a breaker closes.
func (h *Health) noteLocked(before, after InfraState) {
	if before.State != StateUp && after.State == StateUp {
		close(h.changed)
		h.changed = make(chan struct{})
	}
}

func (h *Health) notify(before, after InfraState) {
	if before.State != after.State && h.opts.OnChange != nil {
		h.opts.OnChange(after)
	}
}

// jitter is d ± 20%.
func (h *Health) jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*h.opts.Rand.Float64()))
}

// Recovered returns a channel closed the next time a breaker closes.
func (h *Health) Recovered() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

// States are every breaker, infras first, then their zones, by name.
func (h *Health) States() []InfraState {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]InfraState, 0, len(h.breakers))
	for _, b := range h.breakers {
		out = append(out, b.state)
	}
	slices.SortFunc(out, func(a, b InfraState) int {
		return cmp.Or(strings.Compare(a.Infra, b.Infra), strings.Compare(a.Zone, b.Zone))
	})
	return out
}

// Errors are the failures counted so far, by infra and class.
func (h *Health) Errors() map[ErrorKey]uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[ErrorKey]uint64, len(h.errs))
	for k, v := range h.errs {
		out[k] = v
	}
	return out
}

// State is the breaker of infra (zone "" for the whole infra), up when never seen.
func (h *Health) State(infra, zone string) InfraState {
	h.mu.Lock()
	defer h.mu.Unlock()
	if b := h.breakers[launcher.ZoneKey(infra, "", zone)]; b != nil {
		return b.state
	}
	return InfraState{Infra: infra, Zone: zone, State: StateUp}
}

// dueProbes are the infras with a breaker down whose cooldown has passed and no probe out;
// each is marked probing until probed is called.
func (h *Health) dueProbes(now time.Time) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[string]bool{}
	var out []string
	for _, b := range h.breakers {
		if b.state.State != StateDown || b.probing || now.Before(b.state.RetryAt) || seen[b.state.Infra] {
			continue
		}
		seen[b.state.Infra] = true
		out = append(out, b.state.Infra)
	}
	for _, b := range h.breakers {
		if seen[b.state.Infra] && b.state.State == StateDown {
			b.probing = true
		}
	}
	slices.Sort(out)
	return out
}

// probed ends infra's probes: breakers the probe did not close wait a doubled cooldown.
func (h *Health) probed(infra string) {
	now := h.opts.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, b := range h.breakers {
		if b.state.Infra != infra || !b.probing {
			continue
		}
		b.probing = false
		if b.state.State == StateDown && !now.Before(b.state.RetryAt) {
			b.openFor = min(max(h.opts.OpenFor, 2*b.openFor), h.opts.MaxOpenFor)
			b.state.RetryAt = now.Add(h.jitter(b.openFor))
		}
	}
}

// listed records how long a successful List of infra took, for listWait.
func (h *Health) listed(infra string, took time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.breakerLocked(infra, "").answered = took
}

// listWait is how long a List waits for infra before reporting it as a gap (its call goes on
// to its deadline, and its outcome still counts): straggle, or three times what its last
// answer took if that is longer, within limit.
func (h *Health) listWait(infra string, straggle, limit time.Duration) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	d := straggle
	if b := h.breakers[infra]; b != nil {
		d = max(d, 3*b.answered)
	}
	return min(d, limit)
}

// Adopt takes the breakers another process keeps (the controller's, for the CLI's plan) as
// its own: an infra the controller finds down is not asked again from here, and the plan says
// why. States that are up change nothing.
func (h *Health) Adopt(states []InfraState) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range states {
		if s.State == StateUp {
			continue
		}
		b := h.breakerLocked(s.Infra, s.Zone)
		b.state = s
		if b.state.RetryAt.IsZero() || b.state.RetryAt.Before(h.opts.Now()) {
			b.state.RetryAt = h.opts.Now().Add(h.opts.OpenFor)
		}
		b.openFor = h.opts.OpenFor
	}
}
