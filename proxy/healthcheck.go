package proxy

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/policy"
)

// Health checking: the proxy's own, fast answer to "is this replica's process answering at
// all?", independent of the controller.
//
// The controller's readiness probe decides membership (READY or not), with the task's probe
// and its timeout (15 s by default, because a cold vLLM can be slow) every few seconds. That
// is too slow for a replica that hangs: a process that is stopped, deadlocked or swapping
// still has its kernel accept connections, so requests sent to it neither fail nor answer, and
// each one waits out the idle timeout (minutes). Each Service therefore checks every replica of
// its set itself (one goroutine and one keep-alive connection per replica, like the scraper):
// GET HealthCheck.Path every Interval, bounded by Timeout.
//
// A check fails when nothing answers within Timeout (or the connection is refused or broken)
// and, during the check, no response byte arrived on any of the proxy's own connections to the
// replica either. Any HTTP status is an answer: readiness stays the controller's business (a
// 503 from /health during a load spike, or a 404 from a server without /health, never ejects),
// and a replica that is streaming tokens is alive however slow its health endpoint is. So
// only a replica that is silent on every connection for a whole Timeout is ejected; one that
// is slow but progressing (long time to first token under load) is not.
//
// Ejection takes the replica out of the set the picker chooses from (snapshot.pick) and closes
// every connection to it: requests still waiting for its response header fail with a broken
// connection and are retried on another replica (nothing has reached their client yet);
// streams already under way end with the SSE error event, as for any replica failure (Envoy's
// close_connections_on_host_health_failure). The replica is put back after its first answered
// check. The last replica in rotation is never ejected: with every replica failing, a request
// that may still be answered beats a certain 503.
//
// Checks never touch the request path: the pick set is part of the immutable snapshot,
// rebuilt only when a replica is ejected or returns, and the data plane pays one atomic add per
// upstream read (replicaHealth.progress).

// Health-check defaults.
const (
	// DefaultHealthCheckPath is what the proxy GETs. vLLM, SGLang and TGI answer it without
	// waiting for the engine, even with a full batch; since any status counts, a server
	// without it (404) is checked just as well.
	DefaultHealthCheckPath = "/health"
	// DefaultHealthCheckInterval and DefaultHealthCheckTimeout bound how long a hung replica
	// stays in rotation: at most Interval + Timeout = 1.5 s (a hang that begins just after an
	// answered check is found by the next check, Interval later, which fails Timeout after it
	// starts). Two small GETs per second per replica and proxy cost a replica little next to
	// its inference work.
	DefaultHealthCheckInterval = 500 * time.Millisecond
	// DefaultHealthCheckTimeout is a second of complete silence: no answer to a request that
	// needs no GPU, and not one byte on any of the replica's connections. A replica under
	// load that takes seconds to a first token still answers /health in milliseconds and
	// streams the tokens of the requests it is decoding.
	DefaultHealthCheckTimeout = time.Second
	// maxHealthBody bounds the body read from a health check; larger ones still count as an
	// answer.
	maxHealthBody = 64 << 10
	// healthLogEvery rate-limits the line about a failing replica that cannot be ejected
	// because it is the last one in rotation.
	healthLogEvery = 30 * time.Second
)

// HealthCheck configures a Service's checks of its replicas (see above). The zero value
// selects the defaults.
type HealthCheck struct {
	// Path is requested with GET; default DefaultHealthCheckPath.
	Path string
	// Interval is the time between the starts of two checks of one replica; default
	// DefaultHealthCheckInterval. Negative disables health checking: replicas then leave
	// rotation only when SetBackends removes them.
	Interval time.Duration
	// Timeout bounds one check, connecting included; default DefaultHealthCheckTimeout. It
	// must be longer than the health endpoint's slowest answer under load.
	Timeout time.Duration
}

