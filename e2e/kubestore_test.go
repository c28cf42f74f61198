package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/ferryserve/ferry/internal/store/kubestore"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/internal/testhttp"
)

var (
	crdGVR  = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	fsvcGVR = schema.GroupVersionResource{Group: "ferry.dev", Version: "v1alpha1", Resource: "ferryservices"}
)

// installFerryServiceCRD creates charts/ferry/crds' CRD (once per cluster) and waits until the
// API server serves it.
func installFerryServiceCRD(t *testing.T, dyn dynamic.Interface) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(), "charts/ferry/crds/ferryservices.ferry.dev.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd unstructured.Unstructured
	if err := yaml.Unmarshal(raw, &crd.Object); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := dyn.Resource(crdGVR).Create(ctx, &crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("the API server refused the FerryService CRD: %v", err)
	}
	eventually(t, 30*time.Second, "the FerryService CRD is established", func() (bool, string) {
		got, err := dyn.Resource(crdGVR).Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				return true, ""
			}
		}
		return false, fmt.Sprint(conds)
	})
}

// applyFerryService is `kubectl apply --server-side -f` of a FerryService with spec.
func applyFerryService(ctx context.Context, dyn dynamic.Interface, ns, name, spec string) error {
	obj := fmt.Sprintf("apiVersion: ferry.dev/v1alpha1\nkind: FerryService\nmetadata:\n  name: %s\nspec:\n%s", name, spec)
	var u unstructured.Unstructured
	if err := yaml.Unmarshal([]byte(obj), &u.Object); err != nil {
		return err
	}
	data, err := json.Marshal(u.Object)
	if err != nil {
		return err
	}
	force := true
	_, err = dyn.Resource(fsvcGVR).Namespace(ns).Patch(ctx, name, types.ApplyPatchType, data,
		metav1.PatchOptions{FieldManager: "kubectl", Force: &force, FieldValidation: "Strict"})
	return err
}

// fsvcSpec is a FerryService a tenant may apply: replicas in the cluster (a FerryService may
// not run on the controller's host, tenancy_test.go).
const fsvcSpec = `  resources:
    infra: kubernetes
    accelerators: A10G:1
  envs:
    REPLICA_SIM_ARGS: --model ferry-sim-1b
  service:
    readiness_probe:
      path: /health
      initial_delay_seconds: 30
    replicas: %d
    ports: 8080
  run: ferry replica-sim --port $FERRY_PORT --model ferry-sim-1b
`

// getTable is `kubectl get fsvc`: the API server's table of FerryServices, printer columns and
// all, as name -> column -> cell.
func getTable(ctx context.Context, c *testcluster.Cluster, ns string) (map[string]map[string]string, error) {
	raw, err := c.Client().Discovery().RESTClient().Get().AbsPath("/apis/ferry.dev/v1alpha1/namespaces/"+ns+"/ferryservices").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	var table metav1.Table
	if err := json.Unmarshal(raw, &table); err != nil {
		return nil, err
	}
	out := map[string]map[string]string{}
	for _, row := range table.Rows {
		cells := map[string]string{}
		for i, col := range table.ColumnDefinitions {
			if i < len(row.Cells) {
				cells[col.Name] = fmt.Sprint(row.Cells[i])
			}
		}
		out[cells["Name"]] = cells
	}
	return out, nil
}

