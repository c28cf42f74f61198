package proxy

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// A Service's policy, API keys and limits are fixed when it is made: the request path reads
// them without locks. A Handover changes them without refusing a connection or cutting a
// request: it owns the real listener and hands each accepted connection to the current Service
// through a listener of that Service's own. Swap makes a new Service current; the old one
// answers the requests already on its connections with "Connection: close", so keep-alive
// clients reconnect (to the new one), and is then shut down gracefully, its streams finishing.

// handoverIdleGrace is how long a retired Service keeps connections on which no request came:
// a client may be about to send one, and a connection closed under a request fails it. After
// the grace, Shutdown closes them, as any server ends idle keep-alive connections.
const handoverIdleGrace = 5 * time.Second

// Handover serves one listener with a succession of Services; see Swap. Its methods are safe
// for concurrent use.
type Handover struct {
	ln  net.Listener
	log *zap.Logger

	mu       sync.Mutex
	cur      *handoff
	draining []*handoff
	// retired counts the arrivals of Services that finished draining, so Arrivals never goes
	// down.
	retired uint64
	closed  bool
	// stopping is closed by Shutdown: retired Services skip the rest of their idle grace.
	stopping chan struct{}
	drains   sync.WaitGroup
	// closing is set by CloseConnections: the proxy is draining before it stops.
	closing atomic.Bool
}

// handoff is one Service and the listener the Handover feeds it through.
type handoff struct {
	svc *Service
	ln  *handoffListener
}

// NewHandover returns a Handover that will serve ln with first; nothing is accepted until
// Serve. first must not be served elsewhere. A nil log discards the Handover's messages.
func NewHandover(ln net.Listener, first *Service, log *zap.Logger) *Handover {
	if log == nil {
		log = zap.NewNop()
	}
	h := &Handover{ln: newRetryingListener(ln, log), log: log, stopping: make(chan struct{})}
	h.cur = h.start(first)
	return h
}

// start serves svc on a new handoff listener.
func (h *Handover) start(svc *Service) *handoff {
	hl := newHandoffListener(h.ln.Addr())
	go func() {
		if err := svc.Serve(hl); err != nil && !errors.Is(err, ErrClosed) {
			h.log.Error("proxy stopped serving", zap.String("service", svc.cfg.Name), zap.Error(err))
		}
		// Whatever ended Serve, no connection may wait on a listener nobody accepts from.
		_ = hl.Close()
	}()
	return &handoff{svc: svc, ln: hl}
}

// Serve accepts connections on the listener and hands each to the current Service until
// Shutdown, then returns nil. Temporary accept errors (out of file descriptors, say) are waited
// out (accept.go); it returns the listener's error only if accepting fails otherwise.
func (h *Handover) Serve() error {
	for {
		conn, err := h.ln.Accept()
		if err != nil {
			h.mu.Lock()
			closed := h.closed
			h.mu.Unlock()
			if closed {
				return nil
			}
			return err
		}
		h.dispatch(conn)
	}
}

// dispatch hands conn to the current Service, or to its successor when a Swap retires it
// before it took the connection.
func (h *Handover) dispatch(conn net.Conn) {
	for {
		h.mu.Lock()
		cur, closed := h.cur, h.closed
		h.mu.Unlock()
		if closed {
			_ = conn.Close()
			return
		}
		if cur.ln.deliver(conn) {
			return
		}
	}
}

// Current returns the Service new connections go to.
func (h *Handover) Current() *Service {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur.svc
}

// Swap makes next the Service that new connections go to and retires the current one: its
// connections get "Connection: close" on their next response, connections that stay idle are
// closed after a grace of a few seconds, and it is shut down (Service.Shutdown) once they are
// gone, within drainTimeout of the swap. Until then Busy, InFlight and friends count both.
// next should already have the backends; SetBackends reaches the retiring Service as well.
// next is the same service's new configuration, so it answers to the model ids the current one
// knew until its replicas have told it theirs (Service.KeepModels): a gateway routing by model
// would otherwise answer them 404 in between.
func (h *Handover) Swap(next *Service, drainTimeout time.Duration) {
	if h.closing.Load() {
		next.CloseConnections()
	}
	next.KeepModels(h.Current())
	nh := h.start(next)
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		_ = next.Shutdown(context.Background())
		return
	}
	old := h.cur
	h.cur = nh
	h.draining = append(h.draining, old)
	h.drains.Add(1)
	h.mu.Unlock()
	go h.retire(old, drainTimeout)
}

// CloseConnections makes every response of every Service served, and of those swapped in later,
// close its connection (Service.CloseConnections).
func (h *Handover) CloseConnections() {
	h.closing.Store(true)
	for _, s := range h.services() {
		s.CloseConnections()
	}
}