// HealthCheckFor is a HealthCheck from a service's YAML (service.health_check): seconds as
// numbers, zero keeping a default, disabled turning the check off.
func HealthCheckFor(path string, intervalSeconds, timeoutSeconds float64, disabled bool) HealthCheck {
	h := HealthCheck{Path: path, Interval: secondsOf(intervalSeconds), Timeout: secondsOf(timeoutSeconds)}
	if disabled {
		h.Interval = -1
	}
	return h
}

func secondsOf(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func (h HealthCheck) withDefaults() HealthCheck {
	if h.Path == "" {
		h.Path = DefaultHealthCheckPath
	}
	if h.Interval == 0 {
		h.Interval = DefaultHealthCheckInterval
	}
	if h.Timeout == 0 {
		h.Timeout = DefaultHealthCheckTimeout
	}
	return h
}

func (h HealthCheck) enabled() bool { return h.Interval > 0 }

func (h HealthCheck) validate() []error {
	var errs []error
	if h.Path == "" || h.Path[0] != '/' {
		errs = append(errs, fmt.Errorf("health check path: %q must start with /", h.Path))
	}
	if h.Timeout < 0 {
		errs = append(errs, fmt.Errorf("health check timeout: %v must not be negative", h.Timeout))
	}
	return errs
}

// healthChecker runs one check goroutine per replica address of a Service's set. Results go
// to the Service (healthResult), which owns the ejection state.
type healthChecker struct {
	cfg      HealthCheck
	dial     func(addr string) (net.Conn, error)
	onResult func(c *hostClient, err error)
	series   *healthSeries // nil without Metrics

	// ejected counts this Service's ejected replicas; guarded by the Service's mu.
	ejected int

	active atomic.Int64 // running goroutines, for tests
	wg     sync.WaitGroup

	mu      sync.Mutex
	targets map[*hostClient]*healthTarget
	closed  bool
}

// healthTarget is one replica address's checking state, owned by its goroutine but for stop.
type healthTarget struct {
	client *hostClient
	hc     *fasthttp.HostClient
	req    fasthttp.Request
	resp   fasthttp.Response
	stop   chan struct{}
}

func newHealthChecker(cfg HealthCheck, dial func(string) (net.Conn, error), onResult func(*hostClient, error), series *healthSeries) *healthChecker {
	return &healthChecker{cfg: cfg, dial: dial, onResult: onResult, series: series, targets: make(map[*hostClient]*healthTarget)}
}

// update checks exactly clients: it starts a goroutine for each new one and stops those of
// clients no longer listed. After close it does nothing.
func (h *healthChecker) update(clients []*hostClient) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	for _, c := range clients {
		if _, ok := h.targets[c]; ok {
			continue
		}
		t := h.newTarget(c)
		h.targets[c] = t
		h.wg.Add(1)
		h.active.Add(1)
		go h.run(t)
	}
	for c, t := range h.targets {
		if !slices.Contains(clients, c) {
			close(t.stop)
			delete(h.targets, c)
		}
	}
}

// close stops every goroutine and waits for them: at most one check's Timeout. The caller
// must not hold the Service's mu, which the goroutines take to report.
func (h *healthChecker) close() {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		for c, t := range h.targets {
			close(t.stop)
			delete(h.targets, c)
		}
	}
	h.mu.Unlock()
	h.wg.Wait()
}

func (h *healthChecker) newTarget(c *hostClient) *healthTarget {
	dial, timeout := h.dial, h.cfg.Timeout
	t := &healthTarget{
		client: c,
		stop:   make(chan struct{}),
		hc: &fasthttp.HostClient{
			Addr: c.addr,
			// The check's deadline covers connecting too: a host that drops SYNs must fail the
			// check in Timeout, not in the data plane's longer dial timeout.
			DialTimeout: func(addr string, _ time.Duration) (net.Conn, error) {
				return dialWithin(dial, addr, timeout)
			},
			MaxConns:                  1,
			MaxIdleConnDuration:       upstreamMaxIdleConnDuration,
			MaxResponseBodySize:       maxHealthBody,
			MaxIdemponentCallAttempts: 1,
			RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
			Name:                      "ferry-health-check",
			SecureErrorLogMessage:     true,
		},
	}
	t.req.Header.SetMethod(fasthttp.MethodGet)
	t.req.SetRequestURI("http://" + c.addr + h.cfg.Path)
	return t
}

