// Package chart tests the Helm chart beside it: helm lint, helm template with several sets of
// values, and every rendered object created with server-side dry-run (and strict field
// validation) on the real API server of internal/testcluster. helm comes from scripts/helm.sh.
package chart

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/ferryserve/ferry/internal/testcluster"
)

func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

// chartDir is this directory; repoRoot the checkout holding it.
var chartDir, _ = filepath.Abs(".")
var repoRoot = filepath.Join(chartDir, "..", "..")

// helm returns the pinned helm binary, installing it on first use.
func helm(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(repoRoot, "scripts", "helm.sh")).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("scripts/helm.sh: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("scripts/helm.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// kubeVersion is what helm lint and template assume without a cluster: a helm built by go
// install reports v1.20 otherwise, which the chart's kubeVersion refuses. The dry-run test
// renders for the test cluster's own version.
const kubeVersion = "v1.34.0"

func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helm(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// valueSets are the chart's renderings under test: the defaults (plus the one required value)
// and every optional part turned the other way.
var valueSets = map[string][]string{
	"defaults": {"proxy.attach=llama"},
	"everything else": {
		"proxy.attach=*",
		"replicas.namespace=REPLICAS_NS",
		"replicas.managePriorityClasses=false",
		"replicas.maxPriority=null",
		"auth.existingSecret=my-tokens",
		"auth.metricsToken=true",
		"tls.controller.secretName=my-controller-tls",
		"tls.proxy.secretName=my-proxy-tls",
		"metrics.serviceMonitor.enabled=true",
		"metrics.serviceMonitor.labels.release=prometheus",
		"proxy.autoscaling.enabled=false",
		"proxy.replicas=3",
		"proxy.service.type=LoadBalancer",
		"controller.replicas=3",
		"controller.migrateStateSecrets=true",
		"controller.secretSources=true",
		"controller.extraArgs[0]=--probe-interval=5s",
		"controller.config.aws.regions[0]=us-east-1",
		"serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::111122223333:role/ferry",
		"proxy.httpRoute.parentRefs[0].name=public",
		"proxy.httpRoute.parentRefs[0].namespace=gateways",
		jsonValue + `proxy.httpRoute.hostname="{name}.llm.example.com"`,
	},
	"no proxies": {"proxy.enabled=false", "controller.leaderElect=false", "controller.store=sqlite", "controller.replicas=1"},
	"cpu metric": {"proxy.attach=llama", "proxy.autoscaling.metric=cpu"},
}

// jsonValue marks a value set's entry as --set-json, for a value --set would read as a list
// ("{name}...").
const jsonValue = "json:"

// setArgs are helm's flags for a value set's entries.
func setArgs(set []string) []string {
	var args []string
	for _, s := range set {
		if v, ok := strings.CutPrefix(s, jsonValue); ok {
			args = append(args, "--set-json", v)
		} else {
			args = append(args, "--set", s)
		}
	}
	return args
}

// TestChartLint runs helm lint --strict with each value set.
func TestChartLint(t *testing.T) {
	for name, set := range valueSets {
		t.Run(name, func(t *testing.T) {
			args := []string{"lint", "--strict", "--kube-version", kubeVersion, chartDir}
			for _, s := range set {
				args = append(args, setArgs([]string{strings.ReplaceAll(s, "REPLICAS_NS", "ferry-replicas")})...)
			}
			if out, err := runHelm(t, args...); err != nil {
				t.Fatal(err)
			} else if !strings.Contains(out, "0 chart(s) failed") {
				t.Fatalf("helm lint:\n%s", out)
			}
		})
	}
}

// TestChartRequiresAttach: proxies with no service to follow are a render error naming the value.
func TestChartRequiresAttach(t *testing.T) {
	_, err := runHelm(t, "template", "ferry", chartDir, "--kube-version", kubeVersion)
	if err == nil || !strings.Contains(err.Error(), "proxy.attach") {
		t.Fatalf("helm template without proxy.attach: %v, want an error naming proxy.attach", err)
	}
}

// render runs helm template of the release "ferry" in namespace ns and decodes every object.
func render(t *testing.T, ns, kubeVersion string, set []string) []*unstructured.Unstructured {
	t.Helper()
	return renderRelease(t, "ferry", ns, kubeVersion, set)
}

// renderRelease runs helm template of release in namespace ns and decodes every object.
func renderRelease(t *testing.T, release, ns, kubeVersion string, set []string) []*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", release, chartDir, "--namespace", ns, "--include-crds", "--kube-version", kubeVersion}
	out, err := runHelm(t, append(args, setArgs(set)...)...)
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	dec := yamlutil.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("rendered YAML: %v\n%s", err, out)
		}
		if raw != nil {
			objs = append(objs, &unstructured.Unstructured{Object: raw})
		}
	}
	return objs
}

