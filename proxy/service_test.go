package proxy

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestNewServiceValidates(t *testing.T) {
	tests := map[string]struct {
		cfg     ServiceConfig
		wantErr []string
	}{
		"defaults":       {cfg: ServiceConfig{Name: "m"}},
		"missing name":   {cfg: ServiceConfig{}, wantErr: []string{"name: must not be empty"}},
		"unknown policy": {cfg: ServiceConfig{Name: "m", Policy: "random"}, wantErr: []string{`unknown load balancing policy "random"`}},
		"negatives": {
			cfg:     ServiceConfig{Name: "m", MaxRequestBodySize: -1, IdleTimeout: -1, MaxAttempts: -1, MaxQueueWait: -1},
			wantErr: []string{"max request body size", "idle timeout", "max attempts", "max queue wait"},
		},
		"instance aware needs targets": {
			cfg:     ServiceConfig{Name: "m", Policy: "instance_aware_least_load"},
			wantErr: []string{"needs target QPS"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			svc, err := NewService(tc.cfg)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("NewService: %v", err)
				}
				if svc.cfg.MaxRequestBodySize != DefaultMaxRequestBodySize || svc.cfg.IdleTimeout != DefaultIdleTimeout ||
					svc.cfg.MaxAttempts != DefaultMaxAttempts || svc.cfg.Logger == nil ||
					svc.cfg.MaxQueuedRequests != DefaultMaxQueuedRequests || svc.cfg.MaxQueueWait != DefaultMaxQueueWait {
					t.Errorf("defaults not applied: %+v", svc.cfg)
				}
				return
			}
			if err == nil {
				t.Fatal("NewService succeeded, want an error")
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
}

func TestSetBackendsReusesState(t *testing.T) {
	svc, err := NewService(ServiceConfig{Name: "m", Policy: "instance_aware_least_load",
		TargetQPSPerAccelerator: map[string]float64{"A100": 2, "L4": 1}})
	if err != nil {
		t.Fatal(err)
	}
	a := Backend{ID: 1, Addr: "10.0.0.1:8000", Accelerator: "A100", Version: 1}
	b := Backend{ID: 2, Addr: "10.0.0.2:8000", Accelerator: "L4", Version: 1}
	svc.SetBackends([]Backend{a})
	first := svc.snap.Load()
	first.replicas[0].InFlight.Store(3) // a request streaming on a

	svc.SetBackends([]Backend{a, b})
	second := svc.snap.Load()
	if second.replicas[0] != first.replicas[0] || second.clients[0] != first.clients[0] {
		t.Error("unchanged backend a got a new Replica or client")
	}
	if got := second.replicas[0].InFlight.Load(); got != 3 {
		t.Errorf("a's InFlight after the swap = %d, want 3", got)
	}
	if diff := cmp.Diff([]Backend{a, b}, svc.Backends()); diff != "" {
		t.Errorf("Backends (-want +got):\n%s", diff)
	}

	// Relabelled in place (a service-only update bumps the version): same connections, new
	// identity, because pickers read identity fields without locks.
	a2 := a
	a2.Version = 2
	svc.SetBackends([]Backend{a2, b})
	third := svc.snap.Load()
	if third.clients[0] != first.clients[0] {
		t.Error("relabelled backend lost its upstream client")
	}
	if third.replicas[0] == first.replicas[0] || third.replicas[0].Version != 2 {
		t.Error("relabelled backend kept its old Replica")
	}

	// Removing b retires its client; a is untouched.
	svc.SetBackends([]Backend{a2})
	if !second.clients[1].retired.Load() {
		t.Error("removed backend b's client is not retired")
	}
	if third.clients[0].retired.Load() {
		t.Error("kept backend a's client is retired")
	}
}

func TestSetBackendsSkipsInvalid(t *testing.T) {
	svc, err := NewService(ServiceConfig{Name: "m"})
	if err != nil {
		t.Fatal(err)
	}
	good := Backend{ID: 1, Addr: "127.0.0.1:9001"}
	svc.SetBackends([]Backend{
		good,
		{ID: 2, Addr: "http://127.0.0.1:9002"},
		{ID: 3, Addr: "127.0.0.1"},
		{ID: 4, Addr: ":9004"},
		{ID: 5, Addr: "127.0.0.1:9001"}, // duplicate
	})
	if diff := cmp.Diff([]Backend{good}, svc.Backends()); diff != "" {
		t.Errorf("Backends (-want +got):\n%s", diff)
	}
	if got := len(svc.snap.Load().replicas); got != 1 {
		t.Errorf("snapshot has %d replicas, want 1", got)
	}
}

func TestBackendsIsACopy(t *testing.T) {
	svc, _ := NewService(ServiceConfig{Name: "m"})
	svc.SetBackends([]Backend{{ID: 1, Addr: "127.0.0.1:9001"}})
	got := svc.Backends()
	got[0].Addr = "changed"
	if svc.Backends()[0].Addr != "127.0.0.1:9001" {
		t.Error("Backends exposes the snapshot")
	}
}

func TestIsHopByHop(t *testing.T) {
	for _, name := range []string{"Connection", "connection", "Keep-Alive", "Proxy-Authorization", "proxy-connection",
		"Proxy-Whatever", "TE", "te", "Trailer", "Transfer-Encoding", "Upgrade"} {
		if !isHopByHop([]byte(name)) {
			t.Errorf("isHopByHop(%q) = false", name)
		}
	}
	for _, name := range []string{"Authorization", "Content-Type", "Proxy-", "Trailers", "Tee", "X-Upgrade", "Content-Length"} {
		if isHopByHop([]byte(name)) {
			t.Errorf("isHopByHop(%q) = true", name)
		}
	}
}
