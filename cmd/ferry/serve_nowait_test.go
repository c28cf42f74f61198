package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/controller"
	"github.com/ferryserve/ferry/internal/home"
)

// TestServeUpNoWaitReturnsOnceRegistered runs `serve up --no-wait` against a controller in this
// process with a service whose replica never becomes READY: the command returns as soon as the
// controller has the service, says it is registered (not up), and asks nothing of the
// service's endpoint, which would hold the request until a replica is READY.
func TestServeUpNoWaitReturnsOnceRegistered(t *testing.T) {
	dir := t.TempDir()
	h := home.Home{Dir: filepath.Join(dir, "home")}
	t.Setenv(home.Env, h.Dir)
	t.Setenv("KUBECONFIG", filepath.Join(dir, "no-kubeconfig")) // no cluster from the machine running the test
	if err := h.Ensure(); err != nil {
		t.Fatal(err)
	}
	ctl := controller.New(controller.Options{Home: h, GatewayAddr: controller.ListenerOff, MetricsAddr: controller.ListenerOff,
		ProbeInterval: 200 * time.Millisecond, Logger: zap.NewNop()})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ctlCtx, stopCtl := context.WithCancel(context.Background()) // not ctx: its deferred cancel runs before the cleanup takes the replicas down
	stopped := make(chan error, 1)
	go func() { stopped <- ctl.Start(ctlCtx) }()
	var c *api.Client
	t.Cleanup(func() {
		if c != nil { // so that no replica outlives the test
			cleanCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_, _ = c.DeleteService(cleanCtx, "never-ready")
			cancel()
		}
		stopCtl()
		select {
		case <-stopped:
		case <-time.After(time.Minute):
			t.Error("the controller did not stop within a minute")
		}
	})
	eventually(t, time.Minute, "the controller answers", func() (bool, string) {
		var err error
		c, _, err = connect(ctx, h)
		return err == nil, fmt.Sprint(err)
	})

	file := filepath.Join(dir, "never-ready.yaml")
	task := "name: never-ready\nrun: exec sleep 300\nservice:\n  replicas: 2\n  ports: 8080\n  readiness_probe: /health\n"
	if err := os.WriteFile(file, []byte(task), 0o600); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	out, err := ferryRun(ctx, t, "serve", "up", file, "-y", "--no-wait")
	took := time.Since(began)
	if err != nil {
		t.Fatalf("serve up --no-wait: %v\n%s", err, out)
	}
	// Far below servedModel's 3 s and the first probe; loose for a loaded machine.
	if took > 2*time.Second {
		t.Errorf("serve up --no-wait took %s", took)
	}
	if !strings.Contains(out, `Service "never-ready" is registered; its replicas are starting`) || strings.Contains(out, "is up") {
		t.Errorf("serve up --no-wait does not say the service is registered and starting:\n%s", out)
	}
	list, err := c.Services(ctx, "never-ready")
	if err != nil || len(list) != 1 || list[0].TargetReplicas != 2 || list[0].ReadyReplicas != 0 {
		t.Fatalf("the service after serve up --no-wait: %+v, %v", list, err)
	}
}
