package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/proxy/attach"
)

// Readiness and the drain a scaled-down proxy needs behind a load balancer (issue 36): /readyz
// says 503 until the proxy can route, 200 while it serves, and 503 from SIGTERM on, while the
// proxy keeps accepting for --drain-delay so that connections the load balancer still sends
// before it notices are served, and only then stops accepting.

// drainDelay is long enough for the test to see the window on a loaded host.
const drainDelay = 1500 * time.Millisecond

func TestProxyDrainsUnreadyBeforeItStopsAccepting(t *testing.T) {
	replica := startCountingReplica(t)
	opts, err := proxyFlags{
		listen: "127.0.0.1:0", name: "svc", policy: "least_load", replicas: []string{replica.URL},
		maxBodyMB: 32, idleTimeout: time.Minute, shutdownTimeout: 10 * time.Second,
		metricsListen: "127.0.0.1:0", drainDelay: drainDelay,
	}.parse()
	if err != nil {
		t.Fatal(err)
	}
	ln, adminLn := listen(t), listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := &runningProxy{addr: ln.Addr().String(), readyz: "http://" + adminLn.Addr().String() + "/readyz",
		stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.err = serveProxy(ctx, opts, ln, adminLn, zaptest.NewLogger(t))
	}()
	waitUntil(t, "/readyz 200", func() bool { code, _ := get(p.readyz); return code == http.StatusOK })
	checkDrain(t, p)
}

func TestAttachedProxyIsReadyAtTheControllersFirstAnswer(t *testing.T) {
	h := home.Home{Dir: t.TempDir()}
	replica := startCountingReplica(t)
	p := startAttachedProxy(t, h)

	// No controller yet: the proxy knows neither replicas nor keys, and says so.
	for range 3 {
		if code, body := get(p.readyz); code != http.StatusServiceUnavailable || body != "starting\n" {
			t.Fatalf("/readyz before the controller answered: %d %q, want 503 \"starting\"", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ctl := startAttachController(t, h, attach.ProxyConfig{Policy: "round_robin"})
	ctl.feed.Publish([]proxy.Backend{replica.backend(1)})
	waitUntil(t, "/readyz 200", func() bool { code, _ := get(p.readyz); return code == http.StatusOK })
	checkDrain(t, p)
}

// checkDrain stops a serving proxy and checks the drain: /readyz turns 503 "draining" at once,
// new connections are still served until the delay has passed, and then the proxy stops
// accepting and exits without an error.
func checkDrain(t *testing.T, p *runningProxy) {
	t.Helper()
	readyz, endpoint := p.readyz, "http://"+p.addr
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	chat := func() (int, error) {
		resp, err := client.Post(endpoint+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"ferry-sim","prompt":"hi","max_tokens":2}`))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		return resp.StatusCode, err
	}
	if code, err := chat(); code != http.StatusOK {
		t.Fatalf("before the stop: HTTP %d, %v", code, err)
	}
	stopped := time.Now()
	p.stop()
	waitUntil(t, "/readyz 503 draining", func() bool {
		code, body := get(readyz)
		return code == http.StatusServiceUnavailable && body == "draining\n"
	})
	// New connections, as a load balancer that has not noticed yet sends them, are served for
	// the whole delay. The loop is bounded by it.
	n := 0
	for time.Since(stopped) < drainDelay*2/3 {
		if code, err := chat(); code != http.StatusOK {
			t.Fatalf("%v after the stop (drain delay %v): HTTP %d, %v", time.Since(stopped), drainDelay, code, err)
		}
		n++
		time.Sleep(20 * time.Millisecond)
	}
	if n == 0 {
		t.Fatal("no request was sent during the drain delay")
	}
	select {
	case <-p.done:
		if p.err != nil {
			t.Fatalf("proxy: %v", p.err)
		}
		if since := time.Since(stopped); since < drainDelay {
			t.Errorf("the proxy stopped %v after the stop, before its drain delay of %v", since, drainDelay)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("proxy did not stop within 15s")
	}
	if _, err := chat(); err == nil {
		t.Error("the proxy still accepts after its drain")
	}
}

// get returns the status and body of a GET, 0 when it failed.
func get(url string) (int, string) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A proxy stopped while its controller is gone (a controller restarting in the same rollout,
// say) still drains: readiness and the delay do not wait on the controller, and the proxy
// serves its last replica set until it stops accepting.
func TestAttachedProxyDrainsWithTheControllerGone(t *testing.T) {
	h := home.Home{Dir: t.TempDir()}
	replica := startCountingReplica(t)
	p := startAttachedProxy(t, h)
	ctl := startAttachController(t, h, attach.ProxyConfig{Policy: "round_robin"})
	ctl.feed.Publish([]proxy.Backend{replica.backend(1)})
	waitUntil(t, "/readyz 200", func() bool { code, _ := get(p.readyz); return code == http.StatusOK })
	ctl.kill()
	checkDrain(t, p)
}
