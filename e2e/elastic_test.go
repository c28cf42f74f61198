package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/internal/testcluster"
)

// isolatedKubeEnv is a Ferry home on the shared test cluster with nodes of its own: n kwok
// nodes of one T4 each, named uniquely for this run and deleted with the test, in a namespace of
// its own, so that the test's capacity is what it says whatever else ran on the cluster.
func isolatedKubeEnv(t *testing.T, n int) (*kubeEnv, []string) {
	t.Helper()
	c := testcluster.Shared(t)
	ctx := context.Background()
	run := strconv.FormatInt(time.Now().UnixNano()%1e10, 36)
	var nodes []string
	for i := range n {
		name := fmt.Sprintf("t4-%s-%d", run, i)
		if err := c.AddGPUNode(ctx, name, "Tesla-T4", 1); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, name)
		t.Cleanup(func() { _ = c.Client().CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	ns := "elastic-" + run
	if _, err := c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Client().CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	testcluster.StartKubelet(t, c, testcluster.KubeletOptions{FerryBin: ferryBin})
	e := newEnv(t)
	writeFile(t, filepath.Join(e.home, "config.yaml"), fmt.Sprintf(`kubernetes:
  kubeconfig: %s
  contexts:
    - name: %s
      namespace: %s
`, c.Kubeconfig(), c.Context(), ns))
	return &kubeEnv{env: e, cluster: c, ns: ns}, nodes
}

// cordon marks nodes unschedulable (or schedulable again), as `kubectl cordon` does.
func (k *kubeEnv) cordon(unschedulable bool, nodes ...string) {
	k.t.Helper()
	patch := fmt.Appendf(nil, `{"spec":{"unschedulable":%t}}`, unschedulable)
	for _, n := range nodes {
		if _, err := k.cluster.Client().CoreV1().Nodes().Patch(context.Background(), n, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
			k.t.Fatal(err)
		}
	}
}

// elasticView is what `jobs queue --json` says of an elastic job beyond jobView.
type elasticView struct {
	GangSize int `json:"gang_size"`
	Resizes  int `json:"resizes"`
}

func (e *env) elasticOf(id int64) elasticView {
	e.t.Helper()
	var list []struct {
		ID int64 `json:"id"`
		elasticView
	}
	if err := json.Unmarshal([]byte(e.mustRun("jobs", "queue", "--all", "--json")), &list); err != nil {
		e.t.Fatal(err)
	}
	for _, j := range list {
		if j.ID == id {
			return j.elasticView
		}
	}
	e.t.Fatalf("no job %d", id)
	return elasticView{}
}

// elasticWorkers is SkyPilot's elastic-training workers (DYNAMIC_NODE_SET, min nodes) on the
// cluster's T4s, with SkyPilot's config.kubernetes.provision_timeout so that a gang that does
// not fit is known in seconds: each rank says its rank and gang size, rank 0 counts the gangs
// on the checkpoint claim, and all run until the marker file exists.
const elasticWorkers = `name: workers
num_nodes: 4
resources:
  infra: kubernetes
  accelerators: T4:1
  job_recovery:
    strategy: DYNAMIC_NODE_SET
    min_nodes: 2
job: {grace_period_seconds: 2}
config:
  kubernetes:
    provision_timeout: 3
run: |
  echo "rank $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES"
  if [ "$SKYPILOT_NODE_RANK" = 0 ]; then
    n=$(cat "$FERRY_CHECKPOINT_DIR/gangs" 2>/dev/null || echo 0)
    echo $((n+1)) > "$FERRY_CHECKPOINT_DIR/gangs"
    echo "gang number $((n+1))"
  fi
  while [ ! -f %s ]; do sleep 0.2; done
`

// TestElasticJobOnTheCluster: on the real API server and scheduler, a 4-node elastic job
// (DYNAMIC_NODE_SET, min_nodes 2) whose cluster has two of its four T4 nodes cordoned runs on
// two; uncordoned, it grows back to four (its gang restarted at four, resuming from its claim);
// a pod lost while one node is cordoned brings it back on three; done, it succeeds.
func TestElasticJobOnTheCluster(t *testing.T) {
	k, nodes := isolatedKubeEnv(t, 4)
	k.extraEnv = append(k.extraEnv, "FERRY_JOB_RETRY_INTERVAL=1s", "FERRY_JOB_WATCH_INTERVAL=200ms")
	k.cordon(true, nodes[2], nodes[3])
	marker := filepath.Join(t.TempDir(), "done")
	file := filepath.Join(t.TempDir(), "workers.yaml")
	writeFile(t, file, fmt.Sprintf(elasticWorkers, marker))
	submitted := time.Now()
	id := k.launchDetached(file)
	idStr := strconv.FormatInt(id, 10)

	small := k.waitJob(id, 2*time.Minute, "runs on 2 of 4", func(j jobView) bool { return j.State == "RUNNING" && len(j.Nodes) == 2 })
	t.Logf("figure: running on 2 of 4 nodes %v after submission (sizes 4 and 3 each unschedulable for provision_timeout 3s)", time.Since(submitted).Round(100*time.Millisecond))
	if !strings.Contains(small.Reason, "2 of 4 node(s)") || k.elasticOf(id).GangSize != 2 {
		t.Errorf("small gang: %q, %+v", small.Reason, k.elasticOf(id))
	}
	eventually(t, time.Minute, "rank 1 of 2 runs", func() (bool, string) {
		out, _, _ := k.run("jobs", "logs", idStr, "--node", "1")
		return strings.Contains(out, "rank 1 of 2"), lastLines(out, 2)
	})

	k.cordon(false, nodes[2], nodes[3])
	uncordoned := time.Now()
	k.waitJob(id, 2*time.Minute, "grows to 4", func(j jobView) bool { return j.State == "RUNNING" && len(j.Nodes) == 4 })
	t.Logf("figure: running on 4 nodes %v after capacity returned (grow interval 4s: FERRY_JOB_RETRY_INTERVAL=1s)", time.Since(uncordoned).Round(100*time.Millisecond))
	if ev := k.elasticOf(id); ev.Resizes != 1 || ev.GangSize != 4 {
		t.Errorf("after growing: %+v, want one resize to 4", ev)
	}
	eventually(t, time.Minute, "the 4-node gang runs, resumed from the claim", func() (bool, string) {
		r3, _, _ := k.run("jobs", "logs", idStr, "--node", "3")
		r0, _, _ := k.run("jobs", "logs", idStr, "--node", "0")
		return strings.Contains(r3, "rank 3 of 4") && strings.Contains(r0, "gang number 2"), lastLines(r0, 2) + " | " + lastLines(r3, 2)
	})

	// A pod lost while only three nodes take pods: back on three.
	big := k.job(id)
	k.cordon(true, nodes[3])
	pods, err := k.cluster.Client().CoreV1().Pods(k.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "ferry.job=" + idStr})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Labels["ferry.node-rank"] == "3" && p.DeletionTimestamp == nil {
			if err := k.cluster.Client().CoreV1().Pods(k.ns).Delete(context.Background(), p.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	lost := time.Now()
	three := k.waitJob(id, 3*time.Minute, "recovers on 3", func(j jobView) bool {
		return j.State == "RUNNING" && len(j.Nodes) == 3 && j.Recoveries == big.Recoveries+1
	})
	t.Logf("figure: running on 3 nodes %v after a pod was deleted with one node cordoned", time.Since(lost).Round(100*time.Millisecond))
	if !strings.Contains(three.Reason, "3 of 4 node(s)") {
		t.Errorf("reason %q", three.Reason)
	}

	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	done := k.waitJob(id, 2*time.Minute, "succeeds", func(j jobView) bool { return j.State == "SUCCEEDED" && len(j.Nodes) == 0 })
	if fmt.Sprint(done.ExitCodes) != "[0 0 0]" {
		t.Errorf("exit codes %v, want the 3-node gang's", done.ExitCodes)
	}
}
