package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// Queued provisioning (GKE's Dynamic Workload Scheduler flex-start, or any cluster autoscaler
// with a ProvisioningRequest class). On a context with Options.QueuedProvisioning, a job whose
// task says capacity.mode: queued is not created as pods at once, which would sit
// unschedulable and be deleted after ProvisionTimeout. Instead:
//
//  1. One PodTemplate (the rank-0 pod's spec) and one ProvisioningRequest
//     (autoscaling.x-k8s.io/v1, the context's class, one podSet of count num_nodes, parameter
//     maxRunDurationSeconds from capacity.max_run_duration) ask for the whole gang.
//  2. Until its condition Provisioned is True, LaunchGang answers launcher.ErrQueued with the
//     request's own reason and its creation time: the jobs queue keeps the job PENDING, saying
//     why, and asks again at its next try. The request is found again by its ferry.job label,
//     so neither a retry nor a restarted controller makes a second one.
//  3. Once Provisioned, the gang's pods are created with the consume annotations
//     (AnnotationConsumeProvReq, AnnotationProvClass) and started like any gang; the request
//     is then marked consumed by that attempt.
//  4. Failed=True is a refusal: launcher.ErrInvalid with the reason, and the request is kept,
//     so the next try answers the same at once instead of queueing again (no retry storm).
//     CapacityRevoked or BookingExpired on a consumed request make its pods StatePreempted in
//     List, so the job is recovered; a recovered job's next launch replaces a consumed,
//     revoked or expired request with a new one. capacity.max_wait past, a request still
//     waiting is withdrawn and the launch fails over with launcher.ErrNoCapacity.
//  5. CleanupJob deletes the job's requests and templates.
//
// Permissions, besides a job's: in the namespace podtemplates get, list, create, patch and
// delete; autoscaling.x-k8s.io provisioningrequests get, list, create, patch and delete.

// ProvisioningRequest API (kubernetes/autoscaler cluster-autoscaler/apis/provisioningrequest).
const (
	// AnnotationConsumeProvReq names the ProvisioningRequest a pod consumes.
	AnnotationConsumeProvReq = "autoscaling.x-k8s.io/consume-provisioning-request"
	// AnnotationProvClass is that request's class, on the pod.
	AnnotationProvClass = "autoscaling.x-k8s.io/provisioning-class-name"
	// ParamMaxRunDuration is GKE's parameter bounding how long the provisioned nodes live.
	ParamMaxRunDuration = "maxRunDurationSeconds"

	condProvisioned     = "Provisioned"
	condFailed          = "Failed"
	condAccepted        = "Accepted"
	condBookingExpired  = "BookingExpired"
	condCapacityRevoked = "CapacityRevoked"

	// annotationConsumedBy marks a request whose pods were created, with the job attempt
	// that created them: a later attempt needs a request of its own.
	annotationConsumedBy = "ferry.dev/consumed-by-attempt"
)

// ProvisioningRequestGVR is the resource Ferry creates for a queued gang.
var ProvisioningRequestGVR = schema.GroupVersionResource{Group: "autoscaling.x-k8s.io", Version: "v1", Resource: "provisioningrequests"}

// provReq is the part of a ProvisioningRequest Ferry writes and reads.
type provReq struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              provReqSpec   `json:"spec"`
	Status            provReqStatus `json:"status,omitempty"`
}

type provReqSpec struct {
	PodSets               []provReqPodSet   `json:"podSets"`
	ProvisioningClassName string            `json:"provisioningClassName"`
	Parameters            map[string]string `json:"parameters,omitempty"`
}

type provReqPodSet struct {
	PodTemplateRef struct {
		Name string `json:"name"`
	} `json:"podTemplateRef"`
	Count int32 `json:"count"`
}

