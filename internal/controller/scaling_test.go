package controller

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryserve/ferry/proxy"
)

// TestServiceLoadCountsHeldDemand: requests the proxy holds for a free slot while every replica
// is at its cap (late binding) count in the concurrency the autoscaler reads, with those in
// flight, so that scaling reacts to the demand held in the proxy and not only to what the
// replicas were sent.
func TestServiceLoadCountsHeldDemand(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(up.Close)

	px, err := proxy.NewService(proxy.ServiceConfig{Name: "llama", Policy: "least_load", MaxInFlightPerReplica: 1,
		HealthCheck: proxy.HealthCheck{Interval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	front := proxy.NewHandover(ln, px, nil)
	go func() { _ = front.Serve() }()
	t.Cleanup(func() { _ = front.Shutdown(context.Background()) })
	t.Cleanup(open) // runs first (cleanups run last-in first-out): held requests end before the proxy and the replica stop
	px.SetBackends([]proxy.Backend{{ID: 1, Addr: strings.TrimPrefix(up.URL, "http://"), Version: 1}})
	s := &service{name: "llama", front: front}
	c := New(Options{})
	s.attach = c.newAttachHub(s, time.Now)
	load := serviceLoad{c, s}

	const requests = 4
	var wg sync.WaitGroup
	send := func() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post("http://"+ln.Addr().String()+"/v1/completions", "application/json", strings.NewReader(`{}`))
			if err != nil {
				t.Errorf("request: %v", err)
				return
			}
			resp.Body.Close()
		}()
	}
	// The first request takes the replica's one slot before the others arrive: requests arriving
	// at the same instant may each take the last slot (the cap is not exact, slots.go).
	send()
	deadline := time.Now().Add(10 * time.Second)
	for front.InFlight() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d in flight to the replica with one request sent, want 1", front.InFlight())
		}
		time.Sleep(2 * time.Millisecond)
	}
	for range requests - 1 {
		send()
	}
	for load.InFlight() != requests || front.Waiting() != requests-1 {
		if time.Now().After(deadline) {
			t.Fatalf("concurrency %v with %d waiting in the proxy, want %d with %d waiting", load.InFlight(), front.Waiting(), requests, requests-1)
		}
		time.Sleep(2 * time.Millisecond)
	}
	open()
	wg.Wait()
	// A request's count ends with its response stream, just after the client has read it.
	for deadline = time.Now().Add(10 * time.Second); load.InFlight() != 0; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("concurrency after the requests = %v, want 0", load.InFlight())
		}
	}
}
