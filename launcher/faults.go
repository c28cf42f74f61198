package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"
)

// When an infra fails. A multi-cloud controller meets partial outages every week: a zone that
// errors, an API that throttles, an endpoint that hangs, credentials that expire. Two typed
// errors say so, and a List that could read only part of an infra says which part it could not
// read, so that callers treat what is there as unknown — never as gone, and never as a reason
// to wait for everyone (docs/placement.md, "When an infra fails").

// Typed errors about the infra rather than the request or the location.
var (
	// ErrThrottled: the infra's API asked Ferry to slow down (EC2 RequestLimitExceeded,
	// HTTP 429, GCP rateLimitExceeded). Callers back off with jitter and try again.
	ErrThrottled = errors.New("throttled")
	// ErrUnavailable: the infra's API could not be reached or did not answer properly
	// (HTTP 5xx, connection refused or reset, no answer before the call's deadline). What the
	// infra holds is unknown until it answers again.
	ErrUnavailable = errors.New("infra unavailable")
)

// IsInfraFault reports whether err says the infra itself failed (unavailable, throttled, or
// refusing Ferry's credentials) rather than the request or the location.
func IsInfraFault(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrThrottled) || errors.Is(err, ErrUnauthorized)
}

// ClassifyTransport wraps an error that never reached the infra's API as ErrUnavailable (a
// refused or reset connection, a DNS failure, a deadline that cut the call), keeping it in the
// chain; other errors are returned unchanged. Providers call it for errors their API's own
// codes do not classify. A call cancelled by its caller (context.Canceled) is not the infra's
// fault and is left alone.
func ClassifyTransport(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) || errors.Is(err, context.Canceled) {
		return err
	}
	var nerr net.Error
	var operr *net.OpError
	switch {
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		errors.As(err, &operr), errors.As(err, &nerr) && nerr.Timeout():
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// ClassifyHTTPStatus is the infra-fault error an HTTP status means: ErrThrottled for 429,
// ErrUnavailable for 500, 502, 503 and 504; nil for any other (the API's own codes decide).
func ClassifyHTTPStatus(code int) error {
	switch code {
	case http.StatusTooManyRequests:
		return ErrThrottled
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return ErrUnavailable
	}
	return nil
}

// Gap is a part of an infra a List could not read: the whole infra (Region and Zone empty), a
// region, or a zone. What it holds is unknown: an instance missing from the list may still run
// there, and one listed may be stale.
type Gap struct {
	Infra  string `json:"infra"`
	Region string `json:"region,omitempty"`
	Zone   string `json:"zone,omitempty"`
	// Err says why it could not be read.
	Err error `json:"-"`
}

// Covers reports whether an instance at infra, region and zone lies in the gap. An empty
// region or zone on the instance's side (a record that kept only its zone) is not told apart:
// when in doubt, the instance is unknown rather than gone.
func (g Gap) Covers(infra, region, zone string) bool {
	if g.Infra != infra {
		return false
	}
	if g.Region != "" && region != "" && g.Region != region {
		return false
	}
	return g.Zone == "" || zone == "" || g.Zone == zone
}

// Where names the gap: "gcp", "aws/us-east-1", "gcp/us-central1-f".
func (g Gap) Where() string {
	switch {
	case g.Zone != "":
		return g.Infra + "/" + g.Zone
	case g.Region != "":
		return g.Infra + "/" + g.Region
	}
	return g.Infra
}

func (g Gap) String() string {
	if g.Err == nil {
		return g.Where()
	}
	return g.Where() + ": " + g.Err.Error()
}

// PartialListError is what a List returns, together with the instances it could read, when
// parts of the infras asked could not be read.
type PartialListError struct {
	Gaps []Gap
}

func (e *PartialListError) Error() string {
	parts := make([]string, len(e.Gaps))
	for i, g := range e.Gaps {
		parts[i] = g.String()
	}
	return "could not list " + strings.Join(parts, "; ")
}

// Unwrap gives each gap's error, so that errors.Is finds ErrUnavailable and the like.
func (e *PartialListError) Unwrap() []error {
	out := make([]error, 0, len(e.Gaps))
	for _, g := range e.Gaps {
		if g.Err != nil {
			out = append(out, g.Err)
		}
	}
	return out
}

// Partial splits a List's error: the gaps and true when the list is partial (the instances
// returned with it are good outside the gaps), false for any other error (the list failed
// whole and its instances are worth nothing). A nil error is a complete list: no gaps, true.
func Partial(err error) ([]Gap, bool) {
	if err == nil {
		return nil, true
	}
	var pe *PartialListError
	if errors.As(err, &pe) {
		return pe.Gaps, true
	}
	return nil, false
}

// InGaps returns the first gap that covers an instance at infra, region and zone.
func InGaps(gaps []Gap, infra, region, zone string) (Gap, bool) {
	for _, g := range gaps {
		if g.Covers(infra, region, zone) {
			return g, true
		}
	}
	return Gap{}, false
}

// PartialList builds the error for a List that could not read gaps: nil when there are none.
// Gaps with a nil Err get ErrUnavailable.
func PartialList(gaps []Gap) error {
	if len(gaps) == 0 {
		return nil
	}
	for i := range gaps {
		if gaps[i].Err == nil {
			gaps[i].Err = ErrUnavailable
		}
	}
	return &PartialListError{Gaps: gaps}
}

// Health states of an infra, or of one of its zones (InfraState.State).
const (
	InfraUp        = "up"
	InfraDown      = "down"
	InfraThrottled = "throttled"
)

// InfraState is the provisioner's view of one infra, or of a zone or region of one: whether
// calls to it go, since when, and the last failure. `ferry check`, `serve status -v`,
// `jobs queue` and /metrics show it.
type InfraState struct {
	Infra string `json:"infra"`
	// Zone is the zone or region the state is for; "" for the whole infra.
	Zone  string `json:"zone,omitempty"`
	State string `json:"state"`
	// Since is when it entered State; RetryAt when a down or throttled one is tried again.
	Since   time.Time `json:"since,omitzero"`
	RetryAt time.Time `json:"retry_at,omitzero"`
	// Failures in a row, and the last failure's class and message.
	Failures  int    `json:"failures,omitempty"`
	LastClass string `json:"last_class,omitempty"`
	LastError string `json:"last_error,omitempty"`
}

// Where names it: "gcp" or "gcp/us-central1-f".
func (s InfraState) Where() string { return ZoneKey(s.Infra, "", s.Zone) }

// Skipping parts that are known to be down. The provisioner passes its breakers to a List
// through the List's context; a provider that lists part by part (GCP's zones, EC2's regions)
// asks Skip before each part and reports a part that is down as a gap at once, instead of
// waiting on it again until its deadline.

type skipKey struct{}

// WithSkip returns ctx carrying skip, which says why a part of the infra (a region, a zone in
// it) is not to be asked now, or nil.
func WithSkip(ctx context.Context, skip func(region, zone string) error) context.Context {
	return context.WithValue(ctx, skipKey{}, skip)
}

// Skip is why the part at region and zone is not to be asked now (nil: ask it), as the
// context's WithSkip says; nil without one.
func Skip(ctx context.Context, region, zone string) error {
	if f, ok := ctx.Value(skipKey{}).(func(region, zone string) error); ok {
		return f(region, zone)
	}
	return nil
}

// Locator is an optional Provider capability: where an instance id lies (its region and zone,
// as far as the id tells), so that a call about that instance that fails is charged to that
// part of the infra, not to all of it.
type Locator interface {
	Locate(id string) (region, zone string)
}
