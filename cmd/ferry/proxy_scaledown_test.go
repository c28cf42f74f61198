package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/proxy/attach"
)

// TestAttachedProxyScaleDownFailsNoRequest stops one of two attached proxies under keep-alive
// load, behind a load balancer that works as a Kubernetes Service does: it sends each new
// connection to a backend whose readiness probe last passed (kube-proxy's endpoints, refreshed
// on a probe period) and knows nothing else. With the drain (/readyz, --drain-delay, responses
// that close their connection while draining), not one request fails.
func TestAttachedProxyScaleDownFailsNoRequest(t *testing.T) {
	h := home.Home{Dir: t.TempDir()}
	replica := startCountingReplica(t)
	ctl := startAttachController(t, h, attach.ProxyConfig{Policy: "least_load"})
	ctl.feed.Publish([]proxy.Backend{replica.backend(1)})

	var proxies [2]*runningProxy
	for i := range proxies {
		proxies[i] = startAttachedProxy(t, h)
	}
	lb := startEndpointsLB(t, proxies[:])
	waitUntil(t, "both proxies in the load balancer", func() bool { return lb.readyCount() == 2 })

	load := startKeepAliveLoad(t, "http://"+lb.ln.Addr().String()+"/v1/completions", 4)
	time.Sleep(500 * time.Millisecond)
	before := load.sent.Load()
	proxies[1].stop()
	select {
	case <-proxies[1].done:
		if proxies[1].err != nil {
			t.Errorf("stopped proxy: %v", proxies[1].err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the stopped proxy did not exit within 20s")
	}
	stopped := load.sent.Load()
	time.Sleep(300 * time.Millisecond) // traffic after the exit, all on the other proxy
	sent, failed := load.finish()
	t.Logf("%d requests: %d before the stop, %d during the drain, %d after the exit; %d failed", sent, before, stopped-before, sent-stopped, len(failed))
	if len(failed) > 0 {
		t.Errorf("%d of %d requests failed across the scale-down, first: %v", len(failed), sent, failed[0])
	}
	if before == 0 || stopped == before || sent == stopped {
		t.Errorf("load did not run through every phase: %d before, %d by the exit, %d in all", before, stopped, sent)
	}
}

// runningProxy is an attached proxy served in process.
type runningProxy struct {
	addr, readyz string
	stop         context.CancelFunc
	// done is closed when the proxy has exited, with err its result.
	done chan struct{}
	err  error
}

func startAttachedProxy(t *testing.T, h home.Home) *runningProxy {
	t.Helper()
	opts, err := proxyFlags{listen: "127.0.0.1:0", attach: "llama", shutdownTimeout: 10 * time.Second,
		metricsListen: "127.0.0.1:0", drainDelay: drainDelay}.parse()
	if err != nil {
		t.Fatal(err)
	}
	ln, adminLn := listen(t), listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	p := &runningProxy{addr: ln.Addr().String(), readyz: "http://" + adminLn.Addr().String() + "/readyz",
		stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.err = serveAttached(ctx, opts, h, ln, adminLn, zaptest.NewLogger(t))
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			t.Error("proxy did not stop within 20s")
		}
	})
	return p
}

// endpointsLB is a layer-4 load balancer in the manner of a Kubernetes Service: new connections
// go round robin to the backends whose /readyz answered 200 at the last probe, every
// lbProbeEvery; a connection stays on its backend until either side closes it.
type endpointsLB struct {
	ln       net.Listener
	backends []*runningProxy
	mu       sync.Mutex
	ready    []string
	next     int
}

const lbProbeEvery = 200 * time.Millisecond

func startEndpointsLB(t *testing.T, backends []*runningProxy) *endpointsLB {
	t.Helper()
	lb := &endpointsLB{ln: listen(t), backends: backends}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { lb.probe(ctx) })
	wg.Go(func() { lb.accept() })
	t.Cleanup(func() {
		cancel()
		lb.ln.Close()
		wg.Wait()
	})
	return lb
}

func (lb *endpointsLB) probe(ctx context.Context) {
	for {
		var ready []string
		for _, b := range lb.backends {
			if code, _ := get(b.readyz); code == http.StatusOK {
				ready = append(ready, b.addr)
			}
		}
		lb.mu.Lock()
		lb.ready = ready
		lb.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(lbProbeEvery):
		}
	}
}

func (lb *endpointsLB) readyCount() int {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return len(lb.ready)
}

func (lb *endpointsLB) accept() {
	for {
		client, err := lb.ln.Accept()
		if err != nil {
			return
		}
		lb.mu.Lock()
		var to string
		if len(lb.ready) > 0 {
			to = lb.ready[lb.next%len(lb.ready)]
			lb.next++
		}
		lb.mu.Unlock()
		go pipe(client, to)
	}
}

// pipe joins client to a new connection to addr until either side closes; with no backend or
// one that refuses, the client's connection is closed, as kube-proxy's would be reset.
func pipe(client net.Conn, addr string) {
	defer client.Close()
	if addr == "" {
		return
	}
	backend, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return
	}
	defer backend.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(backend, client); done <- struct{}{} }()
	go func() { _, _ = io.Copy(client, backend); done <- struct{}{} }()
	<-done
}

// keepAliveLoad is closed-loop load from workers that each keep one connection alive as long as
// the server lets them, the way OpenAI's SDKs do.
type keepAliveLoad struct {
	sent   atomic.Int64
	stopc  chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	failed []error
}

// maxLoadRequests bounds each worker's requests, whatever the timing.
const maxLoadRequests = 20000

func startKeepAliveLoad(t *testing.T, url string, workers int) *keepAliveLoad {
	t.Helper()
	l := &keepAliveLoad{stopc: make(chan struct{})}
	for range workers {
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
		l.wg.Go(func() {
			defer client.CloseIdleConnections()
			for range maxLoadRequests {
				select {
				case <-l.stopc:
					return
				default:
				}
				err := postCompletion(client, url)
				l.sent.Add(1)
				if err != nil {
					l.mu.Lock()
					l.failed = append(l.failed, err)
					l.mu.Unlock()
				}
			}
		})
	}
	t.Cleanup(func() { l.finish() })
	return l
}

func postCompletion(client *http.Client, url string) error {
	resp, err := client.Post(url, "application/json", strings.NewReader(`{"model":"ferry-sim","prompt":"hi","max_tokens":2}`))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = errors.New(resp.Status + ": " + string(body))
	}
	return err
}

// finish stops the load and returns what it sent and what failed; it may be called again.
func (l *keepAliveLoad) finish() (int64, []error) {
	l.mu.Lock()
	select {
	case <-l.stopc:
	default:
		close(l.stopc)
	}
	l.mu.Unlock()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sent.Load(), l.failed
}