type provReqStatus struct {
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// reqState is what a request's conditions say for Ferry's next step.
type reqState int

const (
	reqWaiting     reqState = iota // not provisioned yet: keep waiting
	reqProvisioned                 // capacity is there: create the pods
	reqFailed                      // refused: fail, and remember
	reqGone                        // revoked or expired: its pods are lost, a new one is needed
)

// judgeRequest reads a request's conditions: revoked or expired first (they follow
// Provisioned), then Failed, then Provisioned; the reason is the deciding condition's.
func judgeRequest(req *provReq) (reqState, string) {
	conds := req.Status.Conditions
	why := func(c *metav1.Condition) string {
		return strings.TrimSpace(strings.TrimSuffix(c.Reason+": "+c.Message, ": "))
	}
	for _, t := range []string{condCapacityRevoked, condBookingExpired} {
		if c := meta.FindStatusCondition(conds, t); c != nil && c.Status == metav1.ConditionTrue {
			return reqGone, t + ": " + why(c)
		}
	}
	if c := meta.FindStatusCondition(conds, condFailed); c != nil && c.Status == metav1.ConditionTrue {
		return reqFailed, why(c)
	}
	if c := meta.FindStatusCondition(conds, condProvisioned); c != nil && c.Status == metav1.ConditionTrue {
		return reqProvisioned, why(c)
	}
	if c := meta.FindStatusCondition(conds, condProvisioned); c != nil {
		return reqWaiting, "not provisioned yet: " + why(c)
	}
	if c := meta.FindStatusCondition(conds, condAccepted); c != nil && c.Status == metav1.ConditionTrue {
		return reqWaiting, "accepted, waiting for capacity: " + why(c)
	}
	return reqWaiting, "not yet accepted by the cluster autoscaler"
}

// queuedSpec reports a job's gang that may wait in a queue for its capacity.
func queuedSpec(spec launcher.Spec) bool {
	return spec.Job != nil && (spec.Placement.Queued || spec.Resources.Capacity.ModeOf() == configs.CapacityQueued)
}

// queuedProvisioning reports whether spec's gang goes through a ProvisioningRequest here.
func (p *Provider) queuedProvisioning(spec launcher.Spec) bool {
	return p.opts.QueuedProvisioning != nil && queuedSpec(spec)
}

// launchQueued is LaunchGang through a ProvisioningRequest (see the comment above).
func (p *Provider) launchQueued(ctx context.Context, spec launcher.Spec, pods []*corev1.Pod, nodes []launcher.Spec) ([]launcher.Instance, error) {
	job := spec.Labels[launcher.LabelJob]
	req, err := p.liveRequest(ctx, job)
	if err != nil {
		return nil, err
	}
	if req == nil {
		if req, err = p.createRequest(ctx, spec, pods[0], len(pods)); err != nil {
			return nil, err
		}
	}
	state, why := judgeRequest(req)
	switch state {
	case reqFailed:
		return nil, fmt.Errorf("%w: %s: ProvisioningRequest %s was refused: %s", launcher.ErrInvalid, p.infra, req.Name, why)
	case reqProvisioned:
		return p.consume(ctx, spec, req, pods, nodes)
	}
	since := req.CreationTimestamp.Time
	if c := spec.Resources.Capacity; c != nil && c.MaxWait > 0 && time.Since(since) > c.MaxWait {
		p.deleteRequest(ctx, req.Name)
		return nil, fmt.Errorf("%w: %s: ProvisioningRequest %s not provisioned within max_wait %v (%s); withdrawn",
			launcher.ErrNoCapacity, p.infra, req.Name, c.MaxWait, why)
	}
	return nil, launcher.Queued(since, "%s: ProvisioningRequest %s/%s for %d node(s): %s", p.infra, p.ns, req.Name, len(pods), why)
}

// liveRequest is the job's request to wait on or consume: a failed one is kept (it answers
// every try), while one consumed by an earlier attempt, revoked or expired is deleted with its
// template. nil when there is none.
func (p *Provider) liveRequest(ctx context.Context, job string) (*provReq, error) {
	list, err := p.dyn.Resource(ProvisioningRequestGVR).Namespace(p.ns).List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(labels.Set{launcher.LabelOwner: "true", launcher.LabelJob: job}).String(),
	})
	if err != nil {
		return nil, p.classify(err, "list ProvisioningRequests (is the CRD installed?)")
	}
	var live []*provReq
	for i := range list.Items {
		req, err := fromUnstructured(&list.Items[i])
		if err != nil {
			return nil, err
		}
		state, why := judgeRequest(req)
		if req.Annotations[annotationConsumedBy] != "" || state == reqGone {
			p.log.Info("replacing a spent ProvisioningRequest", zap.String("job", job), zap.String("request", req.Name), zap.String("why", why))
			p.deleteRequest(ctx, req.Name)
			continue
		}
		live = append(live, req)
	}
	if len(live) == 0 {
		return nil, nil
	}
	slices.SortFunc(live, func(a, b *provReq) int { return b.CreationTimestamp.Compare(a.CreationTimestamp.Time) })
	for _, extra := range live[1:] {
		p.deleteRequest(ctx, extra.Name) // only a race between two controllers makes these
	}
	return live[0], nil
}