// dialWithin is dial bounded by timeout; a connection that arrives later is closed.
func dialWithin(dial func(string) (net.Conn, error), addr string, timeout time.Duration) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := dial(addr)
		done <- result{conn, err}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case r := <-done:
		return r.conn, r.err
	case <-timer.C:
		go func() {
			if r := <-done; r.conn != nil {
				_ = r.conn.Close()
			}
		}()
		return nil, fmt.Errorf("dial %s: no connection within %v", addr, timeout)
	}
}

func (h *healthChecker) run(t *healthTarget) {
	// Done last, after the count drops, so that close never returns with one still counted.
	defer h.wg.Done()
	defer h.active.Add(-1)
	defer t.hc.CloseIdleConnections()
	ticker := time.NewTicker(h.cfg.Interval)
	defer ticker.Stop()
	for {
		err := h.check(t)
		select {
		case <-t.stop:
			return
		default:
		}
		h.onResult(t.client, err)
		select {
		case <-t.stop:
			return
		case <-ticker.C:
			// A check slower than the interval drops ticks instead of queueing them.
		}
	}
}

// check runs one check: nil when the replica answered, or when it did not but sent response
// bytes on another connection meanwhile.
func (h *healthChecker) check(t *healthTarget) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("panic in health check: %v", v)
		}
	}()
	before := t.client.health.progress.Load()
	t.resp.Reset()
	err = t.hc.DoTimeout(&t.req, &t.resp, h.cfg.Timeout)
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		err = nil // it answered
	}
	if err != nil && t.client.health.progress.Load() != before {
		err = nil // silent on /health but busy sending responses: slow, not hung
	}
	return err
}

// updateHealthLocked is SetBackends' part in health checking, under s.mu, before next is
// published: it carries ejections over to next, sets next's pick set, and gives the checker
// next's replicas. A replica that SetBackends removes stops counting as ejected.
func (s *Service) updateHealthLocked(next *snapshot) {
	if !s.cfg.HealthCheck.enabled() {
		next.pick, next.pickCaps = next.replicas, next.caps
		return
	}
	if s.health == nil {
		var series *healthSeries
		if m := s.cfg.Metrics; m != nil {
			series = m.health.acquire(s.cfg.Name)
		}
		s.health = newHealthChecker(s.cfg.HealthCheck, s.dial, s.healthResult, series)
	}
	h := s.health
	for _, c := range s.snap.Load().clients {
		if c.health.ejected && !slices.Contains(next.clients, c) {
			c.health.ejected = false
			h.setEjected(-1)
		}
	}
	// Never only ejected replicas in rotation: those left after a removal come back.
	if !slices.ContainsFunc(next.clients, func(c *hostClient) bool { return !c.health.ejected }) {
		for i, c := range next.clients {
			if c.health.ejected {
				c.health.ejected = false
				h.setEjected(-1)
				s.log.Warn("replica back in rotation although its health checks fail: the others left the set",
					zap.Int("replica_id", next.replicas[i].ID), zap.String("addr", c.addr))
			}
		}
	}
	next.pick, next.pickCaps = pickSet(next)
	h.update(next.clients)
}

// pickSet is the replicas of snap that are not ejected, and their learned caps; the same
// slices when none is.
func pickSet(snap *snapshot) ([]*policy.Replica, []*learnedCap) {
	n := 0
	for _, c := range snap.clients {
		if !c.health.ejected {
			n++
		}
	}
	if n == len(snap.clients) {
		return snap.replicas, snap.caps
	}
	pick := make([]*policy.Replica, 0, n)
	caps := make([]*learnedCap, 0, n)
	for i, c := range snap.clients {
		if !c.health.ejected {
			pick = append(pick, snap.replicas[i])
			caps = append(caps, snap.caps[i])
		}
	}
	return pick, caps
}

