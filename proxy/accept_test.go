package proxy

import (
	"context"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

// failingListener fails its first Accepts with the errors of a process out of descriptors (and
// their kin), then accepts for real.
type failingListener struct {
	net.Listener
	errs  []syscall.Errno
	calls atomic.Int64
}

func newFailingListener(t *testing.T, errs ...syscall.Errno) *failingListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return &failingListener{Listener: ln, errs: errs}
}

func (l *failingListener) Accept() (net.Conn, error) {
	if n := l.calls.Add(1); int(n) <= len(l.errs) {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", l.errs[n-1])}
	}
	return l.Listener.Accept()
}

// acceptErrors are what Accept returns while the process or the system is out of descriptors or
// buffers, and when a client hangs up before its connection was taken.
var acceptErrors = []syscall.Errno{syscall.EMFILE, syscall.EMFILE, syscall.ENFILE, syscall.ECONNABORTED, syscall.ENOBUFS, syscall.EMFILE}

// TestServingSurvivesAcceptErrors: running out of file descriptors used to make fasthttp's Serve
// return, which ended `ferry proxy --replica` and left the controller's gateway dead for good.
// Every listener the proxy package serves must wait and accept again.
func TestServingSurvivesAcceptErrors(t *testing.T) {
	u := modelServer(t, "a", "model-a")
	tests := map[string]func(t *testing.T, ln net.Listener) (url string, body string, served <-chan error){
		"service": func(t *testing.T, ln net.Listener) (string, string, <-chan error) {
			svc := newTestService(t, ServiceConfig{HealthCheck: HealthCheck{Interval: -1}}, backendsOf(u))
			served := make(chan error, 1)
			go func() { served <- svc.Serve(ln) }()
			t.Cleanup(func() { _ = svc.Shutdown(context.Background()) })
			return "/v1/chat/completions", `{}`, served
		},
		"gateway": func(t *testing.T, ln net.Listener) (string, string, <-chan error) {
			svc, _ := startProxy(t, ServiceConfig{Name: "a"}, backendsOf(u)...)
			g := NewGateway(GatewayConfig{Logger: zaptest.NewLogger(t)})
			g.SetServices([]*Service{svc})
			served := make(chan error, 1)
			go func() { served <- g.Serve(ln) }()
			t.Cleanup(func() { _ = g.Shutdown(context.Background()) })
			return "/v1/chat/completions", `{"model":"a"}`, served
		},
		"handover": func(t *testing.T, ln net.Listener) (string, string, <-chan error) {
			h := NewHandover(ln, newTestService(t, ServiceConfig{HealthCheck: HealthCheck{Interval: -1}}, backendsOf(u)), zaptest.NewLogger(t))
			served := make(chan error, 1)
			go func() { served <- h.Serve() }()
			t.Cleanup(func() { _ = h.Shutdown(context.Background()) })
			return "/v1/chat/completions", `{}`, served
		},
		"admin": func(t *testing.T, ln net.Listener) (string, string, <-chan error) {
			_, reg := newTestMetrics(t)
			stop := ServeAdmin(ln, reg, "", nil, zaptest.NewLogger(t))
			t.Cleanup(func() { stop(context.Background()) })
			return "/healthz", "", nil
		},
	}
	for name, serve := range tests {
		t.Run(name, func(t *testing.T) {
			ln := newFailingListener(t, acceptErrors...)
			path, body, served := serve(t, ln)
			c := &http.Client{Timeout: 5 * time.Second}
			method := http.MethodPost
			if body == "" {
				method = http.MethodGet
			}
			req, _ := http.NewRequest(method, "http://"+ln.Addr().String()+path, strings.NewReader(body))
			resp, err := c.Do(req)
			if err != nil {
				select {
				case err := <-served:
					t.Fatalf("serving ended after the accept errors: %v", err)
				default:
				}
				t.Fatalf("request after the accept errors: %v", err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("status %d after the accept errors", resp.StatusCode)
			}
			if got := ln.calls.Load(); got <= int64(len(acceptErrors)) {
				t.Errorf("Accept called %d times, want every error retried", got)
			}
		})
	}
}
