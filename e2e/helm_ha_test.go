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

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// haChartServiceYAML uses every per-pod object the launcher writes beside a pod: the
// environment Secret (secrets:), and the files Secret (workdir: and a file_mounts copy).
const haChartServiceYAML = `name: ha-chart-svc
resources:
  infra: kubernetes
  accelerators: T4:1
envs:
  REPLICA_SIM_ARGS: --model ferry-sim-1b
secrets:
  HA_CHART_TOKEN: null
workdir: WORKDIR
file_mounts:
  ~/mounted/extra.txt: EXTRA
service:
  readiness_probe: /health
  replicas: 1
  ports: 8080
run: ferry replica-sim --port $FERRY_PORT --model ferry-sim-1b
`

const haChartJobYAML = `name: ha-chart-job
resources:
  infra: kubernetes
  accelerators: T4:1
job: {priority: 500}
workdir: WORKDIR
file_mounts:
  ~/mounted/extra.txt: EXTRA
secrets:
  HA_CHART_JOB_TOKEN: null
run: |
  echo hello-from-the-ha-chart
  cat note.txt ~/mounted/extra.txt
  sleep 600
`

// TestChartDefaultRunsUnderHA installs what the chart renders with its default values (leader
// election on, so both fencing policies in force) on the test cluster, and runs a controller
// elected through the chart's Lease, as the chart's ServiceAccount, on the Kubernetes store: a
// service with secrets:, workdir: and file_mounts comes up READY and a job with the same runs
// and reads its files, though the launcher labels their Secrets app.kubernetes.io/managed-by=ferry
// as the store labels its records (the fence selected them all once, and refused them for
// carrying no term). The fence still refuses a write to a store record without the current term.
func TestChartDefaultRunsUnderHA(t *testing.T) {
	k := newKubeEnv(t, "Tesla-T4", 1, 2, 30)
	ctx := context.Background()
	installChartDefaults(t, ctx, k)
	sa := "system:serviceaccount:" + k.ns + ":ferry"
	kubeconfig := impersonatingKubeconfig(t, k.cluster.Kubeconfig(), k.cluster.Context(), sa)

	shared := shortTempDir(t, "ferry-hachart-local-")
	ctl := newHAController(t, k.cluster, k.ns, "ctl-chart", shared)
	for i, a := range ctl.args {
		if a == "--kubeconfig" {
			ctl.args[i+1] = kubeconfig // the store and the Lease as the chart's ServiceAccount
		}
	}
	ctl.extraEnv = []string{"FERRY_JOB_RETRY_INTERVAL=1s", "FERRY_JOB_WATCH_INTERVAL=200ms"}
	writeFile(t, filepath.Join(ctl.home, "config.yaml"), `kubernetes:
  kubeconfig: `+kubeconfig+`
  provision_timeout_seconds: 30
  contexts:
    - name: `+k.cluster.Context()+`
      namespace: `+k.ns+`
`)
	ctl.start()
	t.Cleanup(func() { cleanupHA(t, shared, ctl) })
	eventually(t, 30*time.Second, "ctl-chart leads", func() (bool, string) {
		return leaseHolder(k.cluster, k.ns) == "ctl-chart", leaseHolder(k.cluster, k.ns)
	})

	dir := t.TempDir()
	workdir := filepath.Join(dir, "work")
	if err := os.Mkdir(workdir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(workdir, "note.txt"), "note-from-the-workdir\n")
	extra := filepath.Join(dir, "extra.txt")
	writeFile(t, extra, "extra-from-file-mounts\n")
	fill := strings.NewReplacer("WORKDIR", workdir, "EXTRA", extra)
	writeFile(t, filepath.Join(dir, "svc.yaml"), fill.Replace(haChartServiceYAML))
	writeFile(t, filepath.Join(dir, "job.yaml"), fill.Replace(haChartJobYAML))
	defer ctl.stopJobs()

	if out := ctl.mustRun("serve", "up", filepath.Join(dir, "svc.yaml"), "--secret", "HA_CHART_TOKEN=not-a-real-token", "-y"); !strings.Contains(out, "1/1 READY") {
		t.Fatalf("serve up under the chart's fence:\n%s", out)
	}
	pods := k.pods("ha-chart-svc")
	if len(pods) != 1 {
		t.Fatalf("%d pods of ha-chart-svc, want 1", len(pods))
	}
	for _, suffix := range []string{"-env", "-files"} {
		name := pods[0].Name + suffix
		sec, err := k.cluster.Client().CoreV1().Secrets(k.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("the pod's Secret %s: %v", name, err)
			continue
		}
		// The case this test is about: the launcher's objects carry the label the fence once
		// selected on, and no fence.
		if sec.Labels["app.kubernetes.io/managed-by"] != "ferry" || sec.Annotations["ferry.dev/term"] != "" {
			t.Errorf("Secret %s labels %v annotations %v: want managed-by=ferry and no ferry.dev/term", name, sec.Labels, sec.Annotations)
		}
	}

	id := ctl.launchDetached("--secret", "HA_CHART_JOB_TOKEN=not-a-real-token", filepath.Join(dir, "job.yaml"))
	ctl.waitJob(id, 2*time.Minute, "the job RUNNING", func(j jobView) bool { return j.State == "RUNNING" })
	eventually(t, 30*time.Second, "the job's log shows its workdir and file mount", func() (bool, string) {
		logs, errOut, err := ctl.run("jobs", "logs", strconv.FormatInt(id, 10))
		return err == nil && strings.Contains(logs, "hello-from-the-ha-chart") && strings.Contains(logs, "note-from-the-workdir") &&
			strings.Contains(logs, "extra-from-file-mounts"), logs + errOut
	})
	ctl.mustRun("jobs", "cancel", strconv.FormatInt(id, 10), "-y")
	ctl.waitJob(id, time.Minute, "the job CANCELLED", func(j jobView) bool { return j.State == "CANCELLED" })

	checkFenceRefusesStale(t, ctx, k, "ferry-svc-ha-chart-svc")

	ctl.mustRun("serve", "down", "ha-chart-svc", "-y")
	eventually(t, time.Minute, "the replica pod gone", func() (bool, string) {
		pods := k.pods("ha-chart-svc")
		return len(pods) == 0, strconv.Itoa(len(pods)) + " pods left"
	})
	ctlLog, err := os.ReadFile(filepath.Join(ctl.home, "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, refused := range []string{"forbidden", "denied request"} {
		if strings.Contains(strings.ToLower(string(ctlLog)), refused) {
			t.Errorf("the controller met %q under the chart's defaults:\n%s", refused, grepLines(strings.ToLower(string(ctlLog)), refused))
		}
	}
}

// checkFenceRefusesStale: as the chart's ServiceAccount, a write to the store's record with a
// term that is not the Lease's (a deposed leader's) is refused, and so is one that drops the
// labels the fence selects on (the old object is matched too).
func checkFenceRefusesStale(t *testing.T, ctx context.Context, k *kubeEnv, record string) {
	t.Helper()
	cfg := k.cluster.RESTConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + k.ns + ":ferry"}
	asSA := kubernetes.NewForConfigOrDie(cfg)
	dry := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
	cm, err := asSA.CoreV1().ConfigMaps(k.ns).Get(ctx, record, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Unconditional (no resourceVersion): the status loop may have written it since.
	cm.ResourceVersion = ""
	if _, err := asSA.CoreV1().ConfigMaps(k.ns).Update(ctx, cm.DeepCopy(), dry); err != nil {
		t.Fatalf("the leader's own record, as written, refused: %v", err)
	}
	stale := cm.DeepCopy()
	stale.Annotations["ferry.dev/term"] = "999"
	if _, err := asSA.CoreV1().ConfigMaps(k.ns).Update(ctx, stale, dry); err == nil || !strings.Contains(err.Error(), "is not the lease term") {
		t.Errorf("a write of %s with a stale term: %v, want refused by the fence", record, err)
	}
	unlabelled := stale.DeepCopy()
	delete(unlabelled.Labels, "ferry.dev/kind")
	delete(unlabelled.Labels, "app.kubernetes.io/managed-by")
	if _, err := asSA.CoreV1().ConfigMaps(k.ns).Update(ctx, unlabelled, dry); err == nil || !strings.Contains(err.Error(), "is not the lease term") {
		t.Errorf("a write of %s with a stale term that drops its labels: %v, want refused by the fence", record, err)
	}
}

// installChartDefaults renders charts/ferry with its default values (proxy.attach, which has no
// default, set) for k's namespace and creates, for real, its ServiceAccount, RBAC and every
// admission policy: the secrets, pods and priority-cap policies and both fencing policies. The
// cluster-scoped objects are removed at the end but for the fencing policies, which stay, as
// kubestore's tests leave theirs (ha_test.go's installFencePolicy says why); their bindings
// match only k's namespace.
func installChartDefaults(t *testing.T, ctx context.Context, k *kubeEnv) {
	t.Helper()
	isFence := func(name string) bool { return strings.HasPrefix(name, "ferry-fence") }
	var policies []string
	for _, o := range applyChart(t, ctx, k, "proxy.attach=ha-chart-svc", func(*unstructured.Unstructured) bool { return true }, isFence) {
		if o.GetKind() == "ValidatingAdmissionPolicy" {
			policies = append(policies, o.GetName())
		}
	}
	if !slices.Contains(policies, "ferry-fence-"+k.ns) || !slices.Contains(policies, "ferry-fence-status-"+k.ns) {
		t.Fatalf("the chart's defaults render policies %v: want both fencing policies", policies)
	}
	waitSecretsPolicy(t, ctx, k)
	waitFence(t, ctx, k)
}

// waitFence waits until the API server enforces the fence (it loads policies asynchronously):
// with no Lease yet, a store record's create is refused ("No lease, no writes").
func waitFence(t *testing.T, ctx context.Context, k *kubeEnv) {
	t.Helper()
	cfg := k.cluster.RESTConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + k.ns + ":ferry"}
	client := kubernetes.NewForConfigOrDie(cfg)
	probe := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "ferry-fence-probe",
		Labels: map[string]string{"app.kubernetes.io/managed-by": "ferry", "ferry.dev/kind": "probe"}}}
	eventually(t, 30*time.Second, "the fence enforced", func() (bool, string) {
		_, err := client.CoreV1().ConfigMaps(k.ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "ferry-fence-"+k.ns), fmt.Sprint(err)
	})
}