// setEjected moves the count of ejected replicas by delta. Called under the Service's mu.
func (h *healthChecker) setEjected(delta int) {
	h.ejected += delta
	if h.series != nil {
		h.series.ejected.Add(int64(delta))
		if delta > 0 {
			h.series.ejections.Add(uint64(delta))
		}
	}
}

// healthResult applies one check's result to the replica at c: eject it on a failure (unless
// it is the last one in rotation), put it back on an answer.
func (s *Service) healthResult(c *hostClient, checkErr error) {
	s.mu.Lock()
	h := s.health
	cur := s.snap.Load()
	i := slices.Index(cur.clients, c)
	if h == nil || i < 0 {
		s.mu.Unlock()
		return // removed from the set meanwhile
	}
	replica := cur.replicas[i]
	abort := false
	switch {
	case checkErr == nil && c.health.ejected:
		c.health.ejected = false
		h.setEjected(-1)
		s.publishPickLocked(cur)
		s.log.Info("replica back in rotation: it answers health checks again",
			zap.Int("replica_id", replica.ID), zap.String("addr", c.addr), zap.Duration("ejected_for", time.Since(c.health.ejectedAt)))
	case checkErr != nil && !c.health.ejected:
		others := 0
		for _, o := range cur.clients {
			if o != c && !o.health.ejected {
				others++
			}
		}
		if others == 0 {
			if now := time.Now(); now.Sub(c.health.keptLogged) >= healthLogEvery {
				c.health.keptLogged = now
				s.log.Warn("replica fails health checks but stays in rotation: it is the last one",
					zap.Int("replica_id", replica.ID), zap.String("addr", c.addr), zap.Error(checkErr))
			}
			break
		}
		c.health.ejected, c.health.ejectedAt = true, time.Now()
		h.setEjected(1)
		s.publishPickLocked(cur)
		abort = true
	}
	s.mu.Unlock()
	if abort {
		// Requests waiting on the replica get an error now, not after the idle timeout.
		c.hc.CloseIdleConnections()
		closed := c.health.abortConns()
		s.log.Warn("replica ejected: its health check failed and it sent no response bytes meanwhile",
			zap.Int("replica_id", replica.ID), zap.String("addr", c.addr), zap.String("path", s.cfg.HealthCheck.Path),
			zap.Duration("timeout", s.cfg.HealthCheck.Timeout), zap.Int("connections_closed", closed), zap.Error(checkErr))
	}
}

// publishPickLocked publishes cur again with a pick set that reflects the ejections now. The
// snapshot's members, clients and ready channel are shared: only the pick set differs.
func (s *Service) publishPickLocked(cur *snapshot) {
	next := *cur
	next.pick, next.pickCaps = pickSet(cur)
	s.snap.Store(&next)
	if s.slots != nil {
		s.slots.grant(s) // a replica back from ejection has free slots
	}
}

// stopHealthChecks ends health checking for good (Shutdown): the goroutines stop and the
// service's health series are released.
func (s *Service) stopHealthChecks() {
	s.mu.Lock()
	h := s.health
	s.mu.Unlock()
	if h == nil {
		return
	}
	h.close()
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.series != nil {
		h.series.ejected.Add(-int64(h.ejected))
		h.ejected = 0
		h.series.release()
		h.series = nil
	}
}

// Ejected returns the ids of the replicas the health checks have taken out of rotation, in
// the order SetBackends received them.
func (s *Service) Ejected() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []int
	cur := s.snap.Load()
	for i, c := range cur.clients {
		if c.health.ejected {
			ids = append(ids, cur.replicas[i].ID)
		}
	}
	return ids
}