// TestChartAcceptedByAPIServer renders each value set and creates every object on the test
// cluster's API server with dry-run and strict field validation: a misspelt field, a wrong
// type, an invalid name or an RBAC rule the server rejects fails the test. CRDs of the chart
// (crds/) are created for real first, so that objects of their kinds can be checked too.
func TestChartAcceptedByAPIServer(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	server, err := disco.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	// The Prometheus operator's ServiceMonitor, as far as the chart uses it.
	createFromFile(t, ctx, dyn, mapper, filepath.Join(chartDir, "testdata", "servicemonitor-crd.yaml"))

	i := 0
	for name, set := range valueSets {
		i++
		t.Run(name, func(t *testing.T) {
			ns := fmt.Sprintf("chart-%d", i)
			replicasNS := ns + "-replicas"
			for _, n := range []string{ns, replicasNS} {
				createNamespace(t, ctx, c, n)
			}
			var values []string
			for _, s := range set {
				values = append(values, strings.ReplaceAll(s, "REPLICAS_NS", replicasNS))
			}
			objs := render(t, ns, server.GitVersion, values)
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[o.GetKind()]++
			}
			t.Logf("%s: %d objects %v", name, len(objs), kinds)
			for _, o := range objs {
				if o.GetKind() == "CustomResourceDefinition" {
					createCRD(t, ctx, dyn, mapper, o)
				}
			}
			for _, o := range objs {
				if o.GetKind() != "CustomResourceDefinition" {
					dryRunCreate(t, ctx, dyn, mapper, o)
				}
			}
			checkObjects(t, name, ns, replicasNS, objs)
		})
	}
}

func createNamespace(t *testing.T, ctx context.Context, c *testcluster.Cluster, name string) {
	t.Helper()
	_, err := c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

func resourceFor(t *testing.T, dyn dynamic.Interface, mapper meta.RESTMapper, o *unstructured.Unstructured) dynamic.ResourceInterface {
	t.Helper()
	gvk := o.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("%s %s: the API server does not serve it: %v", gvk, o.GetName(), err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if o.GetNamespace() == "" {
			t.Errorf("%s %s is namespaced but rendered without a namespace", gvk.Kind, o.GetName())
		}
		return dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	}
	return dyn.Resource(m.Resource)
}

func dryRunCreate(t *testing.T, ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, o *unstructured.Unstructured) {
	t.Helper()
	_, err := resourceFor(t, dyn, mapper, o).Create(ctx, o, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"})
	if err != nil {
		t.Errorf("the API server rejects %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
	}
}

// createCRD creates a CRD for real (strictly validated) and waits until its kind is served.
func createCRD(t *testing.T, ctx context.Context, dyn dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper, o *unstructured.Unstructured) {
	t.Helper()
	_, err := resourceFor(t, dyn, mapper, o).Create(ctx, o, metav1.CreateOptions{FieldValidation: "Strict"})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("the API server rejects CRD %s: %v", o.GetName(), err)
	}
	group, _, _ := unstructured.NestedString(o.Object, "spec", "group")
	kind, _, _ := unstructured.NestedString(o.Object, "spec", "names", "kind")
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		mapper.Reset()
		_, err := mapper.RESTMapping(schema.GroupKind{Group: group, Kind: kind})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("CRD %s never served: %v", o.GetName(), err)
	}
}

func createFromFile(t *testing.T, ctx context.Context, dyn dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper, path string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := yamlutil.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096).Decode(&obj); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	createCRD(t, ctx, dyn, mapper, &unstructured.Unstructured{Object: obj})
}

