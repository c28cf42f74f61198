package testcluster

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"
)

// The test cluster runs no cluster autoscaler. What stands in for one that serves
// ProvisioningRequests (GKE's queued provisioning, the autoscaler's atomic scale-up classes) is
// Autoscaler, a controller in the test process that talks to the real API server:
//
//   - it reads each new request of its class and the PodTemplates it names, finds a node pool
//     whose GPU label matches the template's required node affinity and whose nodes hold a
//     pod's nvidia.com/gpu, and works out the nodes the request's pods need (one pod per node
//     unless a node holds several);
//   - a request it can meet gets Accepted=True at once, then, after Delay, its nodes (kwok
//     nodes, Ready, with the pool's label) and Provisioned=True; one it cannot meet (no pool
//     fits, or the pool is out of nodes) gets Failed=True with the reason;
//   - Revoke sets CapacityRevoked=True; Reclaim deletes the request's nodes with their pods.
//
// It proves that Ferry creates valid objects (the API server checks them against the real
// CRD schema), waits for Provisioned before making pods, and consumes the nodes made for it.
// It does not model what only a cloud's autoscaler does: real queueing among requests, partial
// capacity, booking expiry timers, bin-packing beyond whole pods per node, or checking the
// consume annotations (kube-scheduler places the pods on whatever fits).

// ProvisioningRequest API names the stand-in uses.
var provReqGVR = schema.GroupVersionResource{Group: "autoscaling.x-k8s.io", Version: "v1", Resource: "provisioningrequests"}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

//go:embed crds/provisioningrequests.yaml
var provReqCRD []byte

// InstallProvisioningRequestCRD installs the ProvisioningRequest CRD (crds/provisioningrequests.yaml)
// and waits until the API server serves it. Installing it twice is not an error.
func (c *Cluster) InstallProvisioningRequestCRD(ctx context.Context) error {
	return c.installCRD(ctx, provReqCRD, provReqGVR)
}

// installCRD creates the CRD in manifest and waits until gvr lists.
func (c *Cluster) installCRD(ctx context.Context, manifest []byte, gvr schema.GroupVersionResource) error {
	var obj map[string]any
	if err := yaml.Unmarshal(manifest, &obj); err != nil {
		return fmt.Errorf("testcluster: read CRD manifest: %w", err)
	}
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		return err
	}
	_, err = dyn.Resource(crdGVR).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("testcluster: create CRD for %s: %w", gvr.Resource, err)
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := dyn.Resource(gvr).Namespace(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	})
}

// NodePool is a group of identical GPU nodes the stand-in autoscaler may add.
type NodePool struct {
	// Name prefixes the nodes' names.
	Name string
	// Label and Value are the GPU label the nodes carry, e.g.
	// cloud.google.com/gke-accelerator=nvidia-tesla-t4, matched against a template's
	// required node affinity.
	Label, Value string
	// GPUs is nvidia.com/gpu per node; MaxNodes caps the nodes the pool adds in all.
	GPUs, MaxNodes int
}

// AutoscalerOptions configure StartAutoscaler.
type AutoscalerOptions struct {
	// Class is the provisioningClassName served; default queued-provisioning.gke.io.
	Class string
	// Delay is the time between accepting a request and provisioning it.
	Delay time.Duration
	Pools []NodePool
	// Namespace limits the stand-in to one namespace's requests ("" all), so that tests
	// sharing the cluster do not serve each other's.
	Namespace string
}

// Autoscaler is the stand-in cluster autoscaler (see above).
type Autoscaler struct {
	c    *Cluster
	dyn  dynamic.Interface
	opts AutoscalerOptions

	mu      sync.Mutex
	decided map[string]bool     // ns/name of requests handled
	nodes   map[string][]string // ns/name → nodes added for it
	poolOf  map[string]string   // ns/name → the pool they came from
	used    map[string]int      // pool → nodes added
	events  []string            // what it did, in order, for test failure messages
	wg      sync.WaitGroup
}

// StartAutoscaler starts the stand-in, which runs until the test ends and then deletes the
// nodes it added.
func StartAutoscaler(t testing.TB, c *Cluster, opts AutoscalerOptions) *Autoscaler {
	t.Helper()
	if opts.Class == "" {
		opts.Class = "queued-provisioning.gke.io"
	}
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	a := &Autoscaler{c: c, dyn: dyn, opts: opts, decided: map[string]bool{}, nodes: map[string][]string{}, poolOf: map[string]string{}, used: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		a.wg.Wait()
		// Its nodes go with it: tests sharing the cluster must not find them.
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, nodes := range a.nodes {
			for _, n := range nodes {
				if err := c.DeleteNode(context.Background(), n); err != nil {
					t.Errorf("stand-in autoscaler: %v", err)
				}
			}
		}
	})
	return a
}