// createRequest creates the gang's PodTemplate, then its ProvisioningRequest, then makes the
// request the template's owner so that the cluster's garbage collector removes both.
func (p *Provider) createRequest(ctx context.Context, spec launcher.Spec, pod *corev1.Pod, n int) (*provReq, error) {
	name, err := podName(spec.Name)
	if err != nil {
		return nil, err
	}
	own := map[string]string{labelManagedBy: "ferry", launcher.LabelOwner: "true",
		launcher.LabelJob: spec.Labels[launcher.LabelJob], launcher.LabelAttempt: spec.Labels[launcher.LabelAttempt]}
	tmpl := &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: own},
		Template:   corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: pod.Labels, Annotations: pod.Annotations}, Spec: pod.Spec},
	}
	if _, err := p.client.CoreV1().PodTemplates(p.ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		return nil, p.classify(err, "create pod template "+name)
	}
	req := &provReq{
		TypeMeta:   metav1.TypeMeta{APIVersion: ProvisioningRequestGVR.GroupVersion().String(), Kind: "ProvisioningRequest"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: own},
		Spec:       provReqSpec{ProvisioningClassName: p.opts.QueuedProvisioning.Class, PodSets: []provReqPodSet{{Count: int32(n)}}},
	}
	req.Spec.PodSets[0].PodTemplateRef.Name = name
	if c := spec.Resources.Capacity; c != nil && c.MaxRunDuration > 0 {
		req.Spec.Parameters = map[string]string{ParamMaxRunDuration: strconv.FormatInt(int64(c.MaxRunDuration/time.Second), 10)}
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(req)
	if err != nil {
		return nil, err
	}
	created, err := p.dyn.Resource(ProvisioningRequestGVR).Namespace(p.ns).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
	if err != nil {
		p.deleteTemplate(ctx, name)
		return nil, p.classify(err, "create ProvisioningRequest "+name)
	}
	patch := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":%q,"kind":"ProvisioningRequest","name":%q,"uid":%q}]}}`,
		req.APIVersion, name, created.GetUID())
	if _, err := p.client.CoreV1().PodTemplates(p.ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		p.log.Warn("set the request as its pod template's owner", zap.String("template", name), zap.Error(err))
	}
	p.log.Info("created ProvisioningRequest", zap.String("request", name), zap.String("class", req.Spec.ProvisioningClassName),
		zap.Int("nodes", n), zap.String("job", spec.Labels[launcher.LabelJob]))
	return fromUnstructured(created)
}

// consume creates the gang's pods on the provisioned capacity and marks the request used.
func (p *Provider) consume(ctx context.Context, spec launcher.Spec, req *provReq, pods []*corev1.Pod, nodes []launcher.Spec) ([]launcher.Instance, error) {
	for _, pod := range pods {
		pod.Annotations[AnnotationConsumeProvReq] = req.Name
		pod.Annotations[AnnotationProvClass] = req.Spec.ProvisioningClassName
	}
	insts, err := p.startGang(ctx, spec, pods, nodes)
	if err != nil {
		return nil, err
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{annotationConsumedBy: spec.Labels[launcher.LabelAttempt]}}})
	if _, err := p.dyn.Resource(ProvisioningRequestGVR).Namespace(p.ns).Patch(ctx, req.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		p.log.Warn("mark the ProvisioningRequest consumed", zap.String("request", req.Name), zap.Error(err))
	}
	p.log.Info("gang started on provisioned capacity", zap.String("request", req.Name), zap.Int("nodes", len(pods)))
	return insts, nil
}

