package proxy

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ferryserve/ferry/policy"
	"github.com/valyala/fasthttp"
)

// Upstream client settings, per replica.
const (
	// upstreamMaxConns is generous: vLLM batches hundreds of concurrent sequences per replica,
	// and a full pool fails fast (ErrNoFreeConns) and is retried on another replica.
	upstreamMaxConns = 1024
	// upstreamMaxIdleConnDuration stays below common replica keep-alive timeouts (uvicorn's is 5
	// s by default but vLLM raises it; nginx's 75 s), so the proxy closes an idle connection before
	// the replica does and a reused connection does not fail on its first write.
	upstreamMaxIdleConnDuration = 10 * time.Second
	// upstreamReadBufferSize also bounds the size of a response header.
	upstreamReadBufferSize = 8 << 10
	// dialTimeout bounds connecting to a replica. A preempted spot VM drops SYNs silently
	// instead of refusing; 3 s allows one SYN retransmission across regions, then the request
	// moves on to another replica.
	dialTimeout = 3 * time.Second
)

// hostClient is the upstream client of one replica address, shared by the snapshots that contain
// that address. active counts requests using it; a retired client closes its idle connections
// when active drops to zero, so streams on a removed replica finish undisturbed.
type hostClient struct {
	hc      *fasthttp.HostClient
	addr    string
	active  atomic.Int64
	retired atomic.Bool
	// models are the ids the replica's /v1/models reported; nil until known.
	models atomic.Pointer[[]string]
	// adapters are the LoRA adapters this proxy registered there (adapterload.go).
	adapters loadedAdapters
	// metrics are the series of the replica id at addr (metrics.go); nil without Metrics.
	metrics atomic.Pointer[replicaMetrics]
	// health tracks the connections and progress the health checks read (healthcheck.go).
	health replicaHealth
	// binder tells a connection which exchange it carries (clientwatch.go). Only the handler's
	// Do may use hc: other requests to the replica go through clients of their own.
	binder binder
	// tokenize is the client for the replica's /tokenize, made when first needed (tokenize.go).
	tokenize atomic.Pointer[fasthttp.HostClient]
	// kv is the engine's report of its KV cache (ServiceConfig.KVEvents); nil without.
	kv *policy.KVBlocks
}

func (c *hostClient) acquire() { c.active.Add(1) }

func (c *hostClient) release() {
	// Both sides use sequentially consistent atomics: whichever of release and retire runs
	// second sees the other's write, so the close is never missed.
	if c.active.Add(-1) == 0 && c.retired.Load() {
		c.hc.CloseIdleConnections()
		c.dropMetrics()
	}
}

// retire marks the client as no longer in any snapshot. A request that picked it from an older
// snapshot may still use it; it dials if needed and its release closes the connection again.
func (c *hostClient) retire() {
	c.retired.Store(true)
	if hc := c.tokenize.Load(); hc != nil {
		hc.CloseIdleConnections()
	}
	if c.active.Load() == 0 {
		c.hc.CloseIdleConnections()
		c.dropMetrics()
	}
}

func (s *Service) newHostClient(addr string) *hostClient {
	idle := s.cfg.IdleTimeout
	dial := s.dial
	var c *hostClient // its connections are tracked for health checking
	c = &hostClient{
		addr: addr,
		hc: &fasthttp.HostClient{
			Addr: addr,
			Dial: func(addr string) (net.Conn, error) {
				// Bound before connecting, so that the binder is not held through a slow dial.
				ex := c.binder.take()
				conn, err := dial(addr)
				if err != nil {
					return nil, &dialError{addr: addr, err: err}
				}
				tracked := c.health.track(&deadlineConn{Conn: conn, readIdle: idle, writeIdle: idle}, &c.binder)
				if ex != nil {
					tracked.bind(ex)
					tracked.fresh = true
				}
				return tracked, nil
			},
			MaxConns:            upstreamMaxConns,
			MaxIdleConnDuration: upstreamMaxIdleConnDuration,
			// LIFO keeps the hottest connections busy and lets surplus ones expire after a burst.
			ConnPoolStrategy: fasthttp.LIFO,
			// Retries are the proxy's decision (another replica, only when safe), never the
			// client's (same replica, any idempotent method).
			MaxIdemponentCallAttempts: 1,
			RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
			StreamResponseBody:        true,
			ReadBufferSize:            upstreamReadBufferSize,
			// Forward the path exactly as the client sent it (encoded slashes, double slashes).
			DisablePathNormalizing:   true,
			NoDefaultUserAgentHeader: true,
			SecureErrorLogMessage:    true,
		},
	}
	return c
}

