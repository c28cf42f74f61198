package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// efaJob is SkyPilot's examples/aws_efa/nccl_efa.yaml on the test cluster's T4s: its config as
// written (four EFA devices per pod), with the toleration and node selector an EFA node pool
// asks for and the env NCCL reads; the run says what each rank sees and waits for the marker.
const efaJob = `# from skypilot-org/skypilot examples/aws_efa/nccl_efa.yaml (Apache 2.0): resources and run adapted
name: nccl-efa-eks

resources:
  infra: k8s
  accelerators: T4:1

num_nodes: 2

envs:
  USE_EFA: "true"

run: |
  echo "rank $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES: FI_PROVIDER=$FI_PROVIDER USE_EFA=$USE_EFA"
  while [ ! -f %s ]; do sleep 0.2; done

config:
  kubernetes:
    pod_config:
      spec:
        nodeSelector:
          efa.ferry.test/run: %q
        tolerations:
        - key: vpc.amazonaws.com/efa
          operator: Exists
          effect: NoSchedule
        containers:
        - resources:
            limits:
              vpc.amazonaws.com/efa: 4
            requests:
              vpc.amazonaws.com/efa: 4
          env:
          - name: FI_PROVIDER
            value: efa
`

// taintEFA is the taint of the test's EFA nodes: only pods that tolerate it land there.
var taintEFA = corev1.Taint{Key: "vpc.amazonaws.com/efa", Value: "true", Effect: corev1.TaintEffectNoSchedule}

// TestPodConfigJobOnTheCluster: SkyPilot's EFA example runs unchanged in its config: --dry-run
// says what pod_config does, and on the real scheduler each pod asks for its EFA devices,
// tolerates the EFA nodes' taint and lands on them (the only nodes with both the label and the
// devices), and its program sees pod_config's env beside the task's.
func TestPodConfigJobOnTheCluster(t *testing.T) {
	k, nodes := isolatedKubeEnv(t, 2)
	k.extraEnv = append(k.extraEnv, "FERRY_JOB_RETRY_INTERVAL=1s", "FERRY_JOB_WATCH_INTERVAL=200ms")
	ctx := context.Background()
	run := "efa-" + strconv.FormatInt(time.Now().UnixNano()%1e10, 36)
	for _, name := range nodes {
		node, err := k.cluster.Client().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Labels["efa.ferry.test/run"] = run
		node.Spec.Taints = append(node.Spec.Taints, taintEFA)
		if node, err = k.cluster.Client().CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		efa := *resource.NewQuantity(4, resource.DecimalSI)
		node.Status.Capacity["vpc.amazonaws.com/efa"], node.Status.Allocatable["vpc.amazonaws.com/efa"] = efa, efa
		if _, err := k.cluster.Client().CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	marker := filepath.Join(t.TempDir(), "done")
	file := filepath.Join(t.TempDir(), "nccl_efa.yaml")
	writeFile(t, file, fmt.Sprintf(efaJob, marker, run))

	plan := k.mustRun("jobs", "launch", file, "--dry-run")
	if !strings.Contains(plan, "Note: config.kubernetes: pod_config is merged into each pod") || !strings.Contains(plan, "vpc.amazonaws.com/efa: 4") {
		t.Errorf("--dry-run does not show or say what pod_config does:\n%s", plan)
	}

	id := k.launchDetached(file)
	k.waitJob(id, 2*time.Minute, "runs on 2 nodes", func(j jobView) bool { return j.State == "RUNNING" && len(j.Nodes) == 2 })
	pods, err := k.cluster.Client().CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{LabelSelector: "ferry.job=" + strconv.FormatInt(id, 10)})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 2 {
		t.Fatalf("%d pods, want 2", len(pods.Items))
	}
	for _, p := range pods.Items {
		c := p.Spec.Containers[0]
		if q := c.Resources.Limits["vpc.amazonaws.com/efa"]; q.Value() != 4 {
			t.Errorf("pod %s: EFA limit %v", p.Name, q.String())
		}
		if q := c.Resources.Limits["nvidia.com/gpu"]; q.Value() != 1 {
			t.Errorf("pod %s: GPU limit %v: Ferry's own request must stay", p.Name, q.String())
		}
		if !strings.HasPrefix(p.Spec.NodeName, nodes[0][:len(nodes[0])-1]) {
			t.Errorf("pod %s on %s, not an EFA node", p.Name, p.Spec.NodeName)
		}
	}
	for rank := range 2 {
		eventually(t, time.Minute, "rank sees pod_config's env", func() (bool, string) {
			out, _, _ := k.run("jobs", "logs", strconv.FormatInt(id, 10), "--node", strconv.Itoa(rank))
			return strings.Contains(out, fmt.Sprintf("rank %d of 2: FI_PROVIDER=efa USE_EFA=true", rank)), lastLines(out, 2)
		})
	}
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	k.waitJob(id, 2*time.Minute, "succeeds", func(j jobView) bool { return j.State == "SUCCEEDED" && len(j.Nodes) == 0 })
}
