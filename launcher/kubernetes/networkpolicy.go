package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ferryserve/ferry/launcher"
)

// Who may reach a replica pod's service port. Each service's pods (by their ferry.service
// label) are selected by one NetworkPolicy, "ferry-SERVICE", that admits their container
// ports only from the proxies: pods labelled Options.IngressPodLabels (default
// DefaultIngressPodLabels) in Options.IngressNamespace (default the replicas' namespace), and
// Options.IngressCIDRs (a controller outside the cluster). Being selected by a policy of type
// Ingress, the pods refuse everything else, on every port. The cluster's network plugin
// enforces it; one without NetworkPolicy support ignores it.
//
// The policy is created or updated before a service's pod is created, under policyMu, and held
// (holdPolicy) until the pod exists, so no pod runs unselected; the API calls that create and
// delete pods run outside policyMu, so that a thousand pods are not created one at a time. It
// is deleted by Terminate of the service's last pod, or, when other pods were still
// terminating then, by the List that no longer sees any. List also creates the
// policies of services whose pods an earlier controller (or an older Ferry) launched.
//
// The controller needs networking.k8s.io networkpolicies get, list, create, update and
// delete in the namespace: without them a launch fails (ErrUnauthorized) rather than run a
// replica anyone in the cluster can reach.

// DefaultIngressPodLabels select the controller's and attached proxies' pods when
// Options.IngressPodLabels is empty: the recommended app.kubernetes.io/name label.
var DefaultIngressPodLabels = map[string]string{"app.kubernetes.io/name": "ferry"}

const (
	// unlabelledPolicy selects Ferry's pods that carry no ferry.service label. No service's
	// policy can have this name: a label value starts with a letter or digit.
	unlabelledPolicy = "ferry--unlabelled"
	// policyRetry is how long List waits after failing to sync policies before trying again.
	policyRetry = time.Minute
)

// policyState is what the provider knows of its NetworkPolicies.
type policyState struct {
	// ports are the container ports each service's policy admits, by service ("" for
	// unlabelled pods), as this process last wrote or read them.
	ports map[string][]int32
	// read is set once Ferry's existing policies were listed.
	read bool
	// retryAt delays the next sync after one failed.
	retryAt time.Time
	// creating counts, by service, the pods being created outside policyMu (holdPolicy): their
	// service's policy must not be deleted meanwhile, though no listing shows them yet.
	creating map[string]int
}

// checkIngressOptions validates the ingress options and fills in the defaults.
func checkIngressOptions(opts *Options) error {
	if len(opts.IngressPodLabels) == 0 {
		// Never an empty selector: it would admit every pod of the namespace.
		opts.IngressPodLabels = maps.Clone(DefaultIngressPodLabels)
	}
	for k, v := range opts.IngressPodLabels {
		if errs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(errs) > 0 {
			return fmt.Errorf("kubernetes: %w: ingress pod label %s=%q: %s", launcher.ErrInvalid, k, v, strings.Join(errs, "; "))
		}
	}
	if ns := opts.IngressNamespace; ns != "" && len(validation.IsDNS1123Label(ns)) > 0 {
		return fmt.Errorf("kubernetes: %w: ingress namespace %q is not a namespace name", launcher.ErrInvalid, ns)
	}
	cidrs := make([]string, len(opts.IngressCIDRs))
	for i, c := range opts.IngressCIDRs {
		prefix, err := netip.ParsePrefix(strings.TrimSpace(c))
		if err != nil {
			return fmt.Errorf("kubernetes: %w: ingress CIDR %q: %v", launcher.ErrInvalid, c, err)
		}
		cidrs[i] = prefix.Masked().String()
	}
	opts.IngressCIDRs = cidrs
	return nil
}

// policyName is the NetworkPolicy of service's pods: "ferry-SERVICE" when that is a valid
// name, else its lowercase form with a hash of the service.
func policyName(service string) string {
	if service == "" {
		return unlabelledPolicy
	}
	name := "ferry-" + service
	if len(validation.IsDNS1123Subdomain(name)) == 0 {
		return name
	}
	var b strings.Builder
	for _, r := range strings.ToLower(service) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	sum := sha256.Sum256([]byte(service))
	return "ferry-" + strings.Trim(b.String(), "-.") + "-" + hex.EncodeToString(sum[:4])
}

// serviceSelector selects Ferry's pods of service (those without the label when "").
func serviceSelector(service string) metav1.LabelSelector {
	sel := metav1.LabelSelector{MatchLabels: map[string]string{launcher.LabelOwner: "true"}}
	if service == "" {
		sel.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: launcher.LabelService, Operator: metav1.LabelSelectorOpDoesNotExist}}
	} else {
		sel.MatchLabels[launcher.LabelService] = service
	}
	return sel
}

