package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ferryserve/ferry/launcher"
)

// Kueue. Where Kueue runs (its API group kueue.x-k8s.io is served and the namespace has a
// LocalQueue, or kubernetes.kueue_local_queue names one), a queued job (capacity.mode: queued)
// is submitted to Kueue instead of making its own ProvisioningRequest: Kueue queues it among
// the cluster's other work, and its ProvisioningRequest admission check, where the ClusterQueue
// has one, asks the autoscaler for the nodes and adds the consume annotations itself.
//
// The gang is a Kueue pod group (its plain-pod integration): every pod carries the labels
// kueue.x-k8s.io/queue-name and kueue.x-k8s.io/pod-group-name and the annotation
// kueue.x-k8s.io/pod-group-total-count. Kueue's webhook gates each pod
// (schedulingGates kueue.x-k8s.io/admission) and lifts the gates once it admits the group.
// LaunchGang creates the group and answers launcher.ErrQueued; later tries find the group by
// the job's label and answer ErrQueued while any pod is gated; once none is, they wait for the
// pods to run (as any gang) and relabel them with the current attempt. A group left incomplete
// (a controller stopped midway) is deleted and made again.
//
// Kueue must have its pod integration enabled for the namespace; without it nothing gates the
// pods, and the group simply runs as soon as it is scheduled.
//
// Permissions, besides a job's: discovery, and kueue.x-k8s.io localqueues list in the namespace.

// Kueue's names (sigs.k8s.io/kueue pkg/controller/jobs/pod/constants; site docs tasks/run/plain_pods).
const (
	KueueGroup               = "kueue.x-k8s.io"
	LabelKueueQueue          = "kueue.x-k8s.io/queue-name"
	LabelKueuePodGroup       = "kueue.x-k8s.io/pod-group-name"
	AnnotationKueueGroupSize = "kueue.x-k8s.io/pod-group-total-count"
	KueueSchedulingGate      = "kueue.x-k8s.io/admission"

	// kueueTTL is how long a Kueue detection is reused: a LocalQueue is rarely added, and
	// every queued try would otherwise ask discovery.
	kueueTTL = time.Minute
)

// kueueState caches the detection.
type kueueState struct {
	mu    sync.Mutex
	queue string // "" when Kueue is not there
	at    time.Time
}

// kueueQueue is the LocalQueue queued gangs go to, "" when Kueue is not detected. A
// configured queue is used as is once Kueue's group is served; otherwise the namespace's only
// LocalQueue, or among several the one named "default", else the first by name (logged).
func (p *Provider) kueueQueue(ctx context.Context) (string, error) {
	p.kueue.mu.Lock()
	defer p.kueue.mu.Unlock()
	if !p.kueue.at.IsZero() && time.Since(p.kueue.at) < kueueTTL {
		return p.kueue.queue, nil
	}
	queue, err := p.detectKueue(ctx)
	if err != nil {
		return "", err
	}
	p.kueue.queue, p.kueue.at = queue, time.Now()
	return queue, nil
}

func (p *Provider) detectKueue(ctx context.Context) (string, error) {
	groups, err := p.client.Discovery().ServerGroups()
	if err != nil {
		return "", p.classify(err, "discover API groups")
	}
	version := ""
	for _, g := range groups.Groups {
		if g.Name == KueueGroup {
			version = g.PreferredVersion.Version
		}
	}
	switch {
	case version == "" && p.opts.KueueLocalQueue != "":
		return "", fmt.Errorf("%w: %s: kueue_local_queue is %q but Kueue (API group %s) is not installed", launcher.ErrInvalid, p.infra, p.opts.KueueLocalQueue, KueueGroup)
	case version == "":
		return "", nil
	case p.opts.KueueLocalQueue != "":
		return p.opts.KueueLocalQueue, nil
	}
	gvr := schema.GroupVersionResource{Group: KueueGroup, Version: version, Resource: "localqueues"}
	list, err := p.dyn.Resource(gvr).Namespace(p.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		if apierrors.IsForbidden(err) || apierrors.IsNotFound(err) {
			p.log.Warn("Kueue is installed but its LocalQueues cannot be listed; queued jobs do not use it", zap.Error(err))
			return "", nil
		}
		return "", p.classify(err, "list Kueue LocalQueues")
	}
	var names []string
	for _, q := range list.Items {
		names = append(names, q.GetName())
	}
	slices.Sort(names)
	switch {
	case len(names) == 0:
		return "", nil
	case len(names) == 1:
		return names[0], nil
	case slices.Contains(names, "default"):
		return "default", nil
	}
	p.log.Warn("several Kueue LocalQueues; using the first (set kubernetes.kueue_local_queue)", zap.Strings("queues", names))
	return names[0], nil
}

// kueueGroupName names a job's pod group, per attempt that made it.
func kueueGroupName(job, attempt string) string { return "ferry-" + job + "-" + attempt }