// revokedRequests maps the requests consumed by the pods selector matches whose capacity was
// taken back (CapacityRevoked, BookingExpired) to why; List reports those pods preempted.
func (p *Provider) revokedRequests(ctx context.Context, pods []*corev1.Pod, selector map[string]string) map[string]string {
	if p.opts.QueuedProvisioning == nil {
		return nil
	}
	out := map[string]string{}
	seen := map[string]bool{}
	for _, pod := range pods {
		name := pod.Annotations[AnnotationConsumeProvReq]
		if name == "" || seen[name] || pod.DeletionTimestamp != nil || !launcher.Matches(pod.Labels, selector) {
			continue
		}
		seen[name] = true
		obj, err := p.dyn.Resource(ProvisioningRequestGVR).Namespace(p.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			continue // deleted by CleanupJob or a user: nothing says the capacity went away
		}
		req, err := fromUnstructured(obj)
		if err != nil {
			continue
		}
		if state, why := judgeRequest(req); state == reqGone {
			out[name] = "ProvisioningRequest " + name + ": " + why
		}
	}
	return out
}

// cleanupRequests deletes the job's requests and templates. A cluster without the CRD has none.
func (p *Provider) cleanupRequests(ctx context.Context, job string) error {
	sel := labels.SelectorFromSet(labels.Set{launcher.LabelOwner: "true", launcher.LabelJob: job}).String()
	list, err := p.dyn.Resource(ProvisioningRequestGVR).Namespace(p.ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil && !apierrors.IsNotFound(err) {
		return p.classify(err, "list the job's ProvisioningRequests")
	}
	if list != nil {
		for _, item := range list.Items {
			p.deleteRequest(ctx, item.GetName())
		}
	}
	tmpls, err := p.client.CoreV1().PodTemplates(p.ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return p.classify(err, "list the job's pod templates")
	}
	for _, t := range tmpls.Items {
		p.deleteTemplate(ctx, t.Name)
	}
	return nil
}

// deleteRequest deletes a request and its template (same name).
func (p *Provider) deleteRequest(ctx context.Context, name string) {
	err := p.dyn.Resource(ProvisioningRequestGVR).Namespace(p.ns).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		p.log.Warn("delete ProvisioningRequest", zap.String("request", name), zap.Error(err))
	} else if err == nil {
		p.log.Info("deleted ProvisioningRequest", zap.String("request", name))
	}
	p.deleteTemplate(ctx, name)
}

func (p *Provider) deleteTemplate(ctx context.Context, name string) {
	err := p.client.CoreV1().PodTemplates(p.ns).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		p.log.Warn("delete pod template", zap.String("template", name), zap.Error(err))
	}
}

func fromUnstructured(u *unstructured.Unstructured) (*provReq, error) {
	var req provReq
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &req); err != nil {
		return nil, fmt.Errorf("read ProvisioningRequest %s: %w", u.GetName(), err)
	}
	return &req, nil
}

// gkeAccelerators are GKE's cloud.google.com/gke-accelerator values for catalog GPUs: a queued
// node pool scaled to zero has no node whose labels Ferry could copy, so a queued pod asks for
// the label GKE's nodes will carry.
var gkeAccelerators = map[string]string{
	"T4": "nvidia-tesla-t4", "L4": "nvidia-l4", "P4": "nvidia-tesla-p4", "P100": "nvidia-tesla-p100",
	"V100": "nvidia-tesla-v100", "A100": "nvidia-tesla-a100", "A100-80GB": "nvidia-a100-80gb",
	"H100": "nvidia-h100-80gb", "H100-MEGA": "nvidia-h100-mega-80gb", "H200": "nvidia-h200-141gb",
	"B200": "nvidia-b200",
}

