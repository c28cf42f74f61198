package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/controller"
	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/internal/testhttp"
)

// TestAttachAllFrontsEveryService runs a real controller in this process with local services
// whose replicas are `ferry replica-sim` (this test binary as ferry), each serving a model of
// its own, and `ferry proxy --attach-all` in front of them: requests reach the service of
// their model, GET /v1/models lists every model, a service brought up later is routable
// within seconds of its replica being READY, a new load-balancing policy applies without
// failing requests in flight, and a service taken down answers OpenAI's model_not_found.
func TestAttachAllFrontsEveryService(t *testing.T) {
	dir := t.TempDir()
	h := home.Home{Dir: filepath.Join(dir, "home")}
	t.Setenv(home.Env, h.Dir)
	t.Setenv("KUBECONFIG", filepath.Join(dir, "no-kubeconfig")) // no cluster from the machine running the test
	if err := h.Ensure(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := startTestController(ctx, t, h)
	services := newSimServices(t, c, dir)
	services.up(ctx, "svc-a", "model-a", "")
	services.up(ctx, "svc-b", "model-b", "")

	opts, err := proxyFlags{listen: "127.0.0.1:0", attachAll: true, shutdownTimeout: 10 * time.Second}.parse()
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	proxyCtx, stopProxy := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- serveAttached(proxyCtx, opts, h, ln, nil, zaptest.NewLogger(t)) }()
	defer func() {
		stopProxy()
		select {
		case err := <-served:
			if err != nil {
				t.Errorf("ferry proxy --attach-all: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("ferry proxy --attach-all did not stop within 30s")
		}
	}()
	base := "http://" + ln.Addr().String()
	client := &http.Client{Timeout: 30 * time.Second}

	for _, model := range []string{"model-a", "model-b"} {
		eventually(t, 20*time.Second, model+" through the gateway", func() (bool, string) {
			code, got, err := testhttp.Completion(client, base, model, 2)
			return code == http.StatusOK && got == model, fmt.Sprintf("HTTP %d %q %v", code, got, err)
		})
	}
	eventually(t, 10*time.Second, "both models listed", func() (bool, string) {
		models, err := testhttp.ModelIDs(client, base, "")
		return slices.Contains(models, "model-a") && slices.Contains(models, "model-b"), fmt.Sprint(models, err)
	})

	services.up(ctx, "svc-c", "model-c", "")
	eventually(t, 5*time.Second, "a service brought up later, routable", func() (bool, string) {
		code, got, err := testhttp.Completion(client, base, "model-c", 2)
		return code == http.StatusOK && got == "model-c", fmt.Sprintf("HTTP %d %q %v", code, got, err)
	})

	// A new policy for svc-a while requests run there (about a second each): none fails.
	var inflight sync.WaitGroup
	for range 4 {
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			if code, got, err := testhttp.Completion(client, base, "model-a", 100); err != nil || code != http.StatusOK || got != "model-a" {
				t.Errorf("a request in flight across the new policy: HTTP %d %q, %v", code, got, err)
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	services.update(ctx, "svc-a", "model-a", "round_robin")
	inflight.Wait()
	if code, got, err := testhttp.Completion(client, base, "model-a", 2); err != nil || code != http.StatusOK || got != "model-a" {
		t.Errorf("after the new policy: HTTP %d %q, %v", code, got, err)
	}

	if _, err := c.DeleteService(ctx, "svc-b"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "a service taken down, its model unknown", func() (bool, string) {
		code, got, err := testhttp.Completion(client, base, "model-b", 2)
		return code == http.StatusNotFound && got == "model_not_found", fmt.Sprintf("HTTP %d %q %v", code, got, err)
	})
	if code, got, err := testhttp.Completion(client, base, "model-c", 2); err != nil || code != http.StatusOK || got != "model-c" {
		t.Errorf("another service after one was taken down: HTTP %d %q, %v", code, got, err)
	}
}

// startTestController runs a controller for h in this process until the test's cleanups
// (those registered later, which take services down, run first), and returns a client of its
// API.
func startTestController(ctx context.Context, t *testing.T, h home.Home) *api.Client {
	t.Helper()
	ctl := controller.New(controller.Options{Home: h, GatewayAddr: controller.ListenerOff, MetricsAddr: controller.ListenerOff,
		ProbeInterval: 200 * time.Millisecond, Logger: zap.NewNop()})
	// Not ctx: the test's deferred cancel runs before its cleanups, which need the controller.
	ctlCtx, stopCtl := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- ctl.Start(ctlCtx) }()
	t.Cleanup(func() {
		stopCtl()
		select {
		case <-stopped:
		case <-time.After(time.Minute):
			t.Error("the controller did not stop within a minute")
		}
	})
	var c *api.Client
	eventually(t, time.Minute, "the controller answers", func() (bool, string) {
		var err error
		c, _, err = connect(ctx, h)
		return err == nil, fmt.Sprint(err)
	})
	return c
}

// simServices brings local services up on a controller, each one replica of `ferry
// replica-sim` (this test binary, run as ferry) serving a model, and takes them down when the
// test ends.
type simServices struct {
	t   *testing.T
	c   *api.Client
	dir string
	exe string

	mu    sync.Mutex
	names []string
}

func newSimServices(t *testing.T, c *api.Client, dir string) *simServices {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	s := &simServices{t: t, c: c, dir: dir, exe: exe}
	t.Cleanup(func() { // so that no replica outlives the test
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, name := range s.names {
			if _, err := c.DeleteService(ctx, name); err != nil && !errors.Is(err, api.ErrNotFound) {
				t.Errorf("serve down %s: %v", name, err)
			}
		}
	})
	return s
}

// task is the service name serving model with the load-balancing policy lb ("" the default).
func (s *simServices) task(name, model, lb string) *configs.Task {
	s.t.Helper()
	yaml := fmt.Sprintf("name: %s\nresources:\n  infra: local\nrun: exec env %s=1 '%s' replica-sim --port $FERRY_PORT --model %s --itl 10ms\n"+
		"service:\n  replicas: 1\n  ports: 8080\n  readiness_probe: /health\n", name, asFerryEnv, s.exe, model)
	if lb != "" {
		yaml += "  load_balancing_policy: " + lb + "\n"
	}
	file := filepath.Join(s.dir, name+".yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		s.t.Fatal(err)
	}
	task, err := configs.Load(file, configs.Overrides{})
	if err != nil {
		s.t.Fatal(err)
	}
	return task
}

// up brings a service up and waits until its replica is READY.
func (s *simServices) up(ctx context.Context, name, model, lb string) {
	s.t.Helper()
	s.mu.Lock()
	s.names = append(s.names, name)
	s.mu.Unlock()
	if _, err := s.c.CreateService(ctx, api.CreateServiceRequest{Name: name, Task: s.task(name, model, lb)}); err != nil {
		s.t.Fatal(err)
	}
	s.ready(ctx, name)
}

// update gives a service a new task and waits until it serves it, READY.
func (s *simServices) update(ctx context.Context, name, model, lb string) {
	s.t.Helper()
	if _, err := s.c.UpdateService(ctx, name, api.UpdateServiceRequest{Task: s.task(name, model, lb)}); err != nil {
		s.t.Fatal(err)
	}
	s.ready(ctx, name)
}

func (s *simServices) ready(ctx context.Context, name string) {
	s.t.Helper()
	eventually(s.t, time.Minute, name+" READY", func() (bool, string) {
		list, err := s.c.Services(ctx, name)
		if err != nil || len(list) != 1 {
			return false, fmt.Sprint(list, err)
		}
		return list[0].ReadyReplicas == 1, fmt.Sprintf("%d READY, status %s", list[0].ReadyReplicas, list[0].Status)
	})
}