// retire drains a Service that Swap replaced.
func (h *Handover) retire(old *handoff, drainTimeout time.Duration) {
	defer h.drains.Done()
	deadline := time.Now().Add(drainTimeout)
	old.svc.closeConns.Store(true)
	_ = old.ln.Close()
	graceEnd := time.Now().Add(min(handoverIdleGrace, drainTimeout))
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	// Shutdown answers requests held for a replica with 503 at once, so they are waited for
	// too (a replica may come, and SetBackends reaches this Service), within drainTimeout.
	for old.ln.open.Load() > 0 {
		now := time.Now()
		if now.After(deadline) || (now.After(graceEnd) && old.svc.Waiting() == 0) {
			break
		}
		select {
		case <-tick.C:
			continue
		case <-h.stopping:
		}
		break
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := old.svc.Shutdown(ctx); err != nil {
		h.log.Warn("retired proxy did not drain in time", zap.String("service", old.svc.cfg.Name), zap.Error(err))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, d := range h.draining {
		if d == old {
			h.draining = append(h.draining[:i], h.draining[i+1:]...)
			break
		}
	}
	h.retired += old.svc.Arrivals()
}

// services returns the current Service and those draining.
func (h *Handover) services() []*Service {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*Service, 0, 1+len(h.draining))
	out = append(out, h.cur.svc)
	for _, d := range h.draining {
		out = append(out, d.svc)
	}
	return out
}

// SetBackends gives the replica set to the current Service and to those draining, so that no
// Service sends a request to a replica that has left.
func (h *Handover) SetBackends(bs []Backend) {
	for _, s := range h.services() {
		s.SetBackends(bs)
	}
}

// Busy is Service.Busy summed over the current Service and those draining.
func (h *Handover) Busy(addr string) int64 {
	var n int64
	for _, s := range h.services() {
		n += s.Busy(addr)
	}
	return n
}

// InFlight is Service.InFlight summed over the current Service and those draining.
func (h *Handover) InFlight() int64 {
	return h.sum((*Service).InFlight)
}

// PrefillTokens is Service.PrefillTokens summed over the current Service and those draining.
func (h *Handover) PrefillTokens() int64 {
	return h.sum((*Service).PrefillTokens)
}

// PrefillRequests is Service.PrefillRequests summed over the current Service and those draining.
func (h *Handover) PrefillRequests() int64 {
	return h.sum((*Service).PrefillRequests)
}

// PrefillBusy is Service.PrefillBusy summed over the current Service and those draining.
func (h *Handover) PrefillBusy() map[string]int64 {
	var out map[string]int64
	for _, s := range h.services() {
		for addr, n := range s.PrefillBusy() {
			if out == nil {
				out = map[string]int64{}
			}
			out[addr] += n
		}
	}
	return out
}

// SetPrefillBackends gives the current Service and those draining a new prefill pool.
func (h *Handover) SetPrefillBackends(bs []Backend) error {
	var err error
	for _, s := range h.services() {
		err = errors.Join(err, s.SetPrefillBackends(bs))
	}
	return err
}

// Waiting is Service.Waiting summed over the current Service and those draining.
func (h *Handover) Waiting() int64 {
	return h.sum((*Service).Waiting)
}

// sum adds f over the current Service and those draining.
func (h *Handover) sum(f func(*Service) int64) int64 {
	var n int64
	for _, s := range h.services() {
		n += f(s)
	}
	return n
}

// Arrivals counts the requests every Service of the Handover received; it never goes down.
func (h *Handover) Arrivals() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.retired + h.cur.svc.Arrivals()
	for _, d := range h.draining {
		n += d.svc.Arrivals()
	}
	return n
}

// Shutdown stops accepting, shuts the current Service down (Service.Shutdown) and waits for
// retired ones to finish draining, or for ctx to end.
func (h *Handover) Shutdown(ctx context.Context) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	close(h.stopping)
	cur := h.cur
	h.mu.Unlock()
	_ = h.ln.Close()
	err := cur.svc.Shutdown(ctx)
	drained := make(chan struct{})
	go func() {
		h.drains.Wait()
		close(drained)
	}()
	select {
	case <-drained:
	case <-ctx.Done():
		if err == nil {
			err = ctx.Err()
		}
	}
	return err
}

// serveRequest is Handler as Serve mounts it: once a Handover retires the Service, every
// response also closes its connection, so keep-alive clients reconnect to the successor.
func (s *Service) serveRequest(ctx *fasthttp.RequestCtx) {
	s.Handler(ctx)
	if s.closeConns.Load() {
		ctx.SetConnectionClose()
	}
}

// handoffListener is the listener a Handover serves one Service through: Accept returns the
// connections deliver hands over. Closing it leaves the real listener open.
type handoffListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	// open counts delivered connections not closed yet.
	open atomic.Int64
}

func newHandoffListener(addr net.Addr) *handoffListener {
	return &handoffListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// deliver waits until the Service accepts conn (true) or the listener is closed (false: the
// caller still owns conn).
func (l *handoffListener) deliver(conn net.Conn) bool {
	tc := &trackedConn{Conn: conn, open: &l.open}
	l.open.Add(1)
	select {
	case l.conns <- tc:
		return true
	case <-l.done:
		l.open.Add(-1)
		return false
	}
}

// Accept implements net.Listener.
func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener; the real listener stays open.
func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr implements net.Listener: the real listener's address.
func (l *handoffListener) Addr() net.Addr { return l.addr }

// trackedConn counts itself out of its listener's open connections when closed.
type trackedConn struct {
	net.Conn
	open   *atomic.Int64
	closed atomic.Bool
}

func (c *trackedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.open.Add(-1)
	}
	return c.Conn.Close()
}

// NetConn returns the wrapped connection: clientGone looks through it for the socket.
func (c *trackedConn) NetConn() net.Conn { return c.Conn }