// checkObjects checks what the API server cannot: the chart's choices.
func checkObjects(t *testing.T, name, ns, replicasNS string, objs []*unstructured.Unstructured) {
	t.Helper()
	byKindName := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		byKindName[o.GetKind()+"/"+o.GetName()] = o
	}
	ctl := byKindName["Deployment/ferry-controller"]
	if ctl == nil {
		t.Fatal("no controller Deployment")
	}
	args := containerArgs(t, ctl)
	checkSecretsNarrowed(t, byKindName, ns, replicasNSFor(name, ns, replicasNS))
	checkStateSecretReads(t, byKindName["Role/ferry-state"], name == "everything else")
	if _, capped := byKindName["ValidatingAdmissionPolicy/ferry-priority-cap-"+ns]; capped != (name != "everything else") {
		t.Errorf("priority cap policy rendered %v with replicas.maxPriority %s", capped, map[bool]string{true: "null", false: "1000"}[name == "everything else"])
	}
	// The fence compares writes with the controller Lease: rendered without leader election it
	// would refuse every state write, for no Lease is ever taken.
	for _, fence := range []string{"ferry-fence-", "ferry-fence-status-"} {
		_, policy := byKindName["ValidatingAdmissionPolicy/"+fence+ns]
		_, binding := byKindName["ValidatingAdmissionPolicyBinding/"+fence+ns]
		if want := name != "no proxies"; policy != want || binding != want {
			t.Errorf("%s%s policy rendered %v, binding %v; want %v (leader election %v)", fence, ns, policy, binding, want, want)
		}
	}
	switch name {
	case "no proxies":
		if slices.Contains(args, "--leader-elect") || !slices.Contains(args, "--store=sqlite") {
			t.Errorf("controller args %v, want sqlite without election", args)
		}
		if byKindName["Deployment/ferry-proxy"] != nil || byKindName["HorizontalPodAutoscaler/ferry-proxy"] != nil {
			t.Error("proxies rendered with proxy.enabled=false")
		}
		return
	default:
		for _, want := range []string{"--store=kubernetes", "--leader-elect", "--lease-name=ferry-controller", "--namespace=" + ns, "--listen=0.0.0.0:8787"} {
			if !slices.Contains(args, want) {
				t.Errorf("controller args %v lack %s", args, want)
			}
		}
	}
	// Decoded YAML numbers are float64 or int64: compare as text.
	if n, _, _ := unstructured.NestedFieldNoCopy(ctl.Object, "spec", "replicas"); name == "defaults" && fmt.Sprint(n) != "2" {
		t.Errorf("controller replicas = %v, want 2", n)
	}
	px := byKindName["Deployment/ferry-proxy"]
	if px == nil {
		t.Fatal("no proxy Deployment")
	}
	pargs := containerArgs(t, px)
	follow, notFollow := "--attach=llama", "--attach-all" // proxy.attach=llama
	if name == "everything else" {                        // proxy.attach=*
		follow, notFollow = "--attach-all", "--attach=*"
	}
	for _, want := range []string{"proxy", follow, "--controller=https://ferry-controller." + ns + ".svc:8787"} {
		if !slices.Contains(pargs, want) {
			t.Errorf("proxy args %v lack %s", pargs, want)
		}
	}
	if slices.Contains(pargs, notFollow) {
		t.Errorf("proxy args %v have %s", pargs, notFollow)
	}
	if auto, _, _ := unstructured.NestedBool(px.Object, "spec", "template", "spec", "automountServiceAccountToken"); auto {
		t.Error("proxy pods mount a Kubernetes API token")
	}
	if strings.Contains(fmt.Sprint(px.Object), "controller.token") {
		t.Error("proxy pods mount the controller token")
	}
	_, hpa := byKindName["HorizontalPodAutoscaler/ferry-proxy"]
	_, sm := byKindName["ServiceMonitor/ferry"]
	if wantHPA, wantSM := name == "defaults" || name == "cpu metric", name == "everything else"; hpa != wantHPA || sm != wantSM {
		t.Errorf("HPA rendered %v, ServiceMonitor %v; want %v and %v", hpa, sm, wantHPA, wantSM)
	}
	for _, k := range []string{"PodDisruptionBudget/ferry-controller", "PodDisruptionBudget/ferry-proxy", "Service/ferry-proxy", "ServiceAccount/ferry"} {
		if byKindName[k] == nil {
			t.Errorf("no %s", k)
		}
	}
	if role := byKindName["Role/ferry-replicas"]; role == nil || role.GetNamespace() != replicasNSFor(name, ns, replicasNS) {
		t.Errorf("replicas Role in %v, want %s", role, replicasNSFor(name, ns, replicasNS))
	}
	checkLeastPrivilege(t, objs)
}

func replicasNSFor(name, ns, replicasNS string) string {
	if name == "everything else" {
		return replicasNS
	}
	return ns
}

