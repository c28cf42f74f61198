package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/ferryserve/ferry/launcher"
)

// When the cluster fails. An API server that is down for an upgrade, overloaded or unreachable
// must cost the rest of Ferry nothing (docs/placement.md, "When an infra fails"):
//
//   - Every error of a call to the API server is classified (classify): 429 wraps
//     launcher.ErrThrottled; 5xx (ServiceUnavailable, InternalError, ServerTimeout, Timeout)
//     and a call that never got an answer (refused or cut connection, no answer within its
//     deadline) wrap launcher.ErrUnavailable, so the provisioner's breaker opens and callers
//     go elsewhere instead of waiting. Unauthorized and Forbidden stay ErrUnauthorized.
//   - Every request has a deadline, Options.RequestTimeout (rest.Config.Timeout on the
//     client), so a hung API server is cut per request even inside a long Launch. Watches and
//     followed logs stream for minutes and go through a second client without it; a watch
//     request must still be answered (headers) within RequestTimeout, and HTTP/2's pings cut
//     a connection that stops answering under an open one.
//   - List reads the watch cache. While the watch fails the cache is stale: a pod deleted or
//     preempted meanwhile is still listed, and one created is missing. A watch that fails for
//     a moment is routine (they restart every few minutes), so once it has failed for longer
//     than Options.WatchFailureThreshold, List returns the cached pods with a whole-infra
//     launcher.Gap (launcher.PartialList) that says since when, until the watch works again:
//     callers then treat the cluster's pods as unknown — never as gone, and never as current.
//     A launch waiting for its pod likewise fails with ErrUnavailable once its own watch has
//     failed that long, rather than call the outage a lack of capacity.

// Defaults for Options.
const (
	// DefaultRequestTimeout bounds one request to the API server.
	DefaultRequestTimeout = 30 * time.Second
	// DefaultWatchFailureThreshold is how long a watch may fail before List reports the
	// cluster as a gap.
	DefaultWatchFailureThreshold = 10 * time.Second
)

// classify maps API errors onto the launcher's typed errors, which decide failover.
func (p *Provider) classify(err error, what string) error {
	var kind error
	switch {
	case apierrors.IsUnauthorized(err):
		kind = launcher.ErrUnauthorized
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"):
		kind = launcher.ErrQuota
	case apierrors.IsForbidden(err):
		kind = launcher.ErrUnauthorized
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		kind = launcher.ErrInvalid
	default:
		if fault := infraFault(err); fault != nil {
			// The API's own error stays in the chain (apierrors.Is… and
			// context.DeadlineExceeded still find it).
			return fmt.Errorf("%w: %s: %s: %w", fault, p.infra, what, err)
		}
		return fmt.Errorf("%s: %s: %w", p.infra, what, err)
	}
	return fmt.Errorf("%w: %s: %s: %v", kind, p.infra, what, err)
}

// infraFault is launcher.ErrThrottled or launcher.ErrUnavailable when err says the API server
// throttled or failed rather than refused the request; nil otherwise.
func infraFault(err error) error {
	var status apierrors.APIStatus
	switch {
	case err == nil, errors.Is(err, context.Canceled):
		return nil // the caller gave up: not the cluster's fault
	case errors.Is(err, launcher.ErrThrottled), errors.Is(err, launcher.ErrUnavailable):
		return nil // classified already
	case apierrors.IsTooManyRequests(err):
		return launcher.ErrThrottled
	case apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err),
		apierrors.IsServerTimeout(err), apierrors.IsTimeout(err):
		return launcher.ErrUnavailable
	case errors.As(err, &status):
		if code := int(status.Status().Code); code >= 500 {
			return launcher.ErrUnavailable
		} else if fault := launcher.ClassifyHTTPStatus(code); fault != nil {
			return fault
		}
		return nil
	}
	if errors.Is(launcher.ClassifyTransport(err), launcher.ErrUnavailable) {
		return launcher.ErrUnavailable
	}
	// client-go returns the HTTP client's *url.Error for any request that got no answer (an
	// HTTP/2 connection lost, a TLS handshake cut); an answer always becomes an APIStatus.
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return launcher.ErrUnavailable
	}
	return nil
}

// watchHealth tracks whether a watch (an informer's, or a launch's wait for its pod) reaches
// the API server: each list and watch request it makes reports its outcome (observe). A run
// of failures counts from its first; it is stale once it has lasted threshold, and ends with
// the first request that succeeds.
type watchHealth struct {
	what      string // "pods", "nodes", "pod NAME"
	threshold time.Duration
	// onStale is called (without the lock) when a run of failures reaches threshold, and
	// onRecover when a stale run ends. Either may be nil.
	onStale   func(since time.Time, err error)
	onRecover func(since time.Time)

	mu      sync.Mutex
	since   time.Time // start of the current run of failures; zero while the watch works
	lastErr error
	stale   bool
	timer   *time.Timer
	closed  bool
}

