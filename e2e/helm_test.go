package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
)

const rbacServiceYAML = `name: rbac-svc
resources:
  infra: kubernetes
  accelerators: T4:1
envs:
  REPLICA_SIM_ARGS: --model ferry-sim-1b  # what the test cluster's kubelet stand-in runs
secrets:
  RBAC_TOKEN: null  # the pod's environment Secret: a write the chart's secrets policy must admit
service:
  readiness_probe: /health
  replicas: 1
  ports: 8080
run: ferry replica-sim --port $FERRY_PORT --model ferry-sim-1b
`

// The priority makes the launcher create a PriorityClass, the one cluster-scoped write; the
// workdir travels in a Secret the pod owns (files.go), written under the chart's secrets policy.
const rbacJobYAML = `name: rbac-job
resources:
  infra: kubernetes
  accelerators: T4:1
job: {priority: 500}
workdir: WORKDIR
run: |
  echo hello-from-the-chart-rbac
  cat note.txt
  sleep 600
`

// TestChartRBACRunsReplicasAndJobs installs the chart's ServiceAccount, RBAC and admission
// policies (but the fence; rendered by helm) on the test cluster and runs a controller as that ServiceAccount (kubeconfig
// impersonation): a replica pod comes up and serves, a job with a priority runs and its log is
// read, cancelling it and serve down remove the pods, and the controller never meets "forbidden". The same
// identity cannot read Secrets in another namespace, so the check has teeth. The controller
// keeps its state on the API server (--store kubernetes) under the chart's state Role, which
// reads no Secret but the state key: the service's secret values are sealed in a ConfigMap.
func TestChartRBACRunsReplicasAndJobs(t *testing.T) {
	k := newKubeEnv(t, "Tesla-T4", 1, 2, 30)
	ctx := context.Background()
	installChartRBAC(t, ctx, k)
	sa := "system:serviceaccount:" + k.ns + ":ferry"
	kubeconfig := impersonatingKubeconfig(t, k.cluster.Kubeconfig(), k.cluster.Context(), sa)
	writeFile(t, filepath.Join(k.home, "config.yaml"), `kubernetes:
  kubeconfig: `+kubeconfig+`
  provision_timeout_seconds: 30
  contexts:
    - name: `+k.cluster.Context()+`
      namespace: `+k.ns+`
`)
	k.extraEnv = []string{"FERRY_JOB_RETRY_INTERVAL=1s", "FERRY_JOB_WATCH_INTERVAL=200ms",
		"FERRY_STORE=kubernetes", "KUBECONFIG=" + kubeconfig, "FERRY_NAMESPACE=" + k.ns}

	asSA, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(asSA)
	for _, ns := range []string{"kube-system", k.ns} {
		if _, err := client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Fatalf("the chart's ServiceAccount listing %s's Secrets: %v, want forbidden", ns, err)
		}
	}

	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "svc.yaml"), rbacServiceYAML)
	workdir := filepath.Join(dir, "work")
	if err := os.Mkdir(workdir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(workdir, "note.txt"), "note-from-the-workdir\n")
	writeFile(t, filepath.Join(dir, "job.yaml"), strings.Replace(rbacJobYAML, "WORKDIR", workdir, 1))
	defer k.stopJobs()
	if out := k.mustRun("serve", "up", filepath.Join(dir, "svc.yaml"), "--secret", "RBAC_TOKEN=not-a-real-token", "-y"); !strings.Contains(out, "1/1 READY") {
		t.Fatalf("serve up as the chart's ServiceAccount:\n%s", out)
	}
	st, err := k.status("rbac-svc")
	if err != nil {
		t.Fatal(err)
	}
	chatPlain(t, st.Endpoint)
	if sealed, err := k.cluster.Client().CoreV1().ConfigMaps(k.ns).Get(ctx, "ferry-svc-rbac-svc.sealed", metav1.GetOptions{}); err != nil || strings.Contains(fmt.Sprint(sealed.Data), "not-a-real-token") {
		t.Errorf("the service's sealed values in the state: %v (plain token: %v)", err, err == nil)
	}
	id := k.launchDetached(filepath.Join(dir, "job.yaml"))
	k.waitJob(id, 2*time.Minute, "the job RUNNING", func(j jobView) bool { return j.State == "RUNNING" })
	eventually(t, 30*time.Second, "the running node's log read through pods/log", func() (bool, string) {
		logs, errOut, err := k.run("jobs", "logs", strconv.FormatInt(id, 10))
		return err == nil && strings.Contains(logs, "hello-from-the-chart-rbac") && strings.Contains(logs, "note-from-the-workdir"), logs + errOut
	})
	k.mustRun("jobs", "cancel", strconv.FormatInt(id, 10), "-y")
	k.waitJob(id, time.Minute, "the job CANCELLED", func(j jobView) bool { return j.State == "CANCELLED" })
	k.mustRun("serve", "down", "rbac-svc", "-y")
	eventually(t, time.Minute, "the replica pod gone", func() (bool, string) {
		pods := k.pods("rbac-svc")
		return len(pods) == 0, strconv.Itoa(len(pods)) + " pods left"
	})
	ctlLog, err := os.ReadFile(filepath.Join(k.home, "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.ToLower(string(ctlLog)), "forbidden") {
		t.Errorf("the controller met forbidden as the chart's ServiceAccount:\n%s", grepLines(strings.ToLower(string(ctlLog)), "forbidden"))
	}
}