// checkLeastPrivilege: no wildcard anywhere in the chart's RBAC, and no rule granting what the
// controller never does (escalate, bind, impersonate, secrets cluster-wide).
func checkLeastPrivilege(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "Role" && o.GetKind() != "ClusterRole" {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
		for _, r := range rules {
			rule := r.(map[string]any)
			for _, field := range []string{"verbs", "resources", "apiGroups"} {
				vals, _, _ := unstructured.NestedStringSlice(rule, field)
				if slices.Contains(vals, "*") {
					t.Errorf("%s %s grants %s *", o.GetKind(), o.GetName(), field)
				}
				for _, v := range vals {
					if v == "escalate" || v == "bind" || v == "impersonate" || (o.GetKind() == "ClusterRole" && v == "secrets") {
						t.Errorf("%s %s grants %s", o.GetKind(), o.GetName(), v)
					}
				}
			}
		}
	}
}

func containerArgs(t *testing.T, deploy *unstructured.Unstructured) []string {
	t.Helper()
	containers, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "containers")
	if len(containers) != 1 {
		t.Fatalf("%s: %d containers", deploy.GetName(), len(containers))
	}
	args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	return args
}

// checkStateSecretReads: in the release's namespace the controller may neither list nor watch
// Secrets (RBAC cannot narrow either to Ferry's), and gets only the state key, by name, unless
// migrate (controller.migrateStateSecrets, an upgrade's one start, or controller.secretSources,
// FerryServices' secret:// sources) adds get by any name.
func checkStateSecretReads(t *testing.T, role *unstructured.Unstructured, migrate bool) {
	t.Helper()
	if role == nil {
		t.Fatal("no state Role")
	}
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	unnamedGet := false
	for _, r := range rules {
		rule := r.(map[string]any)
		resources, _, _ := unstructured.NestedStringSlice(rule, "resources")
		if !slices.Contains(resources, "secrets") {
			continue
		}
		verbs, _, _ := unstructured.NestedStringSlice(rule, "verbs")
		names, _, _ := unstructured.NestedStringSlice(rule, "resourceNames")
		if slices.Contains(verbs, "list") || slices.Contains(verbs, "watch") {
			t.Errorf("state Role grants %v on secrets: no list or watch wanted", verbs)
		}
		if slices.Contains(verbs, "get") && len(names) == 0 {
			unnamedGet = true
		} else if slices.Contains(verbs, "get") && !slices.Equal(names, []string{"ferry-state-key"}) {
			t.Errorf("state Role gets secrets %v, want ferry-state-key only", names)
		}
	}
	if unnamedGet != migrate {
		t.Errorf("state Role gets every Secret: %v, want %v (controller.migrateStateSecrets, controller.secretSources)", unnamedGet, migrate)
	}
}

// checkSecretsNarrowed: in the replicas' namespace the controller may create, patch and delete
// Secrets (pods' environments) but not read any, and the secrets policy, bound to both
// namespaces, limits its writes to Secrets labelled as Ferry's (policies_test.go shows the API
// server enforcing it).
func checkSecretsNarrowed(t *testing.T, byKindName map[string]*unstructured.Unstructured, ns, replicasNS string) {
	t.Helper()
	if role := byKindName["Role/ferry-replicas"]; role != nil {
		rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
		for _, r := range rules {
			resources, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
			verbs, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "verbs")
			if slices.Contains(resources, "secrets") && slices.ContainsFunc(verbs, func(v string) bool { return v != "create" && v != "patch" && v != "delete" }) {
				t.Errorf("replicas Role grants %v on secrets, want create, patch and delete only", verbs)
			}
		}
	}
	binding := byKindName["ValidatingAdmissionPolicyBinding/ferry-secrets-"+ns]
	if binding == nil || byKindName["ValidatingAdmissionPolicy/ferry-secrets-"+ns] == nil {
		t.Fatal("no secrets policy and binding")
	}
	exprs, _, _ := unstructured.NestedSlice(binding.Object, "spec", "matchResources", "namespaceSelector", "matchExpressions")
	if len(exprs) != 1 {
		t.Fatalf("secrets policy binding selects %v", exprs)
	}
	values, _, _ := unstructured.NestedStringSlice(exprs[0].(map[string]any), "values")
	if !slices.Contains(values, ns) || !slices.Contains(values, replicasNS) {
		t.Errorf("secrets policy bound to namespaces %v, want %s and %s", values, ns, replicasNS)
	}
}