// TestFerryServiceApplied: with --store kubernetes, a FerryService applied through the API (as
// kubectl apply would) comes up on replicas in the cluster, serves, shows its status in the printer
// columns, follows a spec change, reports what Ferry's validation rejects, and goes with its
// object; the state lives in the API server, not in SQLite.
func TestFerryServiceApplied(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	e, ns, dyn := newFerryServiceEnv(t, "e2e-fsvc-")

	if err := applyFerryService(ctx, dyn, ns, "chat", fmt.Sprintf(fsvcSpec, 2)); err != nil {
		t.Fatal(err)
	}
	waitFerryService(t, ctx, c, ns, "chat", "READY", "2/2")
	st, err := e.status("chat")
	if err != nil || st.Status != "READY" || len(st.ready()) != 2 {
		t.Fatalf("serve status of the applied service: %+v, %v", st, err)
	}
	chatPlain(t, st.Endpoint)
	checkStateInAPIServer(t, ctx, c, e, ns, "chat")

	// A restarted controller reads its state back from the API server and adopts the running
	// replicas: the same ids at the same endpoints, nothing relaunched.
	before := st.ready()
	e.mustRun("controller", "stop")
	eventually(t, 60*time.Second, "the restarted controller adopts both replicas", func() (bool, string) {
		st, err := e.status("chat")
		if err != nil {
			return false, err.Error()
		}
		return st.Status == "READY" && fmt.Sprint(st.ready()) == fmt.Sprint(before), fmt.Sprintf("%s %v, want %v", st.Status, st.ready(), before)
	})

	// A spec change is a serve update.
	if err := applyFerryService(ctx, dyn, ns, "chat", fmt.Sprintf(fsvcSpec, 1)); err != nil {
		t.Fatal(err)
	}
	waitFerryService(t, ctx, c, ns, "chat", "READY", "1/1")
	if st, err := e.status("chat"); err != nil || st.Version != 2 {
		t.Errorf("after the spec change: version %d, %v; want 2", st.Version, err)
	}
	checkRejections(t, ctx, c, dyn, ns)

	if err := dyn.Resource(fsvcGVR).Namespace(ns).Delete(ctx, "chat", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the deleted FerryService's service goes down", func() (bool, string) {
		out, _, err := e.run("serve", "status", "--json")
		return err == nil && !strings.Contains(out, `"name": "chat"`) && !strings.Contains(out, `"name":"chat"`), out
	})
}

// waitFerryService waits until `kubectl get fsvc` shows name with status and replicas.
func waitFerryService(t *testing.T, ctx context.Context, c *testcluster.Cluster, ns, name, status, replicas string) {
	t.Helper()
	eventually(t, 90*time.Second, fmt.Sprintf("kubectl get fsvc shows %s %s %s", name, status, replicas), func() (bool, string) {
		table, err := getTable(ctx, c, ns)
		if err != nil {
			return false, err.Error()
		}
		row := table[name]
		return row["Status"] == status && row["Replicas"] == replicas && strings.HasPrefix(row["Endpoint"], "http://") && row["Age"] != "", fmt.Sprint(row)
	})
}

// checkStateInAPIServer: the service's state is ConfigMaps and a Secret in ns, and no SQLite
// file was made.
func checkStateInAPIServer(t *testing.T, ctx context.Context, c *testcluster.Cluster, e *env, ns, name string) {
	t.Helper()
	cms, err := c.Client().CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: "ferry.dev/service=" + name})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, cm := range cms.Items {
		kinds[cm.Labels["ferry.dev/kind"]]++
	}
	if kinds["service"] != 1 || kinds["replica"] < 2 || kinds["sealed"] < 1 {
		t.Errorf("ConfigMaps of %s by kind: %v; want the service, its replicas and its sealed values", name, kinds)
	}
	// The values are sealed in ConfigMaps under the one state key: no Secret per record.
	if _, err := c.Client().CoreV1().Secrets(ns).Get(ctx, "ferry-svc-"+name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a Secret of the service's record: %v, want none", err)
	}
	if _, err := c.Client().CoreV1().Secrets(ns).Get(ctx, kubestore.KeySecret, metav1.GetOptions{}); err != nil {
		t.Errorf("the state key: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.home, "ferry.db")); err == nil {
		t.Error("a SQLite store was made beside the Kubernetes store")
	}
}