func newWatchHealth(what string, threshold time.Duration) *watchHealth {
	return &watchHealth{what: what, threshold: threshold}
}

// observe records the outcome of one list or watch request.
func (h *watchHealth) observe(err error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	if err != nil {
		h.lastErr = err
		if h.since.IsZero() {
			since := time.Now()
			h.since = since
			h.timer = time.AfterFunc(h.threshold, func() { h.expire(since) })
		}
		h.mu.Unlock()
		return
	}
	since, wasStale := h.since, h.stale
	if h.timer != nil {
		h.timer.Stop()
	}
	h.since, h.lastErr, h.stale, h.timer = time.Time{}, nil, false, nil
	h.mu.Unlock()
	if wasStale && h.onRecover != nil {
		h.onRecover(since)
	}
}

// expire marks the run of failures that began at since stale, if it still goes on.
func (h *watchHealth) expire(since time.Time) {
	h.mu.Lock()
	if h.closed || !h.since.Equal(since) {
		h.mu.Unlock()
		return
	}
	h.stale = true
	err := h.lastErr
	h.mu.Unlock()
	if h.onStale != nil {
		h.onStale(since, err)
	}
}

// failing reports the current run of failures: since when (zero when the watch works), the
// last error, and whether it has lasted threshold.
func (h *watchHealth) failing() (since time.Time, err error, stale bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	stale = !h.since.IsZero() && time.Since(h.since) >= h.threshold
	return h.since, h.lastErr, stale
}

// staleErr is the error a stale watch makes of a call that relies on its cache; nil while the
// watch works or has failed for less than threshold.
func (h *watchHealth) staleErr(infra string) error {
	if h == nil {
		return nil
	}
	since, err, stale := h.failing()
	if !stale {
		return nil
	}
	return fmt.Errorf("%w: %s: the watch of %s has failed since %s (%s ago): %v; what it last saw may be stale",
		launcher.ErrUnavailable, infra, h.what, since.Format(time.RFC3339), time.Since(since).Round(time.Second), err)
}

// close stops the timer; observe and expire do nothing afterwards.
func (h *watchHealth) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	if h.timer != nil {
		h.timer.Stop()
	}
}

// observedListWatch is a ListWatch whose every request reports to h. A request cancelled by
// the watch's own stop reports nothing. A watch request must be answered within timeout: it
// goes through the client without a whole-request deadline, since it then streams.
func observedListWatch(h *watchHealth, timeout time.Duration,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	start func(context.Context, metav1.ListOptions) (watch.Interface, error),
) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			obj, err := list(ctx, o)
			if ctx.Err() == nil {
				h.observe(err)
			}
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := watchWithin(ctx, timeout, o, start)
			if ctx.Err() == nil {
				h.observe(err)
			}
			return w, err
		},
	}
}

// watchWithin starts a watch that must be answered within timeout, and lives on afterwards
// until stopped or ctx ends.
func watchWithin(ctx context.Context, timeout time.Duration, o metav1.ListOptions,
	start func(context.Context, metav1.ListOptions) (watch.Interface, error),
) (watch.Interface, error) {
	wctx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(timeout, cancel)
	w, err := start(wctx, o)
	if !timer.Stop() && ctx.Err() == nil {
		// Cut by the timer: whatever start returned, the API server did not answer in time.
		if w != nil {
			w.Stop()
		}
		cancel()
		return nil, fmt.Errorf("%w: a watch request got no answer within %v: %w", launcher.ErrUnavailable, timeout, context.DeadlineExceeded)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	return &stopCancels{Interface: w, cancel: cancel}, nil
}

// stopCancels is a watch whose Stop also ends the context it was started with.
type stopCancels struct {
	watch.Interface
	cancel context.CancelFunc
}

func (w *stopCancels) Stop() {
	w.Interface.Stop()
	w.cancel()
}

// watchErrorHandler takes the place of client-go's default, which logs every failed list of a
// reflector: the health it feeds logs once when the failure becomes an outage and once when
// it ends. Expired resource versions (410) are routine and not failures.
func watchErrorHandler(h *watchHealth, log *zap.Logger) cache.WatchErrorHandlerWithContext {
	return func(ctx context.Context, _ *cache.Reflector, err error) {
		if ctx.Err() != nil || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return
		}
		h.observe(err)
		log.Debug("watch failed; retrying", zap.String("watch", h.what), zap.Error(err))
	}
}
