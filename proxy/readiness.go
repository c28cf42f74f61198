package proxy

import (
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Readiness is what a proxy's GET /readyz reports to whatever routes traffic to it (a
// Kubernetes Service's endpoints, a cloud load balancer's health check): 503 "starting" until
// the proxy has a routing table, 200 "ready" while it serves, and 503 "draining" from the
// moment it is asked to stop. /healthz, its liveness, stays 200 throughout.
//
// Draining is announced before the proxy stops accepting (`ferry proxy --drain-delay`): a load
// balancer takes a few seconds to notice an unready backend (a kubelet probe period, then
// endpoint propagation to every node's kube-proxy), and connections it sends meanwhile must
// still be served, or a proxy scaled down fails the requests that arrive in that window.
//
// The zero value is starting. A nil *Readiness is always ready: a process with nothing to wait
// for (the controller) reports only that it serves HTTP.
type Readiness struct {
	state atomic.Int32
}

const (
	readinessStarting int32 = iota
	readinessReady
	readinessDraining
)

// Ready marks the proxy ready: it has what it needs to route requests. A nil r ignores it.
func (r *Readiness) Ready() {
	if r != nil {
		r.state.CompareAndSwap(readinessStarting, readinessReady)
	}
}

// Drain marks the proxy as stopping; it is never ready again. A nil r ignores it.
func (r *Readiness) Drain() {
	if r != nil {
		r.state.Store(readinessDraining)
	}
}

// ConnectionCloser is what DrainFor asks to close each client connection after its next
// response: a Service or a Handover.
type ConnectionCloser interface{ CloseConnections() }

// DrainFor marks the proxy as stopping and keeps it serving for delay, so that load balancers
// stop sending new connections before it stops accepting them; meanwhile conns closes each
// client connection after its next response, so keep-alive clients reconnect elsewhere.
// served delivers the server's result; if serving ends by itself meanwhile, DrainFor returns
// that (an error either way).
func (r *Readiness) DrainFor(delay time.Duration, conns ConnectionCloser, served <-chan error, log *zap.Logger) error {
	r.Drain()
	conns.CloseConnections()
	if delay <= 0 {
		return nil
	}
	log.Info("stopping: unready, still accepting while load balancers notice", zap.Duration("drain_delay", delay))
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case err := <-served:
		if err == nil {
			err = errors.New("the proxy stopped serving during its drain delay")
		}
		return err
	case <-t.C:
		return nil
	}
}

// IsReady reports whether /readyz answers 200.
func (r *Readiness) IsReady() bool { return r == nil || r.state.Load() == readinessReady }

func (r *Readiness) serveHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if r.IsReady() {
		_, _ = w.Write([]byte("ready\n"))
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	if r.state.Load() == readinessDraining {
		_, _ = w.Write([]byte("draining\n"))
		return
	}
	_, _ = w.Write([]byte("starting\n"))
}
