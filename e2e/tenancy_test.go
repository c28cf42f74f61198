package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/internal/testhttp"
)

// A FerryService is a tenant's: whoever may create one in the controller's namespace must not
// make Ferry read the controller's files, run on its host or use its bucket credentials
// (internal/controller/tenancy.go). These tests apply FerryServices through the real API
// server, with replicas as pods on a kwok node run by the kubelet stand-in.

// newFerryServiceEnv is a controller on the Kubernetes store in a namespace of its own, whose
// FerryServices' replicas are pods in the same namespace, on a node of two A10G GPUs; extraEnv
// is added to the controller's environment. It returns the env, the namespace and a dynamic
// client.
func newFerryServiceEnv(t *testing.T, prefix string, extraEnv ...string) (*env, string, dynamic.Interface) {
	t.Helper()
	c := testcluster.Shared(t)
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	installFerryServiceCRD(t, dyn)
	ns := testNamespace(t, c, prefix) // before newEnv: removed once the controller stopped
	node := "a10g-" + ns
	if err := c.AddGPUNode(context.Background(), node, "NVIDIA-A10G", 2); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteNode(context.Background(), node) })
	testcluster.StartKubelet(t, c, testcluster.KubeletOptions{FerryBin: ferryBin})
	e := newEnv(t)
	writeFile(t, filepath.Join(e.home, "config.yaml"), fmt.Sprintf("kubernetes:\n  kubeconfig: %s\n  provision_timeout_seconds: 30\n  contexts:\n    - name: %s\n      namespace: %s\n",
		c.Kubeconfig(), c.Context(), ns))
	e.extraEnv = append([]string{"FERRY_STORE=kubernetes", "KUBECONFIG=" + c.Kubeconfig(), "FERRY_NAMESPACE=" + ns}, extraEnv...)
	e.mustRun("serve", "status") // starts the controller on the Kubernetes store
	return e, ns, dyn
}

// tenancyRefusal is a FerryService a tenant may not have Ferry run, and what the refusal says.
type tenancyRefusal struct {
	name, spec, want string
}

// tenancyRefusals are the ways a tenant could reach the controller: its host (infra local),
// its files (a workdir or file mount on its filesystem: here the controller's home, with its
// tokens), its bucket credentials (an s3:// source), and a ConfigMap of the namespace that its
// owner did not label for FerryServices (Ferry's own state, say); and a claim on a cloud.
func tenancyRefusals(home string) []tenancyRefusal {
	base := fmt.Sprintf(fsvcSpec, 1)
	return []tenancyRefusal{
		{name: "local-infra", spec: strings.Replace(base, "    infra: kubernetes\n    accelerators: A10G:1\n", "    infra: local\n", 1),
			want: "resources.infra: local runs the replicas' commands on the controller's own host"},
		{name: "controller-workdir", spec: base + "  workdir: " + home + "\n",
			want: "workdir: " + home + " is a path on the controller's filesystem"},
		{name: "controller-token", spec: base + "  file_mounts:\n    /tmp/token: " + filepath.Join(home, "controller.token") + "\n",
			want: "is a path on the controller's filesystem"},
		{name: "sa-token", spec: base + "  file_mounts:\n    /tmp/sa: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
			want: "is a path on the controller's filesystem"},
		{name: "s3-source", spec: base + "  file_mounts:\n    /data: s3://any-bucket/models\n",
			want: "would be listed and presigned with the controller's bucket credentials"},
		{name: "claim-on-a-cloud", spec: strings.Replace(base, "    infra: kubernetes\n    accelerators: A10G:1\n", "    ordered:\n      - infra: kubernetes\n      - infra: aws\n", 1) + "  file_mounts:\n    /models: pvc://models\n",
			want: "pvc://models is a PersistentVolumeClaim, which only pods of infra kubernetes mount, and this FerryService may run on aws"},
	}
}