// Sending the request upstream, and knowing which connection carries it. fasthttp picks the
// connection inside HostClient.Do and does not say, but a departed client's watcher
// (clientwatch.go) must close exactly that connection. Its transport sets the chosen
// connection's write deadline right after acquiring it, in the goroutine that called Do, so the
// handler calls Do holding the replica's binder with the exchange in it, and the connection's
// SetWriteDeadline (or Dial, for a new connection, before it connects) takes the exchange and
// lets go. Only the handler's Do may use hostClient.hc for that to hold; other requests to a
// replica (models, health checks, scrapes) use clients of their own.

// errStaleConn is a pooled connection that an abandoned exchange closed after fasthttp had
// pooled it: nothing was sent on it, so the request may go to another replica.
var errStaleConn = errors.New("proxy: pooled replica connection was closed for a departed client")

// binder hands an exchange to the upstream connection fasthttp sends it on (see above).
//
// It is the one per-replica lock every request takes, and fasthttp's API leaves no way around
// it: the connection learns of the exchange in the goroutine that called Do, Go has no
// goroutine-local storage, and nothing the connection's callbacks are given (the dial address,
// a deadline) names the request, so only one Do per replica at a time can have its exchange
// waiting to be taken. Acquiring the connection ourselves instead (HostClient.Transport) would
// mean re-implementing fasthttp's streamed response body, which it does not export. The window
// is short: it ends once fasthttp has acquired a connection, before a dial or any write, and
// fasthttp serialises that acquisition on its own per-replica pool lock anyway.
type binder struct {
	mu   sync.Mutex
	next atomic.Pointer[exchange]
}

// send sends the request to the replica it began on, unless its client has left meanwhile, in
// which case an answer is dropped too: nobody is left to take it.
func (ex *exchange) send(c *hostClient) error {
	if ex.clientLeft.Load() {
		return errClientLeft // left between attempts: do not send it again
	}
	if err := c.do(ex); err != nil {
		return err
	}
	if ex.clientLeft.Load() {
		ex.discardResponse()
		return errClientLeft
	}
	return nil
}

// do sends ex's request to the replica with the binder held. A pooled connection that a
// departed client's watcher closed is skipped (nothing was sent on it): the request goes out on
// the next one, or a new one.
func (c *hostClient) do(ex *exchange) (err error) {
	for range 4 {
		if err = c.doOnce(ex); !errors.Is(err, errStaleConn) {
			return err
		}
	}
	return err
}

func (c *hostClient) doOnce(ex *exchange) error {
	c.binder.hold(ex)
	defer c.binder.release(ex) // also if Do panics: a binder left held would stall the replica
	return c.hc.Do(&ex.req, &ex.resp)
}

// hold is called before HostClient.Do; release after it, in the same goroutine.
func (b *binder) hold(ex *exchange) {
	b.mu.Lock()
	ex.binding = true
	b.next.Store(ex)
}

func (b *binder) release(ex *exchange) {
	if ex.binding {
		ex.binding = false
		b.next.Store(nil)
		b.mu.Unlock()
	}
}

// take is called by a connection fasthttp acquired for the holder's request; it returns the
// exchange (nil when no Do holds the binder) and lets the binder go.
func (b *binder) take() *exchange {
	ex := b.next.Swap(nil)
	if ex == nil {
		return nil
	}
	ex.binding = false
	b.mu.Unlock()
	return ex
}

// bind records that c carries ex's request until ex ends. A client that left before the
// binding (abandon found no connection) has the connection closed here: abandon stores the flag
// and then loads the connection, bind the other way round, so one of them sees the other, and
// the CompareAndSwap in closeFor lets only one of them close it.
func (c *upstreamConn) bind(ex *exchange) {
	c.bound.Store(ex)
	ex.upstream.Store(c)
	if ex.clientLeft.Load() {
		c.closeFor(ex)
	}
}

