package kubernetes

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher"
)

func TestJudgeRequest(t *testing.T) {
	cond := func(typ string, status metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: "m"}
	}
	tests := map[string]struct {
		conds     []metav1.Condition
		wantState reqState
		wantWhy   string
	}{
		"new":         {wantState: reqWaiting, wantWhy: "not yet accepted by the cluster autoscaler"},
		"accepted":    {conds: []metav1.Condition{cond(condAccepted, "True", "Queued")}, wantState: reqWaiting, wantWhy: "accepted, waiting for capacity: Queued: m"},
		"provisioned": {conds: []metav1.Condition{cond(condAccepted, "True", "A"), cond(condProvisioned, "True", "Provisioned")}, wantState: reqProvisioned, wantWhy: "Provisioned: m"},
		"not yet":     {conds: []metav1.Condition{cond(condProvisioned, "False", "Waiting")}, wantState: reqWaiting, wantWhy: "not provisioned yet: Waiting: m"},
		"failed":      {conds: []metav1.Condition{cond(condFailed, "True", "NoFit")}, wantState: reqFailed, wantWhy: "NoFit: m"},
		"revoked after provisioned": {conds: []metav1.Condition{cond(condProvisioned, "True", "P"), cond(condCapacityRevoked, "True", "Reclaimed")},
			wantState: reqGone, wantWhy: "CapacityRevoked: Reclaimed: m"},
		"booking expired": {conds: []metav1.Condition{cond(condProvisioned, "True", "P"), cond(condBookingExpired, "True", "Expired")},
			wantState: reqGone, wantWhy: "BookingExpired: Expired: m"},
		"failed false is not failure": {conds: []metav1.Condition{cond(condFailed, "False", "Fine"), cond(condProvisioned, "True", "P")},
			wantState: reqProvisioned, wantWhy: "P: m"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			state, why := judgeRequest(&provReq{Status: provReqStatus{Conditions: tc.conds}})
			if state != tc.wantState || why != tc.wantWhy {
				t.Errorf("judgeRequest = %v, %q; want %v, %q", state, why, tc.wantState, tc.wantWhy)
			}
		})
	}
}

// queuedProvider is a provider on a context with queued provisioning of T4 nodes (perNode
// GPUs each, as Ferry's config says), with a provision timeout far shorter than the queue's
// delay: a queued gang must not be bound by it.
func queuedProvider(t *testing.T, c *testcluster.Cluster, perNode float64) *Provider {
	t.Helper()
	if err := c.InstallProvisioningRequestCRD(context.Background()); err != nil {
		t.Fatal(err)
	}
	return newProvider(t, c, Options{
		ProvisionTimeout:   time.Second,
		QueuedProvisioning: &configs.QueuedProvisioning{Class: configs.DefaultProvisioningClass, Accelerators: []configs.Accelerator{{Name: "T4", Count: perNode}}},
	})
}

func queuedJobSpec(t *testing.T, job string, attempt string) launcher.Spec {
	spec := jobSpec(t, job, "T4", "sleep 600")
	spec.Labels[launcher.LabelAttempt] = attempt
	spec.Name = job + "-" + attempt
	spec.Resources.Capacity = &configs.Capacity{Mode: configs.CapacityQueued, MaxRunDuration: 2 * time.Hour}
	return spec
}

// requests lists the job's ProvisioningRequests.
func requests(t *testing.T, p *Provider, job string) []*provReq {
	t.Helper()
	list, err := p.dyn.Resource(ProvisioningRequestGVR).Namespace(p.ns).List(context.Background(), metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{launcher.LabelJob: job}).String()})
	if err != nil {
		t.Fatal(err)
	}
	var out []*provReq
	for i := range list.Items {
		req, err := fromUnstructured(&list.Items[i])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, req)
	}
	return out
}

func jobPods(t *testing.T, c *testcluster.Cluster, p *Provider, job string) []corev1.Pod {
	t.Helper()
	pods, err := c.Client().CoreV1().Pods(p.ns).List(context.Background(), metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{launcher.LabelJob: job}).String()})
	if err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

