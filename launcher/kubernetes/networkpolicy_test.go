package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher"
)

// policy reads the namespace's NetworkPolicy name; nil when there is none.
func policy(t *testing.T, c *testcluster.Cluster, ns, name string) *networkingv1.NetworkPolicy {
	t.Helper()
	np, err := c.Client().NetworkingV1().NetworkPolicies(ns).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return np
}

// ingress is what a test checks of a policy: whom it selects and whom it admits where.
type ingress struct {
	Selector metav1.LabelSelector
	Types    []networkingv1.PolicyType
	From     []networkingv1.NetworkPolicyPeer
	Ports    []int32
}

func ingressOf(np *networkingv1.NetworkPolicy) ingress {
	out := ingress{Selector: np.Spec.PodSelector, Types: np.Spec.PolicyTypes}
	for _, rule := range np.Spec.Ingress {
		out.From = append(out.From, rule.From...)
		for _, port := range rule.Ports {
			if port.Protocol == nil || *port.Protocol != corev1.ProtocolTCP || port.Port == nil || port.Port.Type != intstr.Int {
				continue
			}
			out.Ports = append(out.Ports, port.Port.IntVal)
		}
	}
	return out
}

var defaultPeers = []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "ferry"}}}}

func selects(t *testing.T, np *networkingv1.NetworkPolicy, pod *corev1.Pod) bool {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		t.Fatal(err)
	}
	return sel.Matches(labels.Set(pod.Labels))
}

// TestNetworkPolicyPerService: each service's pods are selected, from the first pod on, by
// one NetworkPolicy that admits their ports from the proxies' pods only; it follows the
// service's ports and goes with its last pod.
func TestNetworkPolicyPerService(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "np-h100-0", "NVIDIA-H100-80GB-HBM3", 8); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, c, Options{})
	ns := p.Namespace()
	first, err := p.Launch(ctx, gpuSpec("svc-1", "H100", 1))
	if err != nil {
		t.Fatal(err)
	}
	np := policy(t, c, ns, "ferry-svc")
	if np == nil {
		t.Fatal("no NetworkPolicy ferry-svc after the service's first pod")
	}
	want := ingress{
		Selector: metav1.LabelSelector{MatchLabels: map[string]string{launcher.LabelOwner: "true", launcher.LabelService: "svc"}},
		Types:    []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		From:     defaultPeers,
		Ports:    []int32{8000},
	}
	if d := cmp.Diff(want, ingressOf(np)); d != "" {
		t.Fatalf("policy (-want +got):\n%s", d)
	}
	pod, err := c.Client().CoreV1().Pods(ns).Get(ctx, first.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !selects(t, np, pod) {
		t.Fatalf("policy selector %v does not select the pod's labels %v", np.Spec.PodSelector, pod.Labels)
	}

	// A second replica on a new port (a new version) widens the ports; another service has
	// its own policy.
	second := gpuSpec("svc-2", "H100", 1)
	second.Port = 9100
	secondInst, err := p.Launch(ctx, second)
	if err != nil {
		t.Fatal(err)
	}
	other := gpuSpec("other-1", "H100", 1)
	other.Labels[launcher.LabelService] = "other"
	if _, err := p.Launch(ctx, other); err != nil {
		t.Fatal(err)
	}
	if got := ingressOf(policy(t, c, ns, "ferry-svc")).Ports; !cmp.Equal(got, []int32{8000, 9100}) {
		t.Errorf("ferry-svc ports %v, want [8000 9100]", got)
	}
	if np := policy(t, c, ns, "ferry-other"); np == nil || np.Spec.PodSelector.MatchLabels[launcher.LabelService] != "other" {
		t.Errorf("ferry-other = %v, want a policy selecting service other", np)
	}

	// The policy stays while a pod of the service is left, and goes with the last.
	if err := p.Terminate(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	if policy(t, c, ns, "ferry-svc") == nil {
		t.Fatal("ferry-svc deleted while svc-2 still runs")
	}
	if err := p.Terminate(ctx, secondInst.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "ferry-svc is deleted with the service's last pod", func() bool { return policy(t, c, ns, "ferry-svc") == nil })
	if policy(t, c, ns, "ferry-other") == nil {
		t.Error("ferry-other deleted with another service's pods")
	}
}

// TestNetworkPolicyConfiguredPeers: proxies in another namespace with other labels, and a
// controller outside the cluster by address.
func TestNetworkPolicyConfiguredPeers(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "np-b200-0", "NVIDIA-B200", 8); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, c, Options{IngressPodLabels: map[string]string{"app": "ferry-proxy"}, IngressNamespace: "ferry-system", IngressCIDRs: []string{"203.0.113.7/32"}})
	if _, err := p.Launch(ctx, gpuSpec("svc-1", "B200", 1)); err != nil {
		t.Fatal(err)
	}
	np := policy(t, c, p.Namespace(), "ferry-svc")
	if np == nil {
		t.Fatal("no NetworkPolicy ferry-svc")
	}
	want := []networkingv1.NetworkPolicyPeer{
		{
			PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "ferry-proxy"}},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "ferry-system"}},
		},
		{IPBlock: &networkingv1.IPBlock{CIDR: "203.0.113.7/32"}},
	}
	if d := cmp.Diff(want, ingressOf(np).From); d != "" {
		t.Fatalf("peers (-want +got):\n%s", d)
	}
	for name, opts := range map[string]Options{
		"cidr":      {IngressCIDRs: []string{"10.0.0.0/33"}},
		"label":     {IngressPodLabels: map[string]string{"app": "not a value"}},
		"namespace": {IngressNamespace: "Ferry_System"},
	} {
		opts.RESTConfig = c.RESTConfig()
		if _, err := New(opts); !errors.Is(err, launcher.ErrInvalid) {
			t.Errorf("%s: New = %v, want ErrInvalid", name, err)
		}
	}
}