// policyFor is service's NetworkPolicy admitting ports from the proxies.
func (p *Provider) policyFor(service string, ports []int32) *networkingv1.NetworkPolicy {
	objLabels := map[string]string{labelManagedBy: "ferry", launcher.LabelOwner: "true"}
	if service != "" {
		objLabels[launcher.LabelService] = service
	}
	proxies := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: maps.Clone(p.opts.IngressPodLabels)}}
	if ns := p.opts.IngressNamespace; ns != "" && ns != p.ns {
		proxies.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}
	}
	peers := []networkingv1.NetworkPolicyPeer{proxies}
	for _, c := range p.opts.IngressCIDRs {
		peers = append(peers, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: c}})
	}
	tcp := corev1.ProtocolTCP
	var policyPorts []networkingv1.NetworkPolicyPort
	for _, port := range ports {
		portValue := intstr.FromInt32(port)
		policyPorts = append(policyPorts, networkingv1.NetworkPolicyPort{Protocol: &tcp, Port: &portValue})
	}
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: policyName(service), Labels: objLabels},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: serviceSelector(service),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: peers, Ports: policyPorts}},
		},
	}
}

// servicePods lists service's pods from the API server (not the watch cache, which may not
// have a pod just created yet).
func (p *Provider) servicePods(ctx context.Context, service string) ([]corev1.Pod, error) {
	sel := serviceSelector(service)
	selector, err := metav1.LabelSelectorAsSelector(&sel)
	if err != nil {
		return nil, err
	}
	list, err := p.client.CoreV1().Pods(p.ns).List(ctx, metav1.ListOptions{LabelSelector: selector.String()})
	if err != nil {
		return nil, p.classify(err, "list the pods of service "+service)
	}
	return list.Items, nil
}

func podPort(pod *corev1.Pod) (int32, bool) {
	if len(pod.Spec.Containers) == 0 || len(pod.Spec.Containers[0].Ports) == 0 {
		return 0, false
	}
	return pod.Spec.Containers[0].Ports[0].ContainerPort, true
}

// ensurePolicy creates or updates service's policy to admit port (0: none more) and the ports
// of its pods. Callers hold policyMu.
func (p *Provider) ensurePolicy(ctx context.Context, service string, port int32) error {
	pods, err := p.servicePods(ctx, service)
	if err != nil {
		return err
	}
	var ports []int32
	if port > 0 {
		ports = append(ports, port)
	}
	for i := range pods {
		if pp, ok := podPort(&pods[i]); ok && !slices.Contains(ports, pp) {
			ports = append(ports, pp)
		}
	}
	if len(ports) == 0 {
		return nil
	}
	slices.Sort(ports)
	want := p.policyFor(service, ports)
	api := p.client.NetworkingV1().NetworkPolicies(p.ns)
	cur, err := api.Get(ctx, want.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := api.Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return p.classify(err, "create network policy "+want.Name)
		}
		p.log.Info("created network policy: the service's pods admit the proxies only", zap.String("policy", want.Name), zap.Any("ports", ports))
	case err != nil:
		return p.classify(err, "get network policy "+want.Name)
	case !apiequality.Semantic.DeepEqual(cur.Spec, want.Spec) || !maps.Equal(cur.Labels, want.Labels):
		cur.Spec, cur.Labels = want.Spec, want.Labels
		if _, err := api.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return p.classify(err, "update network policy "+want.Name)
		}
		p.log.Info("updated network policy", zap.String("policy", want.Name), zap.Any("ports", ports))
	}
	p.policy.ports[service] = ports
	return nil
}

// holdPolicy makes sure service's policy admits port, creating or updating it when this process
// does not know it to, and keeps it from being deleted until unholdPolicy: the pod about to be
// created is in no listing yet.
func (p *Provider) holdPolicy(ctx context.Context, service string, port int32) error {
	p.policyMu.Lock()
	defer p.policyMu.Unlock()
	if !slices.Contains(p.policy.ports[service], port) {
		if err := p.ensurePolicy(ctx, service, port); err != nil {
			return err
		}
	}
	p.policy.creating[service]++
	return nil
}

// unholdPolicy ends a holdPolicy, once the pod was created (or failed to be).
func (p *Provider) unholdPolicy(service string) {
	p.policyMu.Lock()
	defer p.policyMu.Unlock()
	if p.policy.creating[service]--; p.policy.creating[service] <= 0 {
		delete(p.policy.creating, service)
	}
}