// launchUntilPlaced calls LaunchGang as the jobs queue does, until it answers something other
// than ErrQueued; while it is queued, no pod of the job exists and there is one request.
func launchUntilPlaced(t *testing.T, c *testcluster.Cluster, p *Provider, spec launcher.Spec, n int) ([]launcher.Instance, error) {
	t.Helper()
	job := spec.Labels[launcher.LabelJob]
	deadline := time.Now().Add(90 * time.Second)
	for tries := 0; ; tries++ {
		insts, err := p.LaunchGang(context.Background(), spec, n)
		q, queued := launcher.AsQueued(err)
		if !queued {
			t.Logf("placed after %d queued answers", tries)
			return insts, err
		}
		if q.Since.IsZero() || !strings.Contains(q.Reason, "ProvisioningRequest") {
			t.Fatalf("queued answer %+v lacks since-when or the request", q)
		}
		if pods := jobPods(t, c, p, job); len(pods) > 0 {
			t.Fatalf("pod %s exists while the request is not provisioned", pods[0].Name)
		}
		if reqs := requests(t, p, job); len(reqs) != 1 {
			t.Fatalf("%d requests while queued, want 1", len(reqs))
		}
		if time.Now().After(deadline) {
			t.Fatalf("still queued: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestQueuedGangWaitsForProvisioning: a 2-node queued gang makes one PodTemplate and one
// ProvisioningRequest for both nodes, waits (ErrQueued, no pods, well past ProvisionTimeout)
// until the stand-in autoscaler provisions two nodes, then starts both pods there, consuming
// the request. When the capacity is revoked its pods read as preempted with the reason, and
// the next attempt gets a new request.
func TestQueuedGangWaitsForProvisioning(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	p := queuedProvider(t, c, 1)
	testcluster.StartKubelet(t, c, testcluster.KubeletOptions{})
	as := testcluster.StartAutoscaler(t, c, testcluster.AutoscalerOptions{Delay: 3 * time.Second, Namespace: p.ns, Pools: []testcluster.NodePool{
		{Name: "qp-t4", Label: LabelGKEAccelerator, Value: "nvidia-tesla-t4", GPUs: 1, MaxNodes: 2},
	}})

	insts, err := launchUntilPlaced(t, c, p, queuedJobSpec(t, "qjob", "1"), 2)
	if err != nil {
		t.Fatalf("LaunchGang: %v (stand-in: %v)", err, as.Events())
	}
	reqs := requests(t, p, "qjob")
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	req := reqs[0]
	wantSpec := provReqSpec{ProvisioningClassName: configs.DefaultProvisioningClass, PodSets: []provReqPodSet{{Count: 2}},
		Parameters: map[string]string{ParamMaxRunDuration: "7200"}}
	wantSpec.PodSets[0].PodTemplateRef.Name = req.Name
	if diff := cmp.Diff(wantSpec, req.Spec); diff != "" {
		t.Errorf("request spec (-want +got):\n%s", diff)
	}
	tmpl, err := c.Client().CoreV1().PodTemplates(p.ns).Get(ctx, req.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := describeAffinity(&corev1.Pod{Spec: tmpl.Template.Spec}); !strings.Contains(got, LabelGKEAccelerator+" in (nvidia-tesla-t4)") {
		t.Errorf("template affinity %q does not ask for the queued pool's label", got)
	}
	provisioned := metav1.Now()
	for _, cnd := range req.Status.Conditions {
		if cnd.Type == condProvisioned {
			provisioned = cnd.LastTransitionTime
		}
	}
	nodes := as.NodesOf(p.ns, req.Name)
	var onNodes []string
	for _, pod := range jobPods(t, c, p, "qjob") {
		if pod.Annotations[AnnotationConsumeProvReq] != req.Name || pod.Annotations[AnnotationProvClass] != configs.DefaultProvisioningClass {
			t.Errorf("pod %s annotations %v do not consume %s", pod.Name, pod.Annotations, req.Name)
		}
		if pod.CreationTimestamp.Before(&provisioned) {
			t.Errorf("pod %s created at %v, before Provisioned at %v", pod.Name, pod.CreationTimestamp, provisioned)
		}
		onNodes = append(onNodes, pod.Spec.NodeName)
	}
	slices.Sort(onNodes)
	if len(insts) != 2 || !slices.Equal(onNodes, nodes) {
		t.Fatalf("%d instances on nodes %v, want 2 on the provisioned nodes %v", len(insts), onNodes, nodes)
	}
	if req.Annotations[annotationConsumedBy] != "1" {
		t.Errorf("request not marked consumed by attempt 1: %v", req.Annotations)
	}
	if err := p.WithdrawQueued(ctx, "qjob", 1); err != nil {
		t.Fatal(err)
	}
	if got := requests(t, p, "qjob"); len(got) != 1 {
		t.Fatalf("WithdrawQueued dropped the request the running gang consumes")
	}

	// Revoked: the pods read as preempted with the reason; once reclaimed, the next attempt
	// replaces the spent request.
	if err := as.Revoke(ctx, p.ns, req.Name); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the revoked gang reads as preempted", func() bool {
		got, err := p.List(ctx, map[string]string{launcher.LabelJob: "qjob"})
		return err == nil && len(got) == 2 && !slices.ContainsFunc(got, func(i launcher.Instance) bool {
			return i.State != launcher.StatePreempted || !strings.Contains(i.Reason, "CapacityRevoked")
		})
	})
	if err := as.Reclaim(ctx, p.ns, req.Name); err != nil {
		t.Fatal(err)
	}
	for _, in := range insts {
		if err := p.Terminate(ctx, in.ID); err != nil {
			t.Fatal(err)
		}
	}
	insts, err = launchUntilPlaced(t, c, p, queuedJobSpec(t, "qjob", "2"), 2)
	if err != nil || len(insts) != 2 {
		t.Fatalf("relaunch: %v, %v (stand-in: %v)", insts, err, as.Events())
	}
	reqs = requests(t, p, "qjob")
	if len(reqs) != 1 || reqs[0].Name == req.Name || reqs[0].Annotations[annotationConsumedBy] != "2" {
		t.Fatalf("after the relaunch: requests %v, want one new one consumed by attempt 2", reqs)
	}

	if err := p.CleanupJob(ctx, "qjob"); err != nil {
		t.Fatal(err)
	}
	if reqs := requests(t, p, "qjob"); len(reqs) != 0 {
		t.Errorf("%d requests left after CleanupJob", len(reqs))
	}
	tmpls, err := c.Client().CoreV1().PodTemplates(p.ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(tmpls.Items) != 0 {
		t.Errorf("pod templates left after CleanupJob: %v, %v", tmpls, err)
	}
}

// TestQueuedGangRefused: a request the autoscaler cannot meet fails the launch with its
// reason, as a request error (no failover storm), and every later try answers the same from
// the kept request without making another.
func TestQueuedGangRefused(t *testing.T) {
	c := testcluster.Shared(t)
	p := queuedProvider(t, c, 4) // Ferry is told 4 per node; the pool has 1
	testcluster.StartAutoscaler(t, c, testcluster.AutoscalerOptions{Namespace: p.ns, Pools: []testcluster.NodePool{
		{Name: "qr-t4", Label: LabelGKEAccelerator, Value: "nvidia-tesla-t4", GPUs: 1, MaxNodes: 8},
	}})
	spec := queuedJobSpec(t, "refused", "1")
	spec.Resources.Accelerators[0].Count = 4
	_, err := launchUntilPlaced(t, c, p, spec, 2)
	if !errors.Is(err, launcher.ErrInvalid) || !strings.Contains(err.Error(), "NoNodePoolFits") {
		t.Fatalf("err = %v, want ErrInvalid with the autoscaler's reason", err)
	}
	spec = queuedJobSpec(t, "refused", "2")
	spec.Resources.Accelerators[0].Count = 4
	if _, err2 := p.LaunchGang(context.Background(), spec, 2); !errors.Is(err2, launcher.ErrInvalid) {
		t.Fatalf("next try: %v, want the same refusal", err2)
	}
	if reqs := requests(t, p, "refused"); len(reqs) != 1 {
		t.Fatalf("%d requests, want the one refused", len(reqs))
	}
	if pods := jobPods(t, c, p, "refused"); len(pods) != 0 {
		t.Fatalf("%d pods of a refused gang", len(pods))
	}
}

// TestWithdrawQueued: a gang that started elsewhere withdraws its waiting request here, with
// its template (TestQueuedGangWaitsForProvisioning checks that a consumed one is kept).
func TestWithdrawQueued(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	p := queuedProvider(t, c, 1)
	_, err := p.LaunchGang(ctx, queuedJobSpec(t, "elsewhere", "1"), 2) // no autoscaler: it waits
	if _, ok := launcher.AsQueued(err); !ok {
		t.Fatalf("LaunchGang: %v, want ErrQueued", err)
	}
	reqs := requests(t, p, "elsewhere")
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	if err := p.WithdrawQueued(ctx, "elsewhere", 1); err != nil {
		t.Fatal(err)
	}
	if got := requests(t, p, "elsewhere"); len(got) != 0 {
		t.Errorf("%d requests left after WithdrawQueued", len(got))
	}
	if _, err := c.Client().CoreV1().PodTemplates(p.ns).Get(ctx, reqs[0].Name, metav1.GetOptions{}); err == nil {
		t.Errorf("template %s left after WithdrawQueued", reqs[0].Name)
	}
}

// TestQueuedRequestAdoptedAfterRestart: a controller that restarts while its job waits finds
// the job's request and waits on it, rather than queueing a second time.
func TestQueuedRequestAdoptedAfterRestart(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	first := queuedProvider(t, c, 1)
	spec := queuedJobSpec(t, "adopted", "1")
	if _, err := first.LaunchGang(ctx, spec, 2); !errors.Is(err, launcher.ErrQueued) {
		t.Fatalf("LaunchGang: %v, want ErrQueued", err)
	}
	before := requests(t, first, "adopted")
	first.Close()
	second, err := New(first.opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Close)
	_, err = second.LaunchGang(ctx, spec, 2)
	if q, ok := launcher.AsQueued(err); !ok || !strings.Contains(q.Reason, before[0].Name) || !q.Since.Equal(before[0].CreationTimestamp.Time) {
		t.Fatalf("after the restart: %v, want ErrQueued on %s since its creation", err, before[0].Name)
	}
	if after := requests(t, second, "adopted"); len(after) != 1 || after[0].Name != before[0].Name {
		t.Fatalf("requests after the restart: %d, want the one made before", len(after))
	}
}
