package attach

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/ferryserve/ferry/internal/testhttp"
	"github.com/ferryserve/ferry/proxy"
)

// TestGatewaySlotDrainsWhatItReplaces: a Swap routes the gateway to the new Service at once,
// while a request in flight on the old one finishes there; the old one counts with the slot
// until it has drained, and the slot's arrivals never go down. close takes the service out of
// the gateway (model_not_found) and drains it.
func TestGatewaySlotDrainsWhatItReplaces(t *testing.T) {
	log := zaptest.NewLogger(t)
	replica := simReplica(t, "model-a")
	backends := []proxy.Backend{{ID: 1, Addr: replica.Listener.Addr().String(), Version: 1}}
	newService := func() *proxy.Service {
		svc, err := proxy.NewService(proxy.ServiceConfig{Name: "svc-a", Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		svc.SetBackends(backends)
		return svc
	}
	gw := proxy.NewGateway(proxy.GatewayConfig{Logger: log})
	var slot *gatewaySlot
	slot = newGatewaySlot(newService(), func() {
		if cur := slot.current(); cur != nil {
			gw.SetServices([]*proxy.Service{cur})
		} else {
			gw.SetServices(nil)
		}
	}, log)
	slot.changed()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gw.Serve(ln) }()
	t.Cleanup(func() { _ = gw.Shutdown(context.Background()) })
	base := "http://" + ln.Addr().String()
	c := &http.Client{Timeout: 10 * time.Second}

	eventually(t, "model-a routed", func() (bool, string) { // once the replica told its models
		code, got, err := testhttp.Completion(c, base, "model-a", 2)
		return code == http.StatusOK, fmt.Sprintf("HTTP %d %q %v", code, got, err)
	})
	old := slot.current()
	arrived := old.Arrivals()
	long := make(chan error, 1)
	go func() {
		code, got, err := testhttp.Completion(c, base, "model-a", 60) // about 300 ms
		if err == nil && (code != http.StatusOK || got != "model-a") {
			err = &httpError{code, got}
		}
		long <- err
	}()
	eventually(t, "the request in flight", func() (bool, string) { return old.InFlight() == 1, "not yet" })

	slot.Swap(newService(), 10*time.Second)
	if slot.current() == old {
		t.Fatal("Swap kept the old Service current")
	}
	if n := slot.Busy(backends[0].Addr); n < 1 {
		t.Errorf("busy while the old Service drains = %d, want its request counted", n)
	}
	if code, got, err := testhttp.Completion(c, base, "model-a", 2); err != nil || code != http.StatusOK || got != "model-a" {
		t.Errorf("a request after the swap: HTTP %d %q, %v", code, got, err)
	}
	if err := <-long; err != nil {
		t.Errorf("the request in flight across the swap: %v", err)
	}
	eventually(t, "the old Service drained", func() (bool, string) {
		slot.mu.Lock()
		defer slot.mu.Unlock()
		return len(slot.draining) == 0, "still draining"
	})
	if n := slot.Arrivals(); n != arrived+2 {
		t.Errorf("arrivals after the drain = %d, want %d", n, arrived+2)
	}

	slot.close(10 * time.Second)
	slot.wait()
	if code, got, err := testhttp.Completion(c, base, "model-a", 2); err != nil || code != http.StatusNotFound || got != "model_not_found" {
		t.Errorf("after close: HTTP %d %q, %v; want 404 model_not_found", code, got, err)
	}
}

type httpError struct {
	code int
	got  string
}

func (e *httpError) Error() string { return http.StatusText(e.code) + " " + e.got }
