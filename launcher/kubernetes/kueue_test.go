package kubernetes

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher"
)

// TestKueueQueuesGangs runs queued gangs through a Kueue LocalQueue (the stand-in in
// internal/testcluster: a real admission webhook gating the pods, and a quota of 2 GPUs): Ferry
// finds the LocalQueue, submits each 2-node gang as one pod group, and answers ErrQueued while
// its pods are gated. The first gang takes the quota and runs; the second stays queued while the
// first runs, and starts once it has ended.
func TestKueueQueuesGangs(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	for i := range 2 {
		if err := c.AddGPUNode(ctx, "kq-h200-"+strconv.Itoa(i), "NVIDIA-H200", 1); err != nil {
			t.Fatal(err)
		}
	}
	p := newProvider(t, c, Options{ProvisionTimeout: time.Second})
	testcluster.StartKubelet(t, c, testcluster.KubeletOptions{})
	if q, err := p.kueueQueue(ctx); err != nil || q != "" {
		t.Fatalf("before Kueue: queue %q, %v; want none", q, err)
	}
	kueue := testcluster.StartKueue(t, c, testcluster.KueueOptions{Namespace: p.ns, LocalQueue: "team-queue", GPUQuota: 2})
	p.kueue.at = time.Time{} // forget the detection above
	if q, err := p.kueueQueue(ctx); err != nil || q != "team-queue" {
		t.Fatalf("queue %q, %v; want team-queue", q, err)
	}

	release := filepath.Join(t.TempDir(), "release")
	spec := func(job, attempt, run string) launcher.Spec {
		s := jobSpec(t, job, "H200", run)
		s.Name, s.Labels[launcher.LabelAttempt] = job+"-"+attempt, attempt
		s.Resources.Capacity = &configs.Capacity{Mode: configs.CapacityQueued}
		return s
	}
	first := spec("kfirst", "1", `while [ ! -e "`+release+`" ]; do sleep 0.1; done`)
	_, err := p.LaunchGang(ctx, first, 2)
	if q, ok := launcher.AsQueued(err); !ok || !strings.Contains(q.Reason, "team-queue") {
		t.Fatalf("submit: %v, want ErrQueued naming the LocalQueue", err)
	}
	for _, pod := range jobPods(t, c, p, "kfirst") {
		if pod.Labels[LabelKueueQueue] != "team-queue" || pod.Labels[LabelKueuePodGroup] != "ferry-kfirst-1" ||
			pod.Annotations[AnnotationKueueGroupSize] != "2" {
			t.Errorf("pod %s: labels %v annotations %v lack Kueue's pod group", pod.Name, pod.Labels, pod.Annotations)
		}
		// Gated at creation (the stand-in may have admitted the group since).
		if !slices.ContainsFunc(kueue.Events(), func(e string) bool { return strings.HasSuffix(e, "gated pod "+pod.Name+" of group ferry-kfirst-1") }) {
			t.Errorf("pod %s was not gated by the webhook: %v", pod.Name, kueue.Events())
		}
	}
	// The jobs queue tries again with its next attempt number.
	insts, err := kueueLaunchUntilPlaced(t, p, spec("kfirst", "2", first.Run), 2, nil)
	if err != nil || len(insts) != 2 {
		t.Fatalf("first gang: %v, %v (Kueue: %v)", insts, err, kueue.Events())
	}
	for _, in := range insts {
		if in.Labels[launcher.LabelAttempt] != "2" || in.State != launcher.StateRunning {
			t.Errorf("instance %s: attempt %s, state %s; want attempt 2, running", in.ID, in.Labels[launcher.LabelAttempt], in.State)
		}
	}

	second := spec("ksecond", "1", "exit 0")
	queuedWhileFirstRuns := 0
	insts, err = kueueLaunchUntilPlaced(t, p, second, 2, func() {
		got, err := p.List(ctx, map[string]string{launcher.LabelJob: "kfirst"})
		if err == nil && len(got) == 2 && got[0].State == launcher.StateRunning && got[1].State == launcher.StateRunning {
			if queuedWhileFirstRuns++; queuedWhileFirstRuns == 5 {
				if err := os.WriteFile(release, nil, 0o600); err != nil {
					t.Error(err)
				}
			}
		}
	})
	if err != nil || len(insts) != 2 {
		t.Fatalf("second gang: %v, %v (Kueue: %v)", insts, err, kueue.Events())
	}
	if queuedWhileFirstRuns < 5 {
		t.Errorf("the second gang was queued %d times while the first ran; want it held until the first ended", queuedWhileFirstRuns)
	}
	ended := waitEnded(t, p, "kfirst", 2)
	if slices.ContainsFunc(ended, func(i launcher.Instance) bool { return exitOf(i) != "0" }) {
		t.Errorf("first gang ended %v", ended)
	}
}

// kueueLaunchUntilPlaced calls LaunchGang until it answers something other than ErrQueued,
// calling whileQueued after each queued answer.
func kueueLaunchUntilPlaced(t *testing.T, p *Provider, spec launcher.Spec, n int, whileQueued func()) ([]launcher.Instance, error) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		insts, err := p.LaunchGang(context.Background(), spec, n)
		if _, queued := launcher.AsQueued(err); !queued {
			return insts, err
		}
		if time.Now().After(deadline) {
			t.Fatalf("still queued: %v", err)
		}
		if whileQueued != nil {
			whileQueued()
		}
		time.Sleep(200 * time.Millisecond)
	}
}