// installChartRBAC renders charts/ferry for k's namespace (replicas there too) and creates its
// ServiceAccount, Roles, ClusterRole and bindings, and its admission policies but the fence, for
// real.
func installChartRBAC(t *testing.T, ctx context.Context, k *kubeEnv) {
	t.Helper()
	installed := applyChart(t, ctx, k, "proxy.enabled=false", func(o *unstructured.Unstructured) bool {
		return !strings.HasPrefix(o.GetName(), "ferry-fence") // no Lease here: the fence is e2e/ha_test.go's
	}, func(string) bool { return false })
	if len(installed) != 13 {
		t.Fatalf("installed %d objects, want 13 (ServiceAccount, 2 Roles and bindings, ClusterRole and binding, the secrets, pods and priority-cap policies and bindings)", len(installed))
	}
	waitSecretsPolicy(t, ctx, k)
}

// chartKinds are the kinds applyChart creates: what the chart's permissions and admission
// rules are made of, not its workloads.
var chartKinds = []string{"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
	"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}

// applyChart renders charts/ferry for k's namespace with one `--set` value and creates, for real,
// its objects of chartKinds that want accepts. Cluster-scoped ones are deleted when the test ends
// unless keep says otherwise by name. It returns the objects created.
func applyChart(t *testing.T, ctx context.Context, k *kubeEnv, set string, want func(*unstructured.Unstructured) bool, keep func(name string) bool) []*unstructured.Unstructured {
	t.Helper()
	helmPath, err := exec.Command(filepath.Join(repoRoot(), "scripts", "helm.sh")).Output()
	if err != nil {
		t.Fatalf("scripts/helm.sh: %v", err)
	}
	disco := discovery.NewDiscoveryClientForConfigOrDie(k.cluster.RESTConfig())
	server, err := disco.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(strings.TrimSpace(string(helmPath)), "template", "ferry", filepath.Join(repoRoot(), "charts", "ferry"),
		"--namespace", k.ns, "--kube-version", server.GitVersion, "--set", set)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("helm template: %v\n%s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(k.cluster.RESTConfig())
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	dec := yamlutil.NewYAMLOrJSONDecoder(strings.NewReader(string(out)), 4096)
	var created []*unstructured.Unstructured
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if raw == nil {
			continue
		}
		o := &unstructured.Unstructured{Object: raw}
		if !slices.Contains(chartKinds, o.GetKind()) || !want(o) {
			continue
		}
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatal(err)
		}
		res := dynamic.ResourceInterface(dyn.Resource(m.Resource))
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			res = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		} else if !keep(o.GetName()) {
			t.Cleanup(func() { _ = res.Delete(context.Background(), o.GetName(), metav1.DeleteOptions{}) })
		}
		if _, err := res.Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		created = append(created, o)
	}
	return created
}

// waitSecretsPolicy waits until the API server enforces the chart's secrets policy (it loads
// policies asynchronously), so that the controller's writes meet it.
func waitSecretsPolicy(t *testing.T, ctx context.Context, k *kubeEnv) {
	t.Helper()
	cfg := k.cluster.RESTConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + k.ns + ":ferry"}
	client := kubernetes.NewForConfigOrDie(cfg)
	probe := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "not-ferrys"}}
	eventually(t, 30*time.Second, "the secrets policy enforced", func() (bool, string) {
		_, err := client.CoreV1().Secrets(k.ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "Ferry writes only"), fmt.Sprint(err)
	})
}

// impersonatingKubeconfig writes a copy of path whose context acts as user (the admin
// credentials impersonate it, so every request is authorised as that user).
func impersonatingKubeconfig(t *testing.T, path, context, user string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := cfg.Contexts[context]
	if ctx == nil {
		t.Fatalf("no context %s in %s", context, path)
	}
	cfg.AuthInfos[ctx.AuthInfo].Impersonate = user
	out := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, out); err != nil {
		t.Fatal(err)
	}
	return out
}
