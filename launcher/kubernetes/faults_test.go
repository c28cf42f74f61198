package kubernetes

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher"
)

func TestClassify(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	refused := &url.Error{Op: "Post", URL: "https://127.0.0.1:1/api/v1/namespaces/x/pods",
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}
	tests := map[string]struct {
		err  error
		want error // nil: none of the launcher's infra faults
	}{
		"429":                    {apierrors.NewTooManyRequests("slow down", 1), launcher.ErrThrottled},
		"503":                    {apierrors.NewServiceUnavailable("upgrading"), launcher.ErrUnavailable},
		"500 internal":           {apierrors.NewInternalError(errors.New("etcd is gone")), launcher.ErrUnavailable},
		"500 server timeout":     {apierrors.NewServerTimeout(pods, "list", 1), launcher.ErrUnavailable},
		"504 timeout":            {apierrors.NewTimeoutError("too slow", 1), launcher.ErrUnavailable},
		"502 from a proxy":       {apierrors.NewGenericServerResponse(502, "get", pods, "p", "bad gateway", 0, true), launcher.ErrUnavailable},
		"connection refused":     {refused, launcher.ErrUnavailable},
		"connection lost":        {&url.Error{Op: "Get", URL: "https://x", Err: errors.New("http2: client connection lost")}, launcher.ErrUnavailable},
		"request timeout":        {&url.Error{Op: "Get", URL: "https://x", Err: context.DeadlineExceeded}, launcher.ErrUnavailable},
		"unauthorized":           {apierrors.NewUnauthorized("expired token"), launcher.ErrUnauthorized},
		"forbidden":              {apierrors.NewForbidden(pods, "p", errors.New("no RBAC")), launcher.ErrUnauthorized},
		"quota":                  {apierrors.NewForbidden(pods, "p", errors.New("exceeded quota: gpus")), launcher.ErrQuota},
		"invalid":                {apierrors.NewBadRequest("no such field"), launcher.ErrInvalid},
		"not found":              {apierrors.NewNotFound(pods, "p"), nil},
		"conflict":               {apierrors.NewConflict(pods, "p", errors.New("changed")), nil},
		"cancelled by caller":    {&url.Error{Op: "Get", URL: "https://x", Err: context.Canceled}, nil},
		"unknown, not transport": {errors.New("decode: unexpected field"), nil},
	}
	p := &Provider{infra: "kubernetes/test"}
	faults := []error{launcher.ErrThrottled, launcher.ErrUnavailable, launcher.ErrUnauthorized, launcher.ErrQuota, launcher.ErrInvalid}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got := p.classify(tt.err, "do something")
			for _, f := range faults {
				if errors.Is(got, f) != (f == tt.want) {
					t.Errorf("classify(%v) = %v: errors.Is %v is %v, want %v", tt.err, got, f, errors.Is(got, f), f == tt.want)
				}
			}
			if tt.want == nil && launcher.IsInfraFault(got) {
				t.Errorf("classify(%v) = %v: an infra fault, want none", tt.err, got)
			}
		})
	}
	// The API's own error stays reachable under an infra fault.
	if got := p.classify(apierrors.NewServiceUnavailable("upgrading"), "list"); !apierrors.IsServiceUnavailable(got) {
		t.Errorf("classified 503 %v: apierrors no longer finds it", got)
	}
	if got := p.classify(refused, "list"); !errors.Is(got, syscall.ECONNREFUSED) {
		t.Errorf("classified refusal %v: the refusal is no longer in the chain", got)
	}
}

