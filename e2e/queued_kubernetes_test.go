package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher/kubernetes"
)

// queuedJob is a 2-node job that queues for its T4s.
const queuedJob = `name: %s
num_nodes: 2
resources:
  infra: kubernetes
  accelerators: T4:1
  capacity: {mode: queued, max_run_duration: 1h}
job: {priority: 500, grace_period_seconds: 5}
run: |
  echo "rank $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES on $FERRY_HOST"
  sleep 1
`

// TestKubernetesQueuedProvisioning, on the real API server with the ProvisioningRequest CRD and
// the stand-in cluster autoscaler (internal/testcluster): the context is marked as having
// queued provisioning of T4 nodes, and has none yet.
//
//  1. A 2-node queued job waits PENDING, saying it is queued on its ProvisioningRequest and
//     since when — not FAILED, and with no pod made, well past provision_timeout — until the
//     stand-in adds two nodes; then both pods are created at once, consuming the request, run
//     on those two nodes, and the job succeeds. Its request and template are deleted with it.
//  2. A queued job the autoscaler refuses (its pool has no nodes left) fails FAILED_NO_RESOURCE
//     with the autoscaler's reason, and no pod is made.
func TestKubernetesQueuedProvisioning(t *testing.T) {
	const provisionTimeout = 2 // seconds
	k := newKubeEnv(t, "none", 0, 0, provisionTimeout)
	ctx := context.Background()
	if err := k.cluster.InstallProvisioningRequestCRD(ctx); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(k.home, "config.yaml")
	cfg, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, cfgPath, strings.Replace(string(cfg), "      namespace: "+k.ns+"\n",
		"      namespace: "+k.ns+"\n      queued_provisioning: {accelerators: [T4:1]}\n", 1))
	k.extraEnv = []string{"FERRY_JOB_RETRY_INTERVAL=1s", "FERRY_JOB_WATCH_INTERVAL=200ms"}
	const delay = 4 * provisionTimeout * time.Second
	as := testcluster.StartAutoscaler(t, k.cluster, testcluster.AutoscalerOptions{Delay: delay, Namespace: k.ns, Pools: []testcluster.NodePool{
		{Name: "qe-t4", Label: kubernetes.LabelGKEAccelerator, Value: "nvidia-tesla-t4", GPUs: 1, MaxNodes: 2},
	}})
	dyn, err := dynamic.NewForConfig(k.cluster.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	requests := func(job int64) []unstructured.Unstructured {
		list, err := dyn.Resource(kubernetes.ProvisioningRequestGVR).Namespace(k.ns).List(ctx, metav1.ListOptions{LabelSelector: "ferry.job=" + strconv.FormatInt(job, 10)})
		if err != nil {
			t.Fatal(err)
		}
		return list.Items
	}
	jobPods := func(job int64) int {
		list, err := k.cluster.Client().CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{LabelSelector: "ferry.job=" + strconv.FormatInt(job, 10)})
		if err != nil {
			t.Fatal(err)
		}
		return len(list.Items)
	}
	dir := t.TempDir()
	task := func(name string) string {
		f := filepath.Join(dir, name+".yaml")
		writeFile(t, f, fmt.Sprintf(queuedJob, name))
		return f
	}

	// 1. Waits in the queue, then starts all at once on the provisioned nodes.
	launched := time.Now()
	id := k.launchDetached(task("queued"))
	j := k.waitJob(id, time.Minute, "queued on its ProvisioningRequest", func(j jobView) bool {
		return j.State == "PENDING" && strings.Contains(j.Reason, "queued") && strings.Contains(j.Reason, "ProvisioningRequest") &&
			strings.Contains(j.Reason, "since ")
	})
	t.Logf("waiting: %s", j.Reason)
	pastTimeout := false
	var req unstructured.Unstructured
	eventually(t, 2*time.Minute, "the stand-in provisions the request", func() (bool, string) {
		reqs := requests(id)
		if len(reqs) != 1 {
			t.Fatalf("%d requests for one queued job", len(reqs))
		}
		req = reqs[0]
		provisioned := len(as.NodesOf(k.ns, req.GetName())) == 2
		if !provisioned {
			// Still queued: PENDING (never FAILED), and not one pod made.
			if j := k.job(id); j.State != "PENDING" {
				t.Fatalf("job is %s (%s) while its request waits", j.State, j.Reason)
			}
			if n := jobPods(id); n != 0 {
				t.Fatalf("%d pods exist before the request is provisioned", n)
			}
			pastTimeout = pastTimeout || time.Since(launched) > 2*provisionTimeout*time.Second
		}
		return provisioned, fmt.Sprint(as.Events())
	})
	if !pastTimeout {
		t.Errorf("the job was not seen waiting past twice provision_timeout")
	}
	sets, _, _ := unstructured.NestedSlice(req.Object, "spec", "podSets")
	if len(sets) != 1 || sets[0].(map[string]any)["count"] != int64(2) {
		t.Errorf("podSets %v, want one of count 2 for the gang", sets)
	}
	if p, _, _ := unstructured.NestedString(req.Object, "spec", "parameters", kubernetes.ParamMaxRunDuration); p != "3600" {
		t.Errorf("maxRunDurationSeconds %q, want 3600 from max_run_duration", p)
	}
	run := k.waitJob(id, time.Minute, "runs on the provisioned nodes", func(j jobView) bool { return j.State == "RUNNING" || j.State == "SUCCEEDED" })
	t.Logf("running: %s", run.Reason)
	pods, err := k.cluster.Client().CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{LabelSelector: "ferry.job=" + strconv.FormatInt(id, 10)})
	if err != nil {
		t.Fatal(err)
	}
	cur, err := dyn.Resource(kubernetes.ProvisioningRequestGVR).Namespace(k.ns).Get(ctx, req.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	provisionedAt := provisionedTime(t, cur)
	var nodes []string
	for _, p := range pods.Items {
		if p.CreationTimestamp.Time.Before(provisionedAt) {
			t.Errorf("pod %s created at %v, before the request was Provisioned at %v", p.Name, p.CreationTimestamp, provisionedAt)
		}
		if p.Annotations[kubernetes.AnnotationConsumeProvReq] != req.GetName() {
			t.Errorf("pod %s does not consume %s: %v", p.Name, req.GetName(), p.Annotations)
		}
		nodes = append(nodes, p.Spec.NodeName)
	}
	slices.Sort(nodes)
	if want := as.NodesOf(k.ns, req.GetName()); !slices.Equal(nodes, want) {
		t.Errorf("pods on %v, want one on each provisioned node %v", nodes, want)
	}
	k.waitJob(id, 2*time.Minute, "succeeds", func(j jobView) bool { return j.State == "SUCCEEDED" && len(j.Nodes) == 0 })
	for rank := range 2 {
		out := k.mustRun("jobs", "logs", strconv.FormatInt(id, 10), "--node", strconv.Itoa(rank))
		if !strings.Contains(out, fmt.Sprintf("rank %d of 2", rank)) {
			t.Errorf("node %d's log:\n%s", rank, out)
		}
	}
	eventually(t, time.Minute, "its request is deleted with the job", func() (bool, string) {
		return len(requests(id)) == 0, ""
	})

	// 2. Refused: the pool's two nodes are taken.
	refused := k.launchDetached(task("refused"))
	f := k.waitJob(refused, time.Minute, "fails with the autoscaler's reason", func(j jobView) bool { return j.State == "FAILED_NO_RESOURCE" })
	if !strings.Contains(f.Reason, "refused") || !strings.Contains(f.Reason, "pool qe-t4 has 0 of 2 node(s) left") {
		t.Errorf("reason %q lacks the refusal and why", f.Reason)
	}
	if n := jobPods(refused); n != 0 {
		t.Errorf("%d pods of a refused job", n)
	}
}

// provisionedTime is when req's Provisioned condition became True.
func provisionedTime(t *testing.T, req *unstructured.Unstructured) time.Time {
	t.Helper()
	conds, _, _ := unstructured.NestedSlice(req.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Provisioned" && m["status"] == "True" {
			at, err := time.Parse(time.RFC3339, fmt.Sprint(m["lastTransitionTime"]))
			if err != nil {
				t.Fatal(err)
			}
			return at
		}
	}
	t.Fatalf("request %s is not Provisioned: %v", req.GetName(), conds)
	return time.Time{}
}