// TestFerryServiceTenancyRefused: without the webhook, each FerryService that asks for the
// controller's host, files or credentials is never launched (no pod, no service) and says why
// in its status: INVALID, and a Tenancy condition False with the rule it broke. A ConfigMap
// source its owner did not label is refused the same way, and one that does not exist waits.
func TestFerryServiceTenancyRefused(t *testing.T) {
	e, ns, dyn := newFerryServiceEnv(t, "e2e-tenancy-")
	c := testcluster.Shared(t)
	ctx := context.Background()
	cases := tenancyRefusals(e.home)
	if _, err := c.Client().CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "unlabelled"},
		Data: map[string]string{"x": "y"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cases = append(cases,
		tenancyRefusal{name: "unlabelled-configmap", spec: fmt.Sprintf(fsvcSpec, 1) + "  workdir: configmap://unlabelled\n",
			want: "ConfigMap unlabelled is not labelled ferry.dev/files=true"},
		tenancyRefusal{name: "missing-configmap", spec: fmt.Sprintf(fsvcSpec, 1) + "  workdir: configmap://nowhere\n",
			want: "no ConfigMap nowhere in the FerryService's namespace"})
	for _, tc := range cases {
		if err := applyFerryService(ctx, dyn, ns, tc.name, tc.spec); err != nil {
			t.Fatalf("%s: the API server refused what the controller should: %v", tc.name, err)
		}
	}
	for _, tc := range cases {
		eventually(t, 30*time.Second, tc.name+"'s status says INVALID with a Tenancy condition False and why", func() (bool, string) {
			u, err := dyn.Resource(fsvcGVR).Namespace(ns).Get(ctx, tc.name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			st, _, _ := unstructured.NestedString(u.Object, "status", "status")
			cond := condition(u, "Tenancy")
			return st == "INVALID" && cond["status"] == "False" && strings.Contains(fmt.Sprint(cond["message"]), tc.want), fmt.Sprintf("%s %v", st, cond)
		})
	}
	out := e.mustRun("serve", "status", "--json")
	for _, tc := range cases {
		if strings.Contains(out, `"`+tc.name+`"`) {
			t.Errorf("%s was brought up as a service:\n%s", tc.name, out)
		}
	}
	if pods, err := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err != nil || len(pods.Items) != 0 {
		t.Errorf("pods made for refused FerryServices: %d, %v", len(pods.Items), err)
	}
}

// condition is the status condition of u of type typ (nil when none).
func condition(u *unstructured.Unstructured, typ string) map[string]any {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == typ {
			return m
		}
	}
	return nil
}