// releasePolicy deletes service's policy when no pod of it is left but gone (the one just
// deleted) and none is being created. Pods still terminating keep it; List deletes it once they
// are gone. When the watch cache still shows a pod of the service that nobody is deleting, the
// policy stays without asking the API server (the last pod's Terminate asks). Callers hold
// policyMu.
func (p *Provider) releasePolicy(ctx context.Context, service, gone string) error {
	if p.policy.creating[service] > 0 || p.cachedLivePod(service, gone) {
		return nil
	}
	pods, err := p.servicePods(ctx, service)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(pods, func(pod corev1.Pod) bool { return pod.Name != gone }) {
		return nil
	}
	name := policyName(service)
	err = p.client.NetworkingV1().NetworkPolicies(p.ns).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return p.classify(err, "delete network policy "+name)
	}
	delete(p.policy.ports, service)
	p.log.Info("deleted network policy with the service's last pod", zap.String("policy", name))
	return nil
}

// cachedLivePod reports whether the watch cache holds a pod of service other than gone that is
// not being deleted, by anyone or by this provider.
func (p *Provider) cachedLivePod(service, gone string) bool {
	if p.pods == nil {
		return false
	}
	pods, err := p.pods.Pods(p.ns).List(labels.SelectorFromSet(labels.Set{launcher.LabelOwner: "true", launcher.LabelService: service}))
	if err != nil {
		return false
	}
	p.jobs.mu.Lock()
	defer p.jobs.mu.Unlock()
	for _, pod := range pods {
		if _, deleting := p.jobs.ours[pod.Name]; pod.Name != gone && pod.DeletionTimestamp == nil && !deleting {
			return true
		}
	}
	return false
}

// readPolicies learns Ferry's existing policies in the namespace, once, so that those whose
// pods went away while no controller ran are deleted too. Callers hold policyMu.
func (p *Provider) readPolicies(ctx context.Context) error {
	if p.policy.read {
		return nil
	}
	list, err := p.client.NetworkingV1().NetworkPolicies(p.ns).List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{labelManagedBy: "ferry", launcher.LabelOwner: "true"}).String(),
	})
	if err != nil {
		return p.classify(err, "list network policies")
	}
	for _, np := range list.Items {
		if _, isJob := np.Labels[launcher.LabelJob]; isJob {
			continue // a job's own policy (jobs.go), not a service's
		}
		var ports []int32
		for _, rule := range np.Spec.Ingress {
			for _, port := range rule.Ports {
				if port.Port != nil {
					ports = append(ports, port.Port.IntVal)
				}
			}
		}
		if _, known := p.policy.ports[np.Labels[launcher.LabelService]]; !known {
			p.policy.ports[np.Labels[launcher.LabelService]] = ports
		}
	}
	p.policy.read = true
	return nil
}

// syncPolicies, from List, gives every service with pods in the watch cache a policy that
// admits their ports (pods an earlier controller launched), and deletes the policies of
// services with none left. It acts only on a difference, so a steady List makes no request.
// It never waits for policyMu: while another goroutine writes a policy (the first pod of a new
// service, a sync of another List) this List skips the sync, and a later one makes it, so that
// a hundred services' Lists do not queue behind each other's policy writes.
func (p *Provider) syncPolicies(ctx context.Context) {
	if !p.policyMu.TryLock() {
		return
	}
	defer p.policyMu.Unlock()
	if time.Now().Before(p.policy.retryAt) {
		return
	}
	pods, err := p.pods.Pods(p.ns).List(labels.SelectorFromSet(labels.Set{launcher.LabelOwner: "true"}))
	if err == nil {
		err = p.readPolicies(ctx)
	}
	live := map[string][]int32{}
	for _, pod := range pods {
		svc := pod.Labels[launcher.LabelService]
		if port, ok := podPort(pod); ok && !slices.Contains(live[svc], port) {
			live[svc] = append(live[svc], port)
		}
	}
	for svc, ports := range live {
		if err != nil {
			break
		}
		if have, ok := p.policy.ports[svc]; !ok || slices.ContainsFunc(ports, func(port int32) bool { return !slices.Contains(have, port) }) {
			err = p.ensurePolicy(ctx, svc, 0)
		}
	}
	for svc := range p.policy.ports {
		if _, ok := live[svc]; !ok && err == nil {
			err = p.releasePolicy(ctx, svc, "")
		}
	}
	if err != nil {
		p.policy.retryAt = time.Now().Add(policyRetry)
		p.log.Warn("could not sync the services' network policies; retrying later", zap.Error(err))
	}
}