// launchKueue is LaunchGang through a Kueue LocalQueue (see the comment above).
func (p *Provider) launchKueue(ctx context.Context, spec launcher.Spec, queue string, pods []*corev1.Pod, nodes []launcher.Spec) ([]launcher.Instance, error) {
	job := spec.Labels[launcher.LabelJob]
	group, err := p.kueueGroup(ctx, job, len(pods))
	if err != nil {
		return nil, err
	}
	if group == nil {
		return nil, p.submitKueue(ctx, spec, queue, pods, nodes)
	}
	name := group[0].Labels[LabelKueuePodGroup]
	if slices.ContainsFunc(group, gated) {
		return nil, launcher.Queued(group[0].CreationTimestamp.Time, "%s: waiting for Kueue to admit pod group %s/%s in LocalQueue %s",
			p.infra, p.ns, name, group[0].Labels[LabelKueueQueue])
	}
	p.log.Info("Kueue admitted the pod group", zap.String("group", name), zap.Int("nodes", len(group)))
	if err := p.relabelAttempt(ctx, group, spec.Labels[launcher.LabelAttempt]); err != nil {
		return nil, err
	}
	return p.awaitGang(ctx, group)
}

// gated reports a pod Kueue has not admitted yet.
func gated(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == KueueSchedulingGate })
}

// kueueGroup is the job's live pod group, in rank order, or nil. An incomplete or partly ended
// group is deleted: it can never be admitted or run as a whole. It asks the API server, not
// the watch cache, which may not show a group just submitted.
func (p *Provider) kueueGroup(ctx context.Context, job string, n int) ([]*corev1.Pod, error) {
	sel := labels.SelectorFromSet(labels.Set{launcher.LabelOwner: "true", launcher.LabelJob: job})
	all, err := p.client.CoreV1().Pods(p.ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, p.classify(err, "list the job's pods")
	}
	var group []*corev1.Pod
	for i := range all.Items {
		if pod := &all.Items[i]; pod.Labels[LabelKueuePodGroup] != "" && pod.DeletionTimestamp == nil {
			group = append(group, pod)
		}
	}
	if len(group) == 0 {
		return nil, nil
	}
	broken := len(group) != n || slices.ContainsFunc(group, func(pod *corev1.Pod) bool {
		return pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded || pod.Labels[LabelKueuePodGroup] != group[0].Labels[LabelKueuePodGroup]
	})
	if broken {
		p.log.Info("deleting an incomplete Kueue pod group", zap.String("job", job), zap.Int("found", len(group)), zap.Int("want", n))
		for _, pod := range group {
			p.deletePod(pod.Name)
		}
		return nil, nil
	}
	slices.SortFunc(group, func(a, b *corev1.Pod) int {
		ra, _ := strconv.Atoi(a.Labels[launcher.LabelNodeRank])
		rb, _ := strconv.Atoi(b.Labels[launcher.LabelNodeRank])
		return ra - rb
	})
	return group, nil
}

// submitKueue creates the gang's pods as one Kueue pod group in queue.
func (p *Provider) submitKueue(ctx context.Context, spec launcher.Spec, queue string, pods []*corev1.Pod, nodes []launcher.Spec) error {
	name := kueueGroupName(spec.Labels[launcher.LabelJob], spec.Labels[launcher.LabelAttempt])
	var created []*corev1.Pod
	for rank, pod := range pods {
		pod.Labels[LabelKueueQueue] = queue
		pod.Labels[LabelKueuePodGroup] = name
		pod.Annotations[AnnotationKueueGroupSize] = strconv.Itoa(len(pods))
		c, err := p.create(ctx, pod, nodes[rank])
		if err != nil {
			for _, done := range created {
				p.deletePod(done.Name)
			}
			return err
		}
		created = append(created, c)
	}
	p.log.Info("submitted the gang to Kueue", zap.String("queue", queue), zap.String("group", name), zap.Int("nodes", len(pods)))
	return launcher.Queued(created[0].CreationTimestamp.Time, "%s: submitted pod group %s/%s to Kueue LocalQueue %s", p.infra, p.ns, name, queue)
}

// relabelAttempt gives an admitted group the attempt now launching it: the jobs subsystem
// tells a gang's nodes from an earlier attempt's by that label.
func (p *Provider) relabelAttempt(ctx context.Context, group []*corev1.Pod, attempt string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{launcher.LabelAttempt: attempt}}})
	if err != nil {
		return err
	}
	for i, pod := range group {
		if pod.Labels[launcher.LabelAttempt] == attempt {
			continue
		}
		cur, err := p.client.CoreV1().Pods(p.ns).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err != nil {
			return p.classify(err, "relabel pod "+pod.Name)
		}
		group[i] = cur
	}
	return nil
}