// checkRejections: the schema refuses what it can see; configs' validation what it cannot,
// shown in the object's status.
func checkRejections(t *testing.T, ctx context.Context, c *testcluster.Cluster, dyn dynamic.Interface, ns string) {
	t.Helper()
	err := applyFerryService(ctx, dyn, ns, "bad-schema", strings.Replace(fmt.Sprintf(fsvcSpec, 1), "replicas: 1", "replicas: -1", 1))
	if !apierrors.IsInvalid(err) {
		t.Errorf("replicas: -1 was not refused by the schema: %v", err)
	}
	err = applyFerryService(ctx, dyn, ns, "bad-job", fmt.Sprintf(fsvcSpec, 1)+"  job:\n    priority: 3\n")
	if err == nil {
		t.Error("a FerryService with a job section was accepted")
	}
	// replica_policy's keys are left to configs, which knows them.
	bad := strings.Replace(fmt.Sprintf(fsvcSpec, 1), "    replicas: 1\n", "    replica_policy:\n      min_replica: 1\n", 1)
	if err := applyFerryService(ctx, dyn, ns, "bad-policy", bad); err != nil {
		t.Fatalf("the schema refused what configs should: %v", err)
	}
	eventually(t, 30*time.Second, "bad-policy's status says INVALID with configs' message", func() (bool, string) {
		u, err := dyn.Resource(fsvcGVR).Namespace(ns).Get(ctx, "bad-policy", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		st, _, _ := unstructured.NestedString(u.Object, "status", "status")
		msg, _, _ := unstructured.NestedString(u.Object, "status", "message")
		return st == "INVALID" && strings.Contains(msg, "min_replica"), st + ": " + msg
	})
	table, err := getTable(ctx, c, ns)
	if err != nil || table["bad-policy"]["Status"] != "INVALID" {
		t.Errorf("kubectl get fsvc for bad-policy: %v, %v", table["bad-policy"], err)
	}
}

// TestFerryServiceWebhook: with the controller's validating webhook registered, the API server
// itself refuses at apply time what Ferry's validation refuses, with its message; a valid
// FerryService passes.
func TestFerryServiceWebhook(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	certFile, keyFile := testhttp.WriteSelfSigned(t, t.TempDir())
	addr := freeLoopbackAddr(t)
	_, ns, dyn := newFerryServiceEnv(t, "e2e-fsvc-webhook-",
		"FERRY_WEBHOOK_ADDR="+addr, "FERRY_WEBHOOK_TLS_CERT="+certFile, "FERRY_WEBHOOK_TLS_KEY="+keyFile)
	registerWebhook(t, c, ns, addr, certFile)

	bad := strings.Replace(fmt.Sprintf(fsvcSpec, 1), "    replicas: 1\n", "    replica_policy:\n      min_replica: 1\n", 1)
	var applyErr error
	eventually(t, 30*time.Second, "the API server refuses, through the webhook, what configs refuses", func() (bool, string) {
		applyErr = applyFerryService(ctx, dyn, ns, "bad-policy", bad)
		if applyErr == nil { // registered a moment ago: not in force yet
			_ = dyn.Resource(fsvcGVR).Namespace(ns).Delete(ctx, "bad-policy", metav1.DeleteOptions{})
			return false, "accepted"
		}
		return true, ""
	})
	if !strings.Contains(applyErr.Error(), "denied the request") || !strings.Contains(applyErr.Error(), "min_replica") {
		t.Errorf("refusal does not carry configs' message: %v", applyErr)
	}
	if err := applyFerryService(ctx, dyn, ns, "good", fmt.Sprintf(fsvcSpec, 0)); err != nil {
		t.Fatalf("the webhook refused a valid FerryService: %v", err)
	}
	waitFerryService(t, ctx, c, ns, "good", "NO_REPLICA", "0/0")
	if err := dyn.Resource(fsvcGVR).Namespace(ns).Delete(ctx, "good", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// registerWebhook points the API server at the controller's webhook for FerryServices in ns; the
// API server runs on this host, so it reaches the loopback address.
func registerWebhook(t *testing.T, c *testcluster.Cluster, ns, addr, certFile string) {
	t.Helper()
	ca, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + addr + "/validate-ferryservice"
	fail, none, timeout := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone, int32(10)
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "ferryservices-" + ns},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "ferryservices.ferry.dev",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: ca},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{"ferry.dev"}, APIVersions: []string{"v1alpha1"},
					Resources: []string{"ferryservices"}},
			}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          &timeout,
		}}}
	hooks := c.Client().AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if _, err := hooks.Create(context.Background(), cfg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Registered after newEnv, so removed before the controller stops.
	t.Cleanup(func() { _ = hooks.Delete(context.Background(), cfg.Name, metav1.DeleteOptions{}) })
}