// run looks at the requests every 100ms until ctx ends.
func (a *Autoscaler) run(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		list, err := a.dyn.Resource(provReqGVR).Namespace(a.opts.Namespace).List(ctx, metav1.ListOptions{})
		if err == nil {
			for i := range list.Items {
				a.consider(ctx, &list.Items[i])
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// consider decides a request of the stand-in's class once.
func (a *Autoscaler) consider(ctx context.Context, req *unstructured.Unstructured) {
	class, _, _ := unstructured.NestedString(req.Object, "spec", "provisioningClassName")
	key := req.GetNamespace() + "/" + req.GetName()
	a.mu.Lock()
	seen := a.decided[key]
	a.decided[key] = true
	a.mu.Unlock()
	if seen || class != a.opts.Class {
		return
	}
	pool, nodes, why := a.fit(ctx, req)
	if pool == nil {
		a.record("refused %s: %s", key, why)
		a.setCondition(ctx, req, "Failed", "NoNodePoolFits", why)
		return
	}
	a.record("accepted %s: %d node(s) of pool %s", key, nodes, pool.Name)
	a.setCondition(ctx, req, "Accepted", "Queued", fmt.Sprintf("%d node(s) of pool %s in %v", nodes, pool.Name, a.opts.Delay))
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		select {
		case <-ctx.Done():
			return
		case <-time.After(a.opts.Delay):
		}
		a.provision(ctx, req, pool, nodes)
	}()
}

// fit finds the pool and node count for req, or says why none fits, reserving the nodes.
func (a *Autoscaler) fit(ctx context.Context, req *unstructured.Unstructured) (*NodePool, int, string) {
	sets, _, _ := unstructured.NestedSlice(req.Object, "spec", "podSets")
	var pool *NodePool
	nodes := 0
	for _, s := range sets {
		set, _ := s.(map[string]any)
		name, _, _ := unstructured.NestedString(set, "podTemplateRef", "name")
		count, _, _ := unstructured.NestedInt64(set, "count")
		tmpl, err := a.c.client.CoreV1().PodTemplates(req.GetNamespace()).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, 0, fmt.Sprintf("pod template %s: %v", name, err)
		}
		p, perNode, why := a.poolFor(&tmpl.Template.Spec)
		if p == nil {
			return nil, 0, why
		}
		if pool != nil && pool.Name != p.Name {
			return nil, 0, "pod sets need different pools; the stand-in provisions one pool per request"
		}
		pool = p
		nodes += int((count + int64(perNode) - 1) / int64(perNode))
	}
	if pool == nil {
		return nil, 0, "no pod sets"
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.used[pool.Name]+nodes > pool.MaxNodes {
		return nil, 0, fmt.Sprintf("pool %s has %d of %d node(s) left, the request needs %d", pool.Name, pool.MaxNodes-a.used[pool.Name], pool.MaxNodes, nodes)
	}
	a.used[pool.Name] += nodes
	return pool, nodes, ""
}

// poolFor is the pool whose label the pod's required affinity admits and whose nodes hold its
// GPUs, with how many such pods fit a node.
func (a *Autoscaler) poolFor(spec *corev1.PodSpec) (*NodePool, int, string) {
	var gpus int64
	for _, ctr := range spec.Containers {
		if q, ok := ctr.Resources.Requests[GPUResource]; ok {
			gpus += q.Value()
		}
	}
	var terms []corev1.NodeSelectorTerm
	if aff := spec.Affinity; aff != nil && aff.NodeAffinity != nil && aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		terms = aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	}
	for i := range a.opts.Pools {
		p := &a.opts.Pools[i]
		if !admits(terms, p.Label, p.Value) || int64(p.GPUs) < gpus {
			continue
		}
		perNode := 1
		if gpus > 0 {
			perNode = int(int64(p.GPUs) / gpus)
		}
		return p, perNode, ""
	}
	return nil, 0, fmt.Sprintf("no node pool has %d x %s for node affinity %s", gpus, GPUResource, describeTerms(terms))
}

// admits reports whether a node labelled label=value passes the terms (any one term, all of
// its In expressions; a pod with no terms fits anywhere).
func admits(terms []corev1.NodeSelectorTerm, label, value string) bool {
	if len(terms) == 0 {
		return true
	}
	for _, t := range terms {
		ok := true
		for _, e := range t.MatchExpressions {
			if e.Operator != corev1.NodeSelectorOpIn || e.Key != label || !slices.Contains(e.Values, value) {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

func describeTerms(terms []corev1.NodeSelectorTerm) string {
	var parts []string
	for _, t := range terms {
		for _, e := range t.MatchExpressions {
			parts = append(parts, e.Key+" "+string(e.Operator)+" ("+strings.Join(e.Values, ",")+")")
		}
	}
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, " or ")
}

// provision adds the request's nodes, then says Provisioned.
func (a *Autoscaler) provision(ctx context.Context, req *unstructured.Unstructured, pool *NodePool, n int) {
	key := req.GetNamespace() + "/" + req.GetName()
	var names []string
	for i := range n {
		name := fmt.Sprintf("%s-%s-%d", pool.Name, req.GetName(), i)
		err := a.c.addNodeLabelled(ctx, name, map[string]string{pool.Label: pool.Value}, corev1.ResourceList{
			GPUResource: *resource.NewQuantity(int64(pool.GPUs), resource.DecimalSI),
		})
		if err != nil {
			a.record("provision %s: %v", key, err)
			a.setCondition(ctx, req, "Failed", "ProvisioningFailed", err.Error())
			return
		}
		names = append(names, name)
	}
	a.mu.Lock()
	a.nodes[key], a.poolOf[key] = names, pool.Name
	a.mu.Unlock()
	a.record("provisioned %s: %s", key, strings.Join(names, ","))
	a.setCondition(ctx, req, "Provisioned", "Provisioned", "nodes "+strings.Join(names, ", ")+" added")
}

// Revoke says a provisioned request's capacity is taken back (CapacityRevoked=True), as a
// cloud does before it reclaims the VMs; Reclaim then removes them.
func (a *Autoscaler) Revoke(ctx context.Context, namespace, name string) error {
	obj, err := a.dyn.Resource(provReqGVR).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	a.setCondition(ctx, obj, "CapacityRevoked", "CapacityRevoked", "the nodes are being reclaimed")
	a.record("revoked %s/%s", namespace, name)
	return nil
}

// Reclaim deletes a request's nodes with their pods (Cluster.DeleteNode) and returns them to
// their pool.
func (a *Autoscaler) Reclaim(ctx context.Context, namespace, name string) error {
	key := namespace + "/" + name
	a.mu.Lock()
	nodes := a.nodes[key]
	delete(a.nodes, key)
	a.mu.Unlock()
	var errs []error
	for _, n := range nodes {
		errs = append(errs, a.c.DeleteNode(ctx, n))
	}
	a.mu.Lock()
	a.used[a.poolOf[key]] -= len(nodes)
	a.mu.Unlock()
	a.record("reclaimed %s: deleted %s", key, strings.Join(nodes, ","))
	return errors.Join(errs...)
}

// NodesOf are the nodes added for a request.
func (a *Autoscaler) NodesOf(namespace, name string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.nodes[namespace+"/"+name])
}

// Events is what the stand-in did, in order.
func (a *Autoscaler) Events() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.events)
}

func (a *Autoscaler) record(format string, args ...any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = append(a.events, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
}

// setCondition sets one condition True through the status subresource, retrying conflicts.
func (a *Autoscaler) setCondition(ctx context.Context, req *unstructured.Unstructured, typ, reason, message string) {
	api := a.dyn.Resource(provReqGVR).Namespace(req.GetNamespace())
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := api.Get(ctx, req.GetName(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		raw, _, _ := unstructured.NestedSlice(cur.Object, "status", "conditions")
		var conds []metav1.Condition
		for _, r := range raw {
			m, _ := r.(map[string]any)
			c := metav1.Condition{}
			c.Type, _ = m["type"].(string)
			c.Status = metav1.ConditionStatus(fmt.Sprint(m["status"]))
			c.Reason, _ = m["reason"].(string)
			c.Message, _ = m["message"].(string)
			if ts, ok := m["lastTransitionTime"].(string); ok {
				if parsed, err := time.Parse(time.RFC3339, ts); err == nil {
					c.LastTransitionTime = metav1.NewTime(parsed)
				}
			}
			conds = append(conds, c)
		}
		meta.SetStatusCondition(&conds, metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: reason, Message: message})
		if typ == "Provisioned" || typ == "Failed" {
			meta.SetStatusCondition(&conds, metav1.Condition{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", Message: "handled by the stand-in autoscaler"})
		}
		out := make([]any, len(conds))
		for i, c := range conds {
			out[i] = map[string]any{"type": c.Type, "status": string(c.Status), "reason": c.Reason, "message": c.Message,
				"lastTransitionTime": c.LastTransitionTime.UTC().Format(time.RFC3339)}
		}
		if err := unstructured.SetNestedSlice(cur.Object, out, "status", "conditions"); err != nil {
			return err
		}
		_, err = api.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil && ctx.Err() == nil {
		a.record("set %s on %s/%s: %v", typ, req.GetNamespace(), req.GetName(), err)
	}
}

// addNodeLabelled creates a kwok GPU node with extra labels (a node pool's) and waits until it
// is Ready.
func (c *Cluster) addNodeLabelled(ctx context.Context, name string, labels map[string]string, gpus corev1.ResourceList) error {
	resources := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	maps.Copy(resources, gpus)
	l := map[string]string{"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
	maps.Copy(l, labels)
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{KwokNodeAnnotation: "fake"}, Labels: l},
		Status:     corev1.NodeStatus{Capacity: resources, Allocatable: resources.DeepCopy()},
	}
	if _, err := c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	return c.waitNodeReady(ctx, name)
}