func TestWatchHealth(t *testing.T) {
	const threshold = time.Second
	h := newWatchHealth("pods", threshold)
	staled, recovered := make(chan time.Time, 4), make(chan time.Time, 4)
	h.onStale = func(since time.Time, err error) { staled <- since }
	h.onRecover = func(since time.Time) { recovered <- since }
	defer h.close()

	if since, _, stale := h.failing(); !since.IsZero() || stale || h.staleErr("k") != nil {
		t.Fatal("a watch that never failed is failing")
	}
	before := time.Now()
	h.observe(errors.New("connection refused"))
	h.observe(errors.New("connection refused again"))
	since, err, _ := h.failing()
	if since.Before(before) || err == nil || err.Error() != "connection refused again" {
		t.Fatalf("failing() = %v, %v: want since the first failure, the last error", since, err)
	}
	select {
	case at := <-staled:
		if !at.Equal(since) {
			t.Errorf("stale since %v, want %v", at, since)
		}
		if d := time.Since(since); d < threshold {
			t.Errorf("stale after %v, before the threshold %v", d, threshold)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a watch failing past its threshold never went stale")
	}
	if err := h.staleErr("kubernetes/x"); !errors.Is(err, launcher.ErrUnavailable) {
		t.Errorf("staleErr = %v, want ErrUnavailable", err)
	}
	h.observe(nil)
	select {
	case at := <-recovered:
		if !at.Equal(since) {
			t.Errorf("recovered from a run since %v, want %v", at, since)
		}
	default:
		t.Fatal("a stale watch that works again did not say so")
	}
	if since, _, stale := h.failing(); !since.IsZero() || stale || h.staleErr("k") != nil {
		t.Error("a watch that works again is still failing")
	}

	// A run that ended before its threshold: its timer, firing late, changes nothing, and
	// its end is no recovery worth telling.
	h.observe(errors.New("blip"))
	blip, _, _ := h.failing()
	h.observe(nil)
	h.expire(blip)
	if _, _, stale := h.failing(); stale || len(staled) > 0 || len(recovered) > 0 {
		t.Errorf("a blip shorter than the threshold made the watch stale (%d) or recovered (%d)", len(staled), len(recovered))
	}
}

// cpuSpec is a replica asking for cpus and no accelerator: it may land on any node.
func cpuSpec(name, cpus string) launcher.Spec {
	return launcher.Spec{
		Name:       name,
		Labels:     map[string]string{launcher.LabelOwner: "true", launcher.LabelService: "svc", launcher.LabelVersion: "1", launcher.LabelReplicaID: name},
		Run:        "ferry replica-sim",
		Envs:       map[string]string{"HF_TOKEN": "hf_secret"},
		SecretEnvs: []string{"HF_TOKEN"},
		Port:       8000,
		Resources:  configs.Resources{Infra: "kubernetes", CPUs: cpus},
	}
}

// faultOptions are short timeouts, so that an outage shows within seconds, yet long enough for
// a loaded machine to answer in time while the API server is up.
func faultOptions(proxy *testcluster.APIProxy) Options {
	return Options{
		Kubeconfig:            proxy.Kubeconfig(),
		RequestTimeout:        3 * time.Second,
		WatchFailureThreshold: 2 * time.Second,
		ProvisionTimeout:      10 * time.Minute,
	}
}

// within runs f and fails the test when it took longer than limit.
func within(t *testing.T, what string, limit time.Duration, f func() error) error {
	t.Helper()
	began := time.Now()
	err := f()
	if d := time.Since(began); d > limit {
		t.Errorf("%s took %v, want at most %v", what, d, limit)
	}
	return err
}

func ids(insts []launcher.Instance) []string {
	out := make([]string, len(insts))
	for i, inst := range insts {
		out[i] = inst.ID
	}
	return out
}

// TestAPIServerStopped: the API server goes away mid-run (an APIProxy stopped). Launch and
// Terminate (and Check, CleanupJob, StreamLogs) fail at once with ErrUnavailable; List goes on returning the cached pods, and once
// the watch has failed for the threshold, with a whole-cluster gap — even for a pod deleted
// meanwhile, which it cannot know is gone. Back, List is complete and current again and
// Launch and Terminate work.
func TestAPIServerStopped(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "faults-p100-0", "Tesla-P100-PCIE-16GB", 4); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteNode(context.Background(), "faults-p100-0") })
	proxy := c.APIProxy(t)
	opts := faultOptions(proxy)
	p := newProvider(t, c, opts)

	kept, err := p.Launch(ctx, gpuSpec("svc-kept", "P100", 1))
	if err != nil {
		t.Fatal(err)
	}
	lost, err := p.Launch(ctx, gpuSpec("svc-lost", "P100", 1))
	if err != nil {
		t.Fatal(err)
	}
	if insts, err := p.List(ctx, nil); err != nil || !slices.Contains(ids(insts), kept.ID) || !slices.Contains(ids(insts), lost.ID) {
		t.Fatalf("List before the outage = %v, %v: want both pods, complete", ids(insts), err)
	}

	proxy.Stop()
	stopped := time.Now()
	bound := 3*opts.RequestTimeout + 5*time.Second

	err = within(t, "Launch with the API server down", bound, func() error {
		_, err := p.Launch(ctx, gpuSpec("svc-new", "P100", 1))
		return err
	})
	if !errors.Is(err, launcher.ErrUnavailable) || errors.Is(err, launcher.ErrNoCapacity) {
		t.Errorf("Launch with the API server down: %v, want ErrUnavailable", err)
	}
	err = within(t, "Terminate with the API server down", bound, func() error { return p.Terminate(ctx, kept.ID) })
	if !errors.Is(err, launcher.ErrUnavailable) {
		t.Errorf("Terminate with the API server down: %v, want ErrUnavailable", err)
	}
	err = within(t, "Check with the API server down", bound, func() error { return p.Check(ctx) })
	if !errors.Is(err, launcher.ErrUnavailable) {
		t.Errorf("Check with the API server down: %v, want ErrUnavailable", err)
	}
	err = within(t, "CleanupJob with the API server down", bound, func() error { return p.CleanupJob(ctx, "job-1") })
	if !errors.Is(err, launcher.ErrUnavailable) {
		t.Errorf("CleanupJob with the API server down: %v, want ErrUnavailable", err)
	}
	err = within(t, "StreamLogs with the API server down", bound, func() error {
		return p.StreamLogs(ctx, kept.ID, launcher.LogOptions{Tail: 10}, io.Discard)
	})
	if !errors.Is(err, launcher.ErrUnavailable) {
		t.Errorf("StreamLogs with the API server down: %v, want ErrUnavailable", err)
	}
	// Meanwhile the cluster changes behind Ferry's back.
	now := int64(0)
	if err := c.Client().CoreV1().Pods(p.Namespace()).Delete(ctx, lost.Name, metav1.DeleteOptions{GracePeriodSeconds: &now}); err != nil {
		t.Fatal(err)
	}

	var insts []launcher.Instance
	deadline := time.Now().Add(90 * time.Second)
	for {
		insts, err = p.List(ctx, nil)
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("List %v after the API server stopped %v ago: still complete", ids(insts), time.Since(stopped))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if d := time.Since(stopped); d < opts.WatchFailureThreshold {
		t.Errorf("List reported a gap %v after the outage began, before the threshold %v", d, opts.WatchFailureThreshold)
	}
	gaps, partial := launcher.Partial(err)
	if !partial || len(gaps) != 1 || gaps[0].Infra != p.Infra() || gaps[0].Region != "" || gaps[0].Zone != "" {
		t.Fatalf("List with the API server down: %v, want one whole-cluster gap", err)
	}
	if !errors.Is(err, launcher.ErrUnavailable) || !errors.Is(gaps[0].Err, launcher.ErrUnavailable) {
		t.Errorf("List's gap %v: want ErrUnavailable", err)
	}
	if !slices.Contains(ids(insts), kept.ID) || !slices.Contains(ids(insts), lost.ID) {
		t.Errorf("List with the API server down = %v: want the cached pods, %s and %s", ids(insts), kept.ID, lost.ID)
	}
	// The nodes are as unknown as the pods.
	deadline = time.Now().Add(90 * time.Second)
	for {
		_, err := p.Offerings(ctx)
		if errors.Is(err, launcher.ErrUnavailable) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Offerings with the API server down: %v, want ErrUnavailable", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	// The informer's watch retries with a back-off of up to a minute (client-go's).
	deadline = time.Now().Add(2 * time.Minute)
	for {
		insts, err = p.List(ctx, nil)
		if err == nil && !slices.Contains(ids(insts), lost.ID) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("List %v, %v, %v after the API server came back: want complete, without the deleted pod", ids(insts), err, time.Since(stopped))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !slices.Contains(ids(insts), kept.ID) {
		t.Errorf("List after the outage = %v: want %s", ids(insts), kept.ID)
	}
	// The nodes' watch comes back on its own back-off.
	for {
		_, err := p.Offerings(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Offerings after the outage: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	lctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	again, err := p.Launch(lctx, gpuSpec("svc-again", "P100", 1))
	if err != nil {
		t.Fatalf("Launch after the outage: %v", err)
	}
	for _, id := range []string{kept.ID, again.ID} {
		if err := p.Terminate(ctx, id); err != nil {
			t.Errorf("Terminate %s after the outage: %v", id, err)
		}
	}
}

// TestAPIServerHangs: an API server that accepts connections and never answers. Each call is
// cut by RequestTimeout and fails with ErrUnavailable, and the watch, which cannot be made
// again, makes List report the gap, though no connection was ever refused. Back, all works.
func TestAPIServerHangs(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "faults-b200-0", "NVIDIA-B200", 2); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteNode(context.Background(), "faults-b200-0") })
	proxy := c.APIProxy(t)
	opts := faultOptions(proxy)
	p := newProvider(t, c, opts)
	inst, err := p.Launch(ctx, gpuSpec("svc-hung", "B200", 1))
	if err != nil {
		t.Fatal(err)
	}

	if err := proxy.Hang(); err != nil {
		t.Fatal(err)
	}
	hung := time.Now()
	bound := 3*opts.RequestTimeout + 10*time.Second
	err = within(t, "Launch with the API server hung", bound, func() error {
		_, err := p.Launch(ctx, gpuSpec("svc-new", "B200", 1))
		return err
	})
	// Cut by RequestTimeout, or, when its first request raced Hang's cut of the open
	// connection, by that cut ("http2: client connection force closed", seen in CI): either
	// way the infra is unavailable, within the bound.
	if !errors.Is(err, launcher.ErrUnavailable) {
		t.Errorf("Launch with the API server hung: %v, want ErrUnavailable", err)
	}
	err = within(t, "Terminate with the API server hung", bound, func() error { return p.Terminate(ctx, inst.ID) })
	if !errors.Is(err, launcher.ErrUnavailable) {
		t.Errorf("Terminate with the API server hung: %v, want ErrUnavailable", err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		insts, err := p.List(ctx, nil)
		if gaps, partial := launcher.Partial(err); err != nil {
			if !partial || len(gaps) != 1 || !errors.Is(err, launcher.ErrUnavailable) || !slices.Contains(ids(insts), inst.ID) {
				t.Fatalf("List with the API server hung = %v, %v: want the cached pod and one gap", ids(insts), err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("List with the API server hung for %v: still complete", time.Since(hung))
		}
		time.Sleep(100 * time.Millisecond)
	}

	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(2 * time.Minute)
	for {
		insts, err := p.List(ctx, nil)
		if err == nil && slices.Contains(ids(insts), inst.ID) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("List after the hang = %v, %v: want complete", ids(insts), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Errorf("Terminate after the hang: %v", err)
	}
}

// TestLaunchWaitingWhenAPIServerStops: a launch waiting for its pod to be scheduled, when the
// API server goes away, fails with ErrUnavailable once its watch has failed for the threshold
// — not, ProvisionTimeout later, with a lack of capacity nobody saw.
func TestLaunchWaitingWhenAPIServerStops(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	proxy := c.APIProxy(t)
	opts := faultOptions(proxy)
	p := newProvider(t, c, opts)

	result := make(chan error, 1)
	go func() {
		_, err := p.Launch(ctx, cpuSpec("svc-waiting", "100000")) // no node has that many
		result <- err
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		pods, err := c.Client().CoreV1().Pods(p.Namespace()).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) > 0 && unschedulable(&pods.Items[0]) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no unschedulable pod in %s after 60s", p.Namespace())
		}
		time.Sleep(50 * time.Millisecond)
	}
	proxy.Stop()
	stopped := time.Now()
	select {
	case err := <-result:
		if !errors.Is(err, launcher.ErrUnavailable) || errors.Is(err, launcher.ErrNoCapacity) {
			t.Errorf("Launch waiting when the API server stopped: %v, want ErrUnavailable", err)
		}
		if d := time.Since(stopped); d < opts.WatchFailureThreshold {
			t.Errorf("Launch gave up %v after the outage began, before the threshold %v", d, opts.WatchFailureThreshold)
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("Launch still waiting 90s after the API server stopped (ProvisionTimeout %v)", opts.ProvisionTimeout)
	}
}

func unschedulable(pod *corev1.Pod) bool {
	c := podCondition(pod, corev1.PodScheduled)
	return c != nil && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable
}