// TestNetworkPolicyAdoption: a restarted controller (or one upgraded from a Ferry without
// policies) gives the pods it adopts their policy, and deletes a policy whose pods went away
// while no controller ran.
func TestNetworkPolicyAdoption(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "np-v100-0", "Tesla-V100-SXM2-16GB", 8); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, c, Options{})
	ns := p.Namespace()
	inst, err := p.Launch(ctx, gpuSpec("svc-1", "V100", 1))
	if err != nil {
		t.Fatal(err)
	}
	api := c.Client().NetworkingV1().NetworkPolicies(ns)
	if err := api.Delete(ctx, "ferry-svc", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	orphan := p.policyFor("gone", []int32{8000})
	if _, err := api.Create(ctx, orphan, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p2, err := New(Options{Kubeconfig: c.Kubeconfig(), Context: c.Context(), Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	got, err := p2.List(ctx, map[string]string{launcher.LabelService: "svc"})
	if err != nil || len(got) != 1 || got[0].ID != inst.ID {
		t.Fatalf("restarted provider lists %v, %v; want the pod", got, err)
	}
	if np := policy(t, c, ns, "ferry-svc"); np == nil || !cmp.Equal(ingressOf(np).Ports, []int32{8000}) {
		t.Fatalf("ferry-svc after adoption = %v, want a policy for port 8000", np)
	}
	if policy(t, c, ns, orphan.Name) != nil {
		t.Fatal("the policy of a service with no pods is still there")
	}
}

func TestPolicyName(t *testing.T) {
	for service, want := range map[string]string{
		"chat":    "ferry-chat",
		"llama.3": "ferry-llama.3",
		"":        unlabelledPolicy,
	} {
		if got := policyName(service); got != want {
			t.Errorf("policyName(%q) = %q, want %q", service, got, want)
		}
	}
	if got := policyName("Chat_v2"); !regexp.MustCompile(`^ferry-chat-v2-[0-9a-f]{8}$`).MatchString(got) {
		t.Errorf("policyName(Chat_v2) = %q, want ferry-chat-v2-HASH", got)
	}
	if policyName("Chat_v2") == policyName("chat-v2") {
		t.Error("a sanitised name collides with the plain one")
	}
}

// TestLaunchNeedsNetworkPolicyPermission: a controller that may manage pods and secrets but
// not NetworkPolicies launches nothing, rather than a pod anyone in the cluster can reach.
func TestLaunchNeedsNetworkPolicyPermission(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "np-p100-0", "Tesla-P100-PCIE-16GB", 8); err != nil {
		t.Fatal(err)
	}
	admin := newProvider(t, c, Options{})
	ns := admin.Namespace()
	cfg := grantRole(t, c, ns, "pods-only", "ferry-limited", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "secrets"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	})
	p, err := New(Options{RESTConfig: cfg, Context: "limited", Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_, err = p.Launch(ctx, gpuSpec("svc-1", "P100", 1))
	if !errors.Is(err, launcher.ErrUnauthorized) || !strings.Contains(err.Error(), "networkpolicies") {
		t.Fatalf("launch without NetworkPolicy permission: %v, want ErrUnauthorized about networkpolicies", err)
	}
	if pods, err := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err != nil || len(pods.Items) != 0 {
		t.Fatalf("pods after the refused launch: %v, %v; want none", pods, err)
	}
}

// TestNetworkPolicyHeldWhileCreating: pods of one service are created concurrently (outside
// policyMu), each selected by the policy; a policy held for a pod being created survives the
// Terminate of the service's last listed pod, and goes with the List after the hold ends.
func TestNetworkPolicyHeldWhileCreating(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "np-held-0", "NVIDIA-H100-80GB-HBM3", 8); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, c, Options{})
	ns := p.Namespace()
	insts := make([]launcher.Instance, 4)
	errs := make([]error, len(insts))
	var wg sync.WaitGroup
	for i := range insts {
		wg.Go(func() {
			spec := gpuSpec(fmt.Sprintf("held-%d", i+1), "H100", 1)
			spec.Labels[launcher.LabelService] = "held"
			insts[i], errs[i] = p.Launch(ctx, spec)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	np := policy(t, c, ns, "ferry-held")
	if np == nil {
		t.Fatal("no NetworkPolicy ferry-held after four concurrent launches")
	}
	for _, inst := range insts {
		pod, err := c.Client().CoreV1().Pods(ns).Get(ctx, inst.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !selects(t, np, pod) {
			t.Errorf("policy does not select pod %s", pod.Name)
		}
	}

	if err := p.holdPolicy(ctx, "held", 8000); err != nil {
		t.Fatal(err)
	}
	for _, inst := range insts {
		if err := p.Terminate(ctx, inst.ID); err != nil {
			t.Fatal(err)
		}
	}
	if policy(t, c, ns, "ferry-held") == nil {
		t.Fatal("ferry-held deleted while a pod of the service was being created")
	}
	p.unholdPolicy("held")
	eventually(t, "ferry-held is deleted by a List once the hold ends", func() bool {
		if _, err := p.List(ctx, map[string]string{launcher.LabelService: "held"}); err != nil {
			t.Fatal(err)
		}
		return policy(t, c, ns, "ferry-held") == nil
	})
}
