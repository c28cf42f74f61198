package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/internal/testcluster"
)

const shareYAML = `name: share
resources:
  infra: kubernetes
  accelerators: L40S:0.25
  gpu_share:
    node_policy: binpack
envs:
  REPLICA_SIM_ARGS: --model ferry-sim-1b
service:
  readiness_probe: /health
  replicas: 2
  ports: 8080
run: ferry replica-sim --port $FERRY_PORT
`

// TestKubernetesGPUShare goes through the CLI: a quarter-GPU service is refused (dry run
// included) while no node shares GPUs, then, with HAMi nodes and a binpacking scheduler named
// hami-scheduler (testcluster.StartSharingScheduler stands in for HAMi's), show-gpus lists the
// shared capacity, the service's replicas share one node's GPU and serve, and show-gpus counts
// what they took.
func TestKubernetesGPUShare(t *testing.T) {
	k := newKubeEnv(t, "", 0, 0, 5)
	file := filepath.Join(t.TempDir(), "share.yaml")
	writeFile(t, file, shareYAML)
	ctxName := "kubernetes/" + k.cluster.Context()

	ctx := context.Background()
	// An L40S node without HAMi: the context has the GPU but cannot share it.
	if err := k.cluster.AddGPUNode(ctx, "e2e-plain-l40s", "NVIDIA-L40S", 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.cluster.DeleteNode(context.Background(), "e2e-plain-l40s") })
	out, errOut, err := k.run("serve", "up", file, "--dry-run")
	if err == nil || !strings.Contains(out+errOut, ctxName+" cannot share L40S GPUs: no L40S node advertises HAMi") {
		t.Fatalf("dry run without sharing nodes: err %v\nstdout:\n%s\nstderr:\n%s\nwant the context named and why", err, out, errOut)
	}

	if err := k.cluster.StartSharingScheduler(ctx, map[string]string{"hami-scheduler": testcluster.Binpack}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"e2e-hami-0", "e2e-hami-1"} {
		if err := k.cluster.AddHAMiNode(ctx, n, "NVIDIA-L40S", 1, 46068); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k.cluster.DeleteNode(context.Background(), n) })
	}
	out = k.mustRun("show-gpus", "l40s", "--infra", "kubernetes")
	if !strings.Contains(out, "Shared GPUs on "+ctxName) || !hasRow(out, "e2e-hami-0 L40S 1 46068 / 46068 MiB 100 / 100% 0") {
		t.Fatalf("show-gpus lacks the shared capacity of e2e-hami-0:\n%s", out)
	}

	t.Logf("dry run without sharing nodes:\n%s", errOut)
	out = k.mustRun("serve", "up", file, "-y")
	if !strings.Contains(out, "2/2 READY") {
		t.Fatalf("serve up:\n%s", out)
	}
	pods := k.pods("share")
	if len(pods) != 2 || pods[0].Spec.NodeName != pods[1].Spec.NodeName || pods[0].Spec.SchedulerName != "hami-scheduler" {
		var where []string
		for _, p := range pods {
			where = append(where, p.Name+" on "+p.Spec.NodeName+" by "+p.Spec.SchedulerName)
		}
		t.Fatalf("pods %v: want 2, by hami-scheduler, binpacked on one node", where)
	}
	st, err := k.status("share")
	if err != nil {
		t.Fatal(err)
	}
	chatPlain(t, st.Endpoint) // served by a pod that shares a GPU

	out = k.mustRun("show-gpus", "--infra", "kubernetes")
	t.Logf("show-gpus after launch:\n%s", out)
	if want := pods[0].Spec.NodeName + " L40S 1 23034 / 46068 MiB 50 / 100% 2"; !hasRow(out, want) {
		t.Fatalf("show-gpus after launch lacks %q:\n%s", want, out)
	}
	k.mustRun("serve", "down", "share", "-y")
}

// hasRow reports a line of out whose fields, single-spaced, are row.
func hasRow(out, row string) bool {
	for _, line := range strings.Split(out, "\n") {
		if strings.Join(strings.Fields(line), " ") == row {
			return true
		}
	}
	return false
}