// closeFor closes c if it still carries ex's request, and reports whether it did. The
// connection is marked, so that if fasthttp had already pooled it (a response without a body
// is pooled inside Do) its next user retries elsewhere instead of failing (SetWriteDeadline).
func (c *upstreamConn) closeFor(ex *exchange) bool {
	if !c.bound.CompareAndSwap(ex, nil) {
		return false
	}
	c.clientLeft.Store(true)
	_ = c.Conn.Close()
	return true
}

// unbind is called when ex ends, before its connection may be pooled. It reports false when
// abandon closed the connection first: the caller must then discard it, not pool it.
func (ex *exchange) unbind() bool {
	c := ex.upstream.Swap(nil)
	if c == nil {
		return true
	}
	return c.bound.CompareAndSwap(ex, nil) || !c.clientLeft.Load()
}

// privateDialer dials the replica addresses that a plain dial never reaches: local replicas in
// Ferry's private network (launcher/privnet), whose sockets come from its helper.
type privateDialer struct {
	private func(addr string) bool
	dial    func(addr string, timeout time.Duration) (net.Conn, error)
}

var privateDial atomic.Pointer[privateDialer]

// SetPrivateDial makes every Service dial the addresses private reports with dial instead of
// directly. The ferry binary sets launcher/privnet's at start (the controller's proxies and
// attached proxies alike); without it every address is dialled directly.
func SetPrivateDial(private func(addr string) bool, dial func(addr string, timeout time.Duration) (net.Conn, error)) {
	privateDial.Store(&privateDialer{private: private, dial: dial})
}

// defaultDial connects to a replica: through SetPrivateDial's dialer when it takes the address,
// else directly.
func defaultDial(addr string) (net.Conn, error) {
	if pd := privateDial.Load(); pd != nil && pd.private(addr) {
		return pd.dial(addr, dialTimeout)
	}
	d := net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	return d.Dial("tcp", addr)
}

// dialError marks a failure to connect: the request never reached the replica, so it is safe to
// retry elsewhere (Caddy's DialError).
type dialError struct {
	addr string
	err  error
}

func (e *dialError) Error() string { return "dial replica " + e.addr + ": " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// retryBudget bounds the time spent on one request before its last retry starts: a client
// waiting for its first token is better served by an error it can act on than by a proxy that
// keeps trying replicas for minutes.
const retryBudget = 15 * time.Second

// retryable reports whether a failed attempt may go to another replica: the request was never
// sent (dial error, full pool), the replica's connection broke before it answered (reset, closed
// keep-alive connection, closed by a health-check ejection), or it answered 500/502/503
// (statusError). Nothing has reached the client in any of these cases. Timeouts are not
// retried: the replica may still be working on it, and a second replica would double the wait.
func retryable(err error) bool {
	var de *dialError
	var se *statusError
	switch {
	case errors.As(err, &de), errors.As(err, &se), errors.Is(err, fasthttp.ErrNoFreeConns), errors.Is(err, errReplicaEjected),
		errors.Is(err, errStaleConn), errors.Is(err, errAdapterLoad):
		return true
	case isTimeout(err):
		return false
	}
	return errors.Is(err, fasthttp.ErrConnectionClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED)
}

// retryableStatus is a replica's answer that another replica may do better on: 500 (the
// engine failed: vLLM answers 500 for a dead or crashed engine, 400s for bad requests), 502
// (its own upstream failed) or 503 (overloaded, starting, draining). A 500 may have cost the
// replica some compute, but an inference request has no other side effect, nothing has
// reached the client, and the retry is bounded like every retry (MaxAttempts distinct
// replicas, retryBudget).
func retryableStatus(code int) bool {
	return code == fasthttp.StatusInternalServerError || code == fasthttp.StatusBadGateway || code == fasthttp.StatusServiceUnavailable
}

// isTimeout reports an idle deadline (or fasthttp's ErrTimeout) firing.
func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// statusError is a replica's error status, as an error for retries and logs.
type statusError struct{ code int }

func (e *statusError) Error() string {
	return "replica answered " + strconv.Itoa(e.code) + " " + fasthttp.StatusMessage(e.code)
}