// TestFerryServiceConfigMapSources: a FerryService's workdir and file_mounts from ConfigMaps of
// its namespace, labelled ferry.dev/files=true, reach its pods (the pod's files archive holds
// them and nothing of the controller's), the service serves, and its Tenancy condition says
// Accepted.
func TestFerryServiceConfigMapSources(t *testing.T) {
	e, ns, dyn := newFerryServiceEnv(t, "e2e-tenancy-cm-")
	c := testcluster.Shared(t)
	ctx := context.Background()
	labels := map[string]string{"ferry.dev/files": "true"}
	for _, cm := range []*corev1.ConfigMap{
		{ObjectMeta: metav1.ObjectMeta{Name: "code", Labels: labels}, Data: map[string]string{"serve.py": "print('tenant code')\n"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "settings", Labels: labels}, Data: map[string]string{"app.yaml": "model: sim\n", "other.txt": "unused\n"}},
	} {
		if _, err := c.Client().CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	spec := fmt.Sprintf(fsvcSpec, 1) + "  workdir: configmap://code\n  file_mounts:\n    /etc/app: configmap://settings\n    /etc/app.yaml: configmap://settings/app.yaml\n"
	files := serveAcceptedTenant(t, ctx, c, e, dyn, ns, spec)
	want := map[string]string{"workdir/serve.py": "print('tenant code')\n", "mounts/0/app.yaml": "model: sim\n",
		"mounts/0/other.txt": "unused\n", "mounts/1/app.yaml": "model: sim\n"}
	for name, content := range want {
		var found bool
		for got, data := range files {
			if strings.HasSuffix(got, name) && data == content {
				found = true
			}
		}
		if !found {
			t.Errorf("the pod's files lack %s = %q; they hold %v", name, content, keys(files))
		}
	}
	for name := range files {
		if strings.Contains(name, "token") || strings.Contains(name, "ferry.db") {
			t.Errorf("the pod's files hold %s", name)
		}
	}

	// The snapshot is taken per generation; a controller restarted after the ConfigMap changed
	// (its snapshot gone, as with a controller pod's disk) rolls the service to the new content.
	code, err := c.Client().CoreV1().ConfigMaps(ns).Get(ctx, "code", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	code.Data["serve.py"] = "print('tenant code, v2')\n"
	if _, err := c.Client().CoreV1().ConfigMaps(ns).Update(ctx, code, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.mustRun("controller", "stop")
	if err := os.RemoveAll(filepath.Join(e.home, "ferryservice-files")); err != nil { // a new pod's empty disk
		t.Fatal(err)
	}
	e.mustRun("serve", "status") // the controller again
	eventually(t, 90*time.Second, "the restarted controller rolls the service's one pod to the ConfigMap's new content", func() (bool, string) {
		files, err := podFiles(ctx, c, ns, "tenant")
		if err != nil {
			return false, err.Error()
		}
		for name, data := range files {
			if strings.HasSuffix(name, "workdir/serve.py") {
				return data == "print('tenant code, v2')\n", data
			}
		}
		return false, fmt.Sprint(keys(files))
	})
	if st, err := e.status("tenant"); err != nil || st.Version != 2 {
		t.Errorf("after the roll: version %d, %v; want 2", st.Version, err)
	}
}

// podFiles reads the files archive of service's one pod, from the files Secret it owns: path ->
// content. More than one pod (a roll under way) is an error.
// serveAcceptedTenant applies spec as FerryService "tenant", waits until it is READY, checks
// that it serves and that its Tenancy condition is True/Accepted, and returns its pod's files.
func serveAcceptedTenant(t *testing.T, ctx context.Context, c *testcluster.Cluster, e *env, dyn dynamic.Interface, ns, spec string) map[string]string {
	t.Helper()
	if err := applyFerryService(ctx, dyn, ns, "tenant", spec); err != nil {
		t.Fatal(err)
	}
	waitFerryService(t, ctx, c, ns, "tenant", "READY", "1/1")
	st, err := e.status("tenant")
	if err != nil {
		t.Fatal(err)
	}
	chatPlain(t, st.Endpoint)
	u, err := dyn.Resource(fsvcGVR).Namespace(ns).Get(ctx, "tenant", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cond := condition(u, "Tenancy"); cond["status"] != "True" || cond["reason"] != "Accepted" {
		t.Errorf("Tenancy condition %v, want True Accepted", cond)
	}
	files, err := podFiles(ctx, c, ns, "tenant")
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func podFiles(ctx context.Context, c *testcluster.Cluster, ns, service string) (map[string]string, error) {
	list, err := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "ferry.service=" + service})
	if err != nil {
		return nil, err
	}
	var pods []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			pods = append(pods, p)
		}
	}
	if len(pods) != 1 {
		return nil, fmt.Errorf("%d pods of %s, want 1", len(pods), service)
	}
	files, err := c.Client().CoreV1().Secrets(ns).Get(ctx, pods[0].Name+"-files", metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("the pod's files Secret: %w", err)
	}
	if len(files.OwnerReferences) != 1 || files.OwnerReferences[0].UID != pods[0].UID {
		return nil, fmt.Errorf("the pod's files Secret is owned by %+v, want the pod", files.OwnerReferences)
	}
	zr, err := gzip.NewReader(bytes.NewReader(files.Data["files.tar.gz"]))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				return nil, err
			}
			out[h.Name] = string(b)
		}
	}
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestFerryServiceTenancyWebhook: with the webhook registered, the API server itself refuses
// at apply time each FerryService that asks for the controller's host, files or credentials,
// or a claim on a cloud, with the rule's message; one whose sources are the tenant's
// ConfigMap, Secret and claim is admitted.
func TestFerryServiceTenancyWebhook(t *testing.T) {
	certFile, keyFile := testhttp.WriteSelfSigned(t, t.TempDir())
	addr := freeLoopbackAddr(t)
	e, ns, dyn := newFerryServiceEnv(t, "e2e-tenancy-webhook-",
		"FERRY_WEBHOOK_ADDR="+addr, "FERRY_WEBHOOK_TLS_CERT="+certFile, "FERRY_WEBHOOK_TLS_KEY="+keyFile)
	c := testcluster.Shared(t)
	ctx := context.Background()
	registerWebhook(t, c, ns, addr, certFile)
	cases := tenancyRefusals(e.home)
	first := cases[0]
	eventually(t, 30*time.Second, "the webhook is in force", func() (bool, string) {
		if err := applyFerryService(ctx, dyn, ns, first.name, first.spec); err == nil { // registered a moment ago
			_ = dyn.Resource(fsvcGVR).Namespace(ns).Delete(ctx, first.name, metav1.DeleteOptions{})
			return false, "accepted"
		}
		return true, ""
	})
	for _, tc := range cases {
		err := applyFerryService(ctx, dyn, ns, tc.name, tc.spec)
		if err == nil || !strings.Contains(err.Error(), "denied the request") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want the webhook's refusal saying %q", tc.name, err, tc.want)
		}
	}
	good := fmt.Sprintf(fsvcSpec, 0) + "  workdir: configmap://code\n  file_mounts:\n    /etc/creds: secret://creds\n    /etc/token: secret://creds/token\n    /models: pvc://models/sim\n"
	if err := applyFerryService(ctx, dyn, ns, "good", good); err != nil {
		t.Fatalf("the webhook refused a FerryService with ConfigMap, Secret and claim sources: %v", err)
	}
	if err := dyn.Resource(fsvcGVR).Namespace(ns).Delete(ctx, "good", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestFerryServiceNameOfACLIService: a FerryService named like a service the operator started
// with the CLI neither updates that service nor, when deleted, takes it down; its status says
// the name is taken.
func TestFerryServiceNameOfACLIService(t *testing.T) {
	e, ns, dyn := newFerryServiceEnv(t, "e2e-tenancy-name-")
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "operator.yaml")
	writeFile(t, file, "name: operator\n"+strings.ReplaceAll(strings.TrimSuffix(fmt.Sprintf(fsvcSpec, 1), "\n"), "\n  ", "\n")[2:]+"\n")
	e.mustRun("serve", "up", file, "-y")

	if err := applyFerryService(ctx, dyn, ns, "operator", fmt.Sprintf(fsvcSpec, 2)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the FerryService's status says the name is taken", func() (bool, string) {
		u, err := dyn.Resource(fsvcGVR).Namespace(ns).Get(ctx, "operator", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		st, _, _ := unstructured.NestedString(u.Object, "status", "status")
		cond := condition(u, "Tenancy")
		return st == "INVALID" && cond["status"] == "False" && strings.Contains(fmt.Sprint(cond["message"]), "no FerryService brought up"), fmt.Sprintf("%s %v", st, cond)
	})
	if err := dyn.Resource(fsvcGVR).Namespace(ns).Delete(ctx, "operator", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// One worker takes FerryServices in turn: once a later one is up, the deletion was handled.
	if err := applyFerryService(ctx, dyn, ns, "marker", fmt.Sprintf(fsvcSpec, 0)); err != nil {
		t.Fatal(err)
	}
	waitFerryService(t, ctx, testcluster.Shared(t), ns, "marker", "NO_REPLICA", "0/0")
	st, err := e.status("operator")
	if err != nil || st.Version != 1 || st.TargetReplicas != 1 {
		t.Errorf("the operator's service after the tenant's object came and went: version %d, target %d, %v; want version 1, target 1, still up", st.Version, st.TargetReplicas, err)
	}
}

// TestFerryServiceBrokenBeforeTheRules: a service a FerryService brought up before the tenancy
// rules, which breaks them (infra local: its replicas run on the controller's host), is taken
// down by the upgraded controller, and the object's status says so. The state an older
// controller left is made by hand: the service started with the CLI, the object's status
// claiming it (observedGeneration), as only a leader writes it.
func TestFerryServiceBrokenBeforeTheRules(t *testing.T) {
	e, ns, dyn := newFerryServiceEnv(t, "e2e-tenancy-legacy-")
	ctx := context.Background()
	spec := strings.Replace(fmt.Sprintf(fsvcSpec, 1), "    infra: kubernetes\n    accelerators: A10G:1\n", "    infra: local\n", 1)
	if err := applyFerryService(ctx, dyn, ns, "legacy", spec); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the refused FerryService shows INVALID", func() (bool, string) {
		u, err := dyn.Resource(fsvcGVR).Namespace(ns).Get(ctx, "legacy", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		st, _, _ := unstructured.NestedString(u.Object, "status", "status")
		return st == "INVALID", st
	})
	file := filepath.Join(t.TempDir(), "legacy.yaml")
	writeFile(t, file, "name: legacy\nresources:\n  infra: local\nservice:\n  readiness_probe: /health\n  replicas: 1\n  ports: 8080\nrun: ferry replica-sim --port $FERRY_PORT --model ferry-sim-1b\n")
	e.mustRun("serve", "up", file, "-y")
	eventually(t, 30*time.Second, "the object's status claims the service, as an older leader's did", func() (bool, string) {
		u, err := dyn.Resource(fsvcGVR).Namespace(ns).Get(ctx, "legacy", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if err := unstructured.SetNestedField(u.Object, int64(1), "status", "observedGeneration"); err != nil {
			return false, err.Error()
		}
		if _, err := dyn.Resource(fsvcGVR).Namespace(ns).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	eventually(t, 60*time.Second, "the service that breaks the rules is taken down, and the status says so", func() (bool, string) {
		u, err := dyn.Resource(fsvcGVR).Namespace(ns).Get(ctx, "legacy", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		msg := fmt.Sprint(condition(u, "Tenancy")["message"])
		_, errOut, err := e.run("serve", "status", "legacy", "--json")
		return err != nil && strings.Contains(errOut, "not found") && strings.Contains(msg, "was taken down"), msg + " / " + errOut
	})
}
