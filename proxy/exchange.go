package proxy

import (
	"io"
	"sync/atomic"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/policy"
)

// exchange is one proxied request, from pick to the end of its response stream, and the body
// stream fasthttp writes to the client. It is pooled: the upstream request and response, the
// retry bookkeeping and the scratch buffers are reused across requests.
//
// Lifetime: Handler takes an exchange from the pool; if the replica answered with a body, respond
// hands the exchange to ctx.Response.SetBodyStream and Handler returns. fasthttp then reads the
// body through Read and calls CloseWithError exactly once, when the body is written, when writing
// fails (the client went away), or when it resets the response; it drops its reference at that
// point, so finish can return the exchange to the pool.
type exchange struct {
	svc  *Service
	req  fasthttp.Request
	resp fasthttp.Response

	replica *policy.Replica
	client  *hostClient
	// body is the upstream response stream while the client is being fed.
	body io.Reader
	// readErr is the first upstream read error other than EOF (a stalled or broken replica).
	readErr error
	// finished guards finish against a second close; true while the exchange is idle in the pool.
	finished atomic.Bool

	// info is what the picker reads of the request; it aliases the client request's buffers.
	info       policy.Request
	tried      []*policy.Replica
	candidates []*policy.Replica
	requestID  []byte
	scratch    []byte
}

var _ fasthttp.ReadCloserWithError = (*exchange)(nil)

// begin counts the request against a replica, its client and the service. The replica's count
// is what least_load balances on, so it is taken before the request is sent.
func (ex *exchange) begin(r *policy.Replica, c *hostClient) {
	ex.replica, ex.client = r, c
	r.InFlight.Add(1)
	c.acquire()
	ex.svc.inflight.Add(1)
}

// end undoes begin. The upstream connection must already be back in the pool or closed, so a
// retired client's final release can close it.
func (ex *exchange) end() {
	ex.replica.InFlight.Add(-1)
	ex.client.release()
	ex.svc.inflight.Add(-1)
	ex.replica, ex.client = nil, nil
}

// Read feeds the replica's body to the client connection.
func (ex *exchange) Read(p []byte) (int, error) {
	n, err := ex.body.Read(p)
	if err != nil && err != io.EOF && ex.readErr == nil {
		ex.readErr = err
	}
	return n, err
}

// CloseWithError is fasthttp's end-of-stream call; err is non-nil when the body was not fully
// delivered.
func (ex *exchange) CloseWithError(err error) error {
	ex.finish(err)
	return nil
}

// finish releases everything the exchange holds, once. An upstream body that was not read to the
// end has its connection closed rather than pooled: an unread remainder would be parsed as the
// next response on that connection.
func (ex *exchange) finish(err error) {
	if !ex.finished.CompareAndSwap(false, true) {
		return
	}
	if ex.body != nil {
		if rc, ok := ex.body.(fasthttp.ReadCloserWithError); ok && err != nil {
			_ = rc.CloseWithError(err) // discards the connection
		}
		ex.body = nil
	}
	_ = ex.resp.CloseBodyStream() // pools the connection only if the body was read to EOF

	if ex.readErr != nil || err != nil {
		ex.logStreamEnd(err)
	}
	ex.end()
	ex.svc.releaseExchange(ex)
}

func (ex *exchange) logStreamEnd(err error) {
	log := ex.svc.log
	if ex.readErr != nil {
		msg := "replica stream failed"
		if isTimeout(ex.readErr) {
			msg = "replica stream idle timeout"
		}
		if ce := log.Check(zap.WarnLevel, msg); ce != nil {
			ce.Write(zap.Int("replica_id", ex.replica.ID), zap.String("addr", ex.replica.Addr),
				zap.ByteString("request_id", ex.requestID), zap.Error(ex.readErr))
		}
		return
	}
	if ce := log.Check(zap.DebugLevel, "client stopped reading the response"); ce != nil {
		ce.Write(zap.Int("replica_id", ex.replica.ID), zap.ByteString("request_id", ex.requestID), zap.Error(err))
	}
}

func (s *Service) acquireExchange() *exchange {
	ex := s.exchanges.Get().(*exchange)
	ex.finished.Store(false)
	return ex
}

func (s *Service) releaseExchange(ex *exchange) {
	ex.finished.Store(true)
	ex.req.Reset() // drops the reference to the client's body
	ex.resp.Reset()
	ex.readErr = nil
	ex.info = policy.Request{}
	clear(ex.tried) // do not pin replicas of old snapshots
	ex.tried = ex.tried[:0]
	clear(ex.candidates)
	ex.candidates = ex.candidates[:0]
	s.exchanges.Put(ex)
}