// queuedAccelerator is the context's queued pool offering acc with at least count per node.
func (p *Provider) queuedAccelerator(acc string, count float64) (configs.Accelerator, bool) {
	if p.opts.QueuedProvisioning == nil {
		return configs.Accelerator{}, false
	}
	for _, a := range p.opts.QueuedProvisioning.Accelerators {
		if strings.EqualFold(a.Name, acc) && a.Count >= count {
			return a, true
		}
	}
	return configs.Accelerator{}, false
}

// queuedAffinity is the node affinity of a queued pod: the label the queue's nodes will carry.
// On GKE that is cloud.google.com/gke-accelerator, which its on-demand GPU nodes carry too;
// elsewhere the product label, with the values nodes that already carry acc have, else its
// catalog name.
func (p *Provider) queuedAffinity(spec launcher.Spec, acc string, count float64, values map[string][]string) (*corev1.Affinity, bool) {
	if !p.queuedProvisioning(spec) {
		return nil, false
	}
	if _, ok := p.queuedAccelerator(acc, count); !ok {
		return nil, false
	}
	if v, ok := gkeAccelerators[canonicalGPU(acc)]; ok {
		return gpuAffinity(map[string][]string{LabelGKEAccelerator: {v}}), true
	}
	product := slices.Clone(values[LabelGPUProduct])
	if len(product) == 0 {
		product = []string{acc}
	}
	return gpuAffinity(map[string][]string{LabelGPUProduct: product}), true
}

// queueWaitUnknown is the QueueWait of a queued pool: the cluster does not say how long its
// queue is, and a positive QueueWait is what marks an offering as queued capacity.
const queueWaitUnknown = time.Nanosecond

// queuedOfferings are the configured queued pools' GPUs: capacity reached through a
// ProvisioningRequest, with an unknown wait and no count of free GPUs.
func (p *Provider) queuedOfferings() []launcher.Offering {
	if p.opts.QueuedProvisioning == nil {
		return nil
	}
	var out []launcher.Offering
	for _, a := range p.opts.QueuedProvisioning.Accelerators {
		out = append(out, launcher.Offering{Accelerator: a.Name, AcceleratorCount: a.Count, PricePerHour: p.opts.CostPerHour,
			QueueWait: queueWaitUnknown, Total: -1, Free: -1})
	}
	return out
}

var _ launcher.QueueWithdrawer = (*Provider)(nil)

// WithdrawQueued drops job's requests and Kueue pod groups that attempt's running gang does
// not use: the gang started elsewhere (another context, a cloud), and capacity arriving later
// here would be for nobody.
func (p *Provider) WithdrawQueued(ctx context.Context, job string, attempt int) error {
	if err := p.ensureStarted(ctx); err != nil {
		return err
	}
	sel := labels.SelectorFromSet(labels.Set{launcher.LabelOwner: "true", launcher.LabelJob: job})
	a := strconv.Itoa(attempt)
	if p.opts.QueuedProvisioning != nil {
		list, err := p.dyn.Resource(ProvisioningRequestGVR).Namespace(p.ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
		if err != nil && !apierrors.IsNotFound(err) {
			return p.classify(err, "list the job's ProvisioningRequests")
		}
		if list != nil {
			for _, item := range list.Items {
				if item.GetAnnotations()[annotationConsumedBy] != a {
					p.deleteRequest(ctx, item.GetName())
				}
			}
		}
	}
	pods, err := p.pods.Pods(p.ns).List(sel)
	if err != nil {
		return err
	}
	for _, pod := range pods {
		if pod.Labels[LabelKueuePodGroup] != "" && (gated(pod) || pod.Labels[launcher.LabelAttempt] != a) && pod.DeletionTimestamp == nil {
			p.deletePod(pod.Name) // a group still queued in Kueue, or an earlier attempt's
		}
	}
	return nil
}
