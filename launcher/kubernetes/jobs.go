package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/cache"

	"github.com/ferryserve/ferry/launcher"
)

// Jobs. A job's node is a pod like a replica's (restartPolicy Never: Ferry recovers a job, not
// the kubelet), with what a program that is meant to end needs besides:
//
//   - Priority. Services' pods run in PriorityClass "ferry-serving" (launcher.ServingPriority,
//     preemptionPolicy PreemptLowerPriority); a job's in "ferry-job-<value>" (preemptionPolicy
//     Never: jobs wait in Ferry's queue and never take a node from anyone). A preemptible job
//     runs below ServingPriority, so the scheduler preempts it when a service's pod needs its
//     GPUs; a non-preemptible one at ServingPriority or above, so it never does: the
//     service's pod then stays Pending, its launch fails with launcher.ErrNoCapacity after
//     ProvisionTimeout, and the service bursts elsewhere. The classes are created on first
//     use; where the controller may not create them, pods run without one (logged once) and
//     nothing preempts anything. Options.ServingPriority moves the whole band (services'
//     class is then "ferry-serving-<value>", and jobs keep their distance to it);
//     Options.MaxPriority caps it: no class Ferry creates or uses is above, and a job's value
//     is lowered to it.
//   - Grace. terminationGracePeriodSeconds is JobSpec.Grace (Kubernetes' 30 s when zero),
//     rounded up to whole seconds: the time between SIGTERM and SIGKILL when the pod is
//     preempted, evicted or deleted. FERRY_PREEMPTION_GRACE_SECONDS says it to the program.
//   - Checkpoint. JobSpec.CheckpointClaim names a PersistentVolumeClaim, created when missing
//     (labelled with the job, Options.CheckpointSize, Options.CheckpointStorageClass;
//     ReadWriteOnce for one node, ReadWriteMany for a gang, whose nodes all mount it) and
//     mounted at JobSpec.CheckpointDir (default /checkpoint), which FERRY_CHECKPOINT_DIR
//     names. It outlives the job's pods, so a recovered gang finds it; CleanupJob deletes it.
//     A CheckpointDir without a claim is an emptyDir, which ends with its pod.
//   - Gang addresses. A gang's pods learn their peers' IPs only once all are running:
//     LaunchGang then writes them, one per line in rank order, in the pod annotation
//     ferry.dev/node-ips, which a downwardAPI volume at /etc/ferry/podinfo (FERRY_PODINFO_DIR)
//     shows as the file node-ips. NodeIPsCommand reads that file; the script waits until it is
//     there before setup.
//   - Peers. A NetworkPolicy per job, "ferry-job-JOB", admits the job's own pods on every
//     port, so its nodes rendezvous where Ferry's policies would otherwise shut them out.
//   - End. Instance.ExitCode is the container's exit code once the pod ended by itself
//     (StateTerminated). A pod preempted by the scheduler, evicted, or deleted by anyone but
//     this provider before its program ended (a lost node, kubectl delete) is
//     StatePreempted, without one. Such a pod is soon gone from the API server (at once on
//     kwok): the provider keeps the last state of a job's pod deleted by others (a
//     tombstone) and List reports it until Terminate (or for tombstoneTTL), so a
//     preemption is not mistaken for a pod that vanished. A restarted controller has no
//     tombstones: a node it does not find was lost.
//
// Permissions, besides a service's: cluster-scoped scheduling.k8s.io priorityclasses get and
// create; in the namespace persistentvolumeclaims get, list, create and delete, and pods/log
// get (StreamLogs). Without priorityclasses pods run unprioritised (see above).

// Names, annotations and defaults of job pods.
const (
	// AnnotationNodeIPs holds a gang's pod IPs, one per line, rank 0 first.
	AnnotationNodeIPs = "ferry.dev/node-ips"
	// annotationGangSize is the number of pods in a pod's gang, for completing a gang's
	// addresses after a controller restart.
	annotationGangSize = "ferry.dev/gang-size"
	// PodInfoDir is where a job pod's downwardAPI volume is mounted.
	PodInfoDir = "/etc/ferry/podinfo"
	// EnvPodInfoDir names PodInfoDir to the program.
	EnvPodInfoDir = "FERRY_PODINFO_DIR"
	// DefaultCheckpointDir is where the checkpoint claim is mounted when JobSpec gives no
	// CheckpointDir.
	DefaultCheckpointDir = "/checkpoint"
	// DefaultCheckpointSize is the storage a checkpoint claim asks for.
	DefaultCheckpointSize = "10Gi"
	// ServingPriorityClass is the PriorityClass of services' pods at launcher.ServingPriority;
	// at another configured value its name ends in "-VALUE".
	ServingPriorityClass = "ferry-serving"

	podInfoVolume    = "ferry-podinfo"
	checkpointVolume = "ferry-checkpoint"
	nodeIPsFile      = "node-ips"
	// defaultGraceSeconds is Kubernetes' own default terminationGracePeriodSeconds, for a job
	// that sets no Grace.
	defaultGraceSeconds = 30
	// tombstoneTTL is how long List reports a job pod that others deleted.
	tombstoneTTL = time.Hour
)

// nodeIPsCommand prints the gang's addresses from the downward-API file, and fails before
// LaunchGang wrote them.
var nodeIPsCommand = `cat "${` + EnvPodInfoDir + `:-` + PodInfoDir + `}/` + nodeIPsFile + `" 2>/dev/null`

var (
	_ launcher.GangLauncher = (*Provider)(nil)
	_ launcher.LogStreamer  = (*Provider)(nil)
	_ launcher.JobCleaner   = (*Provider)(nil)
)

// jobState is what the provider keeps about jobs' pods and their classes.
type jobState struct {
	mu sync.Mutex
	// classes are the PriorityClasses known to exist ("" when they may not be created).
	classes map[string]string
	// warnedClasses is set once the missing permission was logged.
	warnedClasses bool
	// ours are pods this provider is deleting, whose deletion leaves no tombstone, with when
	// it began (forgotten after tombstoneTTL).
	ours map[string]time.Time
	// tombstones are job pods others deleted, by instance id.
	tombstones map[string]tombstone
}

type tombstone struct {
	inst launcher.Instance
	at   time.Time
}

// jobPriority is the PriorityClass value of a job: below serving when preemptible, at or above
// it when not.
func jobPriority(job *launcher.JobSpec) int32 {
	if job.Preemptible {
		return int32(min(job.Priority, launcher.ServingPriority-1))
	}
	return int32(max(job.Priority, launcher.ServingPriority))
}

// priorityClassFor is the PriorityClass a pod of spec runs in, its value and preemption policy.
// A service's replica runs at serving priority even when it is a gang of nodes (which carry a
// JobSpec so that they get the gang's addresses). A job's class keeps its distance to
// launcher.ServingPriority from the configured serving value (so the order of jobs and
// services is the same at any serving value), capped at MaxPriority.
func (p *Provider) priorityClassFor(spec launcher.Spec) (string, int32, corev1.PreemptionPolicy) {
	serving := *p.opts.ServingPriority
	if spec.Job == nil || spec.Labels[launcher.LabelService] != "" {
		if serving == launcher.ServingPriority {
			return ServingPriorityClass, serving, corev1.PreemptLowerPriority
		}
		// Classes are cluster-wide: a name per value, so Ferrys configured at different values
		// never share one.
		return ServingPriorityClass + "-" + strconv.Itoa(int(serving)), serving, corev1.PreemptLowerPriority
	}
	value := int64(jobPriority(spec.Job)) - launcher.ServingPriority + int64(serving)
	if m := p.opts.MaxPriority; m != nil {
		value = min(value, int64(*m))
	}
	return "ferry-job-" + strconv.FormatInt(value, 10), int32(value), corev1.PreemptNever
}

// addJob shapes a job node's pod: grace, downward-API addresses, checkpoint.
func addJob(pod *corev1.Pod, job *launcher.JobSpec) {
	ctr := &pod.Spec.Containers[0]
	secs := int64(defaultGraceSeconds)
	if job.Grace > 0 {
		secs = int64(math.Ceil(job.Grace.Seconds()))
	}
	pod.Spec.TerminationGracePeriodSeconds = &secs
	ctr.Env = append(ctr.Env, corev1.EnvVar{Name: launcher.EnvPreemptionGrace, Value: strconv.FormatInt(secs, 10)})
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
		Name: podInfoVolume,
		VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{{
			Path:     nodeIPsFile,
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['" + AnnotationNodeIPs + "']"},
		}}}},
	})
	ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: podInfoVolume, MountPath: PodInfoDir, ReadOnly: true})
	ctr.Env = append(ctr.Env, corev1.EnvVar{Name: EnvPodInfoDir, Value: PodInfoDir})
	if job.CheckpointClaim == "" && job.CheckpointDir == "" {
		return
	}
	dir := job.CheckpointDir
	if dir == "" {
		dir = DefaultCheckpointDir
	}
	source := corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}} // lives with the pod only
	if job.CheckpointClaim != "" {
		source = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: job.CheckpointClaim}}
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: checkpointVolume, VolumeSource: source})
	ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: checkpointVolume, MountPath: dir})
	ctr.Env = append(ctr.Env, corev1.EnvVar{Name: launcher.EnvCheckpointDir, Value: dir})
}

// ensurePriorityClass makes sure the pod's PriorityClass exists, creating it on first use. A
// controller that may not create classes runs the pod without one (logged once).
func (p *Provider) ensurePriorityClass(ctx context.Context, pod *corev1.Pod, spec launcher.Spec) error {
	name, value, policy := p.priorityClassFor(spec)
	p.jobs.mu.Lock()
	have, known := p.jobs.classes[name]
	p.jobs.mu.Unlock()
	if known {
		pod.Spec.PriorityClassName = have
		return nil
	}
	api := p.client.SchedulingV1().PriorityClasses()
	want := &schedulingv1.PriorityClass{
		ObjectMeta:       metav1.ObjectMeta{Name: name, Labels: map[string]string{labelManagedBy: "ferry", launcher.LabelOwner: "true"}},
		Value:            value,
		PreemptionPolicy: &policy,
		Description:      "Ferry: services at " + strconv.Itoa(int(*p.opts.ServingPriority)) + " preempt preemptible jobs below it; jobs never preempt",
	}
	cur, err := api.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cur, err = api.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			cur, err = api.Get(ctx, name, metav1.GetOptions{})
		}
	}
	switch {
	case apierrors.IsForbidden(err):
		p.jobs.mu.Lock()
		if !p.jobs.warnedClasses {
			p.log.Warn("priority classes may not be read or created: pods run without one, so services do not preempt preemptible jobs", zap.Error(err))
			p.jobs.warnedClasses = true
		}
		p.jobs.mu.Unlock()
		name = ""
	case err != nil:
		return p.classify(err, "ensure priority class "+name)
	case p.opts.MaxPriority != nil && cur.Value > *p.opts.MaxPriority:
		return fmt.Errorf("%w: %s: priority class %s has value %d, above kubernetes.max_priority %d: delete it (kubectl delete priorityclass %s) so that Ferry creates it at %d, or raise the cap",
			launcher.ErrInvalid, p.infra, name, cur.Value, *p.opts.MaxPriority, name, value)
	case cur.Value != value:
		p.log.Warn("priority class exists with another value; using it", zap.String("class", name), zap.Int32("value", cur.Value), zap.Int32("want", value))
	}
	p.jobs.mu.Lock()
	p.jobs.classes[name] = name
	p.jobs.mu.Unlock()
	pod.Spec.PriorityClassName = name
	return nil
}

// ensureCheckpointClaim creates the job's checkpoint claim when it is missing.
func (p *Provider) ensureCheckpointClaim(ctx context.Context, spec launcher.Spec, nodes int) error {
	job := spec.Job
	if job == nil || job.CheckpointClaim == "" {
		return nil
	}
	if errs := validation.IsDNS1123Subdomain(job.CheckpointClaim); len(errs) > 0 {
		return fmt.Errorf("%w: checkpoint claim %q: %s", launcher.ErrInvalid, job.CheckpointClaim, strings.Join(errs, "; "))
	}
	api := p.client.CoreV1().PersistentVolumeClaims(p.ns)
	if _, err := api.Get(ctx, job.CheckpointClaim, metav1.GetOptions{}); err == nil {
		return nil
	} else if !apierrors.IsNotFound(err) {
		return p.classify(err, "get checkpoint claim "+job.CheckpointClaim)
	}
	size, err := resource.ParseQuantity(p.opts.CheckpointSize)
	if err != nil {
		return fmt.Errorf("%w: checkpoint size %q: %v", launcher.ErrInvalid, p.opts.CheckpointSize, err)
	}
	mode := corev1.ReadWriteOnce
	if nodes > 1 {
		mode = corev1.ReadWriteMany
	}
	claimLabels := map[string]string{labelManagedBy: "ferry", launcher.LabelOwner: "true"}
	if j := spec.Labels[launcher.LabelJob]; j != "" {
		claimLabels[launcher.LabelJob] = j
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: job.CheckpointClaim, Labels: claimLabels},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{mode},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	if p.opts.CheckpointStorageClass != "" {
		pvc.Spec.StorageClassName = &p.opts.CheckpointStorageClass
	}
	if _, err := api.Create(ctx, pvc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return p.classify(err, "create checkpoint claim "+job.CheckpointClaim)
	}
	p.log.Info("created checkpoint claim", zap.String("claim", job.CheckpointClaim), zap.String("size", size.String()), zap.String("access", string(mode)))
	return nil
}

// jobPolicyName is the NetworkPolicy admitting a job's pods to each other.
func jobPolicyName(job string) string {
	name := "ferry-job-" + strings.ToLower(job)
	if len(validation.IsDNS1123Subdomain(name)) == 0 && len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(job))
	return "ferry-job-" + hex.EncodeToString(sum[:8])
}

// ensureJobPolicy lets the job's pods reach each other on every port.
func (p *Provider) ensureJobPolicy(ctx context.Context, job string) error {
	if job == "" {
		return nil
	}
	sel := map[string]string{launcher.LabelOwner: "true", launcher.LabelJob: job}
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{
			Name:   jobPolicyName(job),
			Labels: map[string]string{labelManagedBy: "ferry", launcher.LabelOwner: "true", launcher.LabelJob: job},
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: sel},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: maps.Clone(sel)}}},
			}},
		},
	}
	_, err := p.client.NetworkingV1().NetworkPolicies(p.ns).Create(ctx, np, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return p.classify(err, "create network policy "+np.Name)
	}
	return nil
}

// LaunchGang launches a job's n nodes in this cluster, all or nothing: every pod is created at
// once; if any stays unschedulable past ProvisionTimeout, or fails before all run, every pod
// is deleted and the error wraps launcher.ErrNoCapacity. Once all have IPs, each pod's
// annotation gets the gang's addresses (see the Jobs comment). If ctx ends first, the pods
// are deleted too: unlike a replica's, a gang's pods are no use to the next controller until
// all run (a controller killed meanwhile leaves them; List completes a gang whose pods all run,
// and the job's owner terminates one that never does). A spec without Job is n plain launches
// (launcher.LaunchEach).
func (p *Provider) LaunchGang(ctx context.Context, spec launcher.Spec, n int) ([]launcher.Instance, error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: a gang needs at least one node, got %d", launcher.ErrInvalid, n)
	}
	if spec.Job == nil {
		return launcher.LaunchEach(ctx, p, spec, n)
	}
	if err := p.ensureStarted(ctx); err != nil {
		return nil, err
	}
	job := *spec.Job
	if len(job.NodeIPs) == 0 {
		job.NodeIPsCommand = nodeIPsCommand
	}
	spec.Job = &job
	pods := make([]*corev1.Pod, n)
	nodes := make([]launcher.Spec, n)
	for rank := range n {
		nodes[rank] = launcher.GangNode(spec, rank, n)
		pod, err := p.podFor(nodes[rank])
		if err != nil {
			return nil, err
		}
		pod.Annotations[annotationGangSize] = strconv.Itoa(n)
		pods[rank] = pod
	}
	if err := p.ensureCheckpointClaim(ctx, spec, n); err != nil {
		return nil, err
	}
	if err := p.ensureJobPolicy(ctx, spec.Labels[launcher.LabelJob]); err != nil {
		return nil, err
	}
	if queuedSpec(spec) {
		queue, err := p.kueueQueue(ctx) // kueue.go
		if err != nil {
			return nil, err
		}
		if queue != "" {
			return p.launchKueue(ctx, spec, queue, pods, nodes)
		}
	}
	if p.queuedProvisioning(spec) {
		return p.launchQueued(ctx, spec, pods, nodes) // provreq.go
	}
	return p.startGang(ctx, spec, pods, nodes)
}

// startGang creates the gang's pods and waits until all run, all or nothing (LaunchGang).
func (p *Provider) startGang(ctx context.Context, spec launcher.Spec, pods []*corev1.Pod, nodes []launcher.Spec) ([]launcher.Instance, error) {
	n := len(pods)
	created := make([]*corev1.Pod, 0, n)
	rollback := func() {
		for _, pod := range created {
			p.deletePod(pod.Name)
		}
	}
	for rank, pod := range pods {
		c, err := p.create(ctx, pod, nodes[rank])
		if err != nil {
			rollback()
			return nil, err
		}
		created = append(created, c)
	}
	p.log.Info("created gang", zap.String("job", spec.Labels[launcher.LabelJob]), zap.Int("nodes", n), zap.String("first", created[0].Name))
	return p.awaitGang(ctx, created)
}

// awaitGang waits until the gang's created pods (rank order) all run, then writes their
// addresses; if any fails first, every pod is deleted and the error wraps ErrNoCapacity.
func (p *Provider) awaitGang(ctx context.Context, created []*corev1.Pod) ([]launcher.Instance, error) {
	n := len(created)
	rollback := func() {
		for _, pod := range created {
			p.deletePod(pod.Name)
		}
	}
	// Wait for all; the first to fail ends the others' waits.
	waitCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	started := make([]*corev1.Pod, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for rank, pod := range created {
		wg.Go(func() {
			started[rank], errs[rank] = p.waitStarted(waitCtx, pod)
			if errs[rank] != nil {
				cancel(errs[rank])
			}
		})
	}
	wg.Wait()
	if err := context.Cause(waitCtx); err != nil {
		rollback()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, gangError(n, err)
	}
	if err := p.annotateNodeIPs(ctx, started); err != nil {
		rollback()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, gangError(n, err)
	}
	out := make([]launcher.Instance, n)
	for rank, pod := range started {
		out[rank] = p.instance(pod)
	}
	return out, nil
}

// gangError is why a gang of n did not start: a node that failed to start is a lack of
// capacity (the next infra may have it), unless the cluster itself failed (faults.go), which
// its breaker must see as such.
func gangError(n int, err error) error {
	if errors.Is(err, launcher.ErrNoCapacity) || launcher.IsInfraFault(err) {
		return fmt.Errorf("gang of %d: %w", n, err)
	}
	return fmt.Errorf("%w: gang of %d: %w", launcher.ErrNoCapacity, n, err)
}

// annotateNodeIPs writes the gang's IPs, rank order, on each of its pods.
func (p *Provider) annotateNodeIPs(ctx context.Context, pods []*corev1.Pod) error {
	ips := make([]string, len(pods))
	for rank, pod := range pods {
		ips[rank] = pod.Status.PodIP
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{AnnotationNodeIPs: strings.Join(ips, "\n")}}})
	if err != nil {
		return err
	}
	for _, pod := range pods {
		if _, err := p.client.CoreV1().Pods(p.ns).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return p.classify(err, "write the gang's addresses on pod "+pod.Name)
		}
	}
	return nil
}

// completeGangs writes the addresses of gangs whose pods all run but lack them: a controller
// that stopped between a gang's start and its annotation leaves such a gang, which waits
// forever otherwise. A gang is the pods of one job attempt, or of one service replica; its
// size is in each pod.
func (p *Provider) completeGangs(ctx context.Context, pods []*corev1.Pod) {
	type gangKey struct{ job, attempt, service, replica string }
	gangs := map[gangKey][]*corev1.Pod{}
	for _, pod := range pods {
		k := gangKey{pod.Labels[launcher.LabelJob], pod.Labels[launcher.LabelAttempt], pod.Labels[launcher.LabelService], pod.Labels[launcher.LabelReplicaID]}
		if (k.job == "" && (k.service == "" || k.replica == "")) || pod.Annotations[annotationGangSize] == "" || pod.Annotations[AnnotationNodeIPs] != "" || pod.DeletionTimestamp != nil {
			continue
		}
		gangs[k] = append(gangs[k], pod)
	}
	for _, members := range gangs {
		size, _ := strconv.Atoi(members[0].Annotations[annotationGangSize])
		if len(members) != size || slices.ContainsFunc(members, func(pod *corev1.Pod) bool {
			return pod.Status.PodIP == "" || pod.Status.Phase != corev1.PodRunning
		}) {
			continue
		}
		slices.SortFunc(members, func(a, b *corev1.Pod) int {
			ra, _ := strconv.Atoi(a.Labels[launcher.LabelNodeRank])
			rb, _ := strconv.Atoi(b.Labels[launcher.LabelNodeRank])
			return ra - rb
		})
		if err := p.annotateNodeIPs(ctx, members); err != nil {
			p.log.Warn("complete an adopted gang's addresses", zap.String("gang", members[0].Name), zap.Error(err))
		} else {
			p.log.Info("completed an adopted gang's addresses", zap.String("gang", members[0].Name), zap.Int("nodes", size))
		}
	}
}

// CleanupJob deletes what the job held beyond its pods: its checkpoint claims (those Ferry
// created, labelled with the job), its NetworkPolicy, and its ProvisioningRequests.
func (p *Provider) CleanupJob(ctx context.Context, job string) error {
	if errs := validation.IsValidLabelValue(job); len(errs) > 0 || job == "" {
		return fmt.Errorf("%w: job %q: %s", launcher.ErrInvalid, job, strings.Join(errs, "; "))
	}
	api := p.client.CoreV1().PersistentVolumeClaims(p.ns)
	claims, err := api.List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{launcher.LabelOwner: "true", launcher.LabelJob: job}).String()})
	if err != nil {
		return p.classify(err, "list the job's claims")
	}
	for _, pvc := range claims.Items {
		if err := api.Delete(ctx, pvc.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return p.classify(err, "delete claim "+pvc.Name)
		}
		p.log.Info("deleted the job's checkpoint claim", zap.String("job", job), zap.String("claim", pvc.Name))
	}
	err = p.client.NetworkingV1().NetworkPolicies(p.ns).Delete(ctx, jobPolicyName(job), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return p.classify(err, "delete network policy "+jobPolicyName(job))
	}
	if p.opts.QueuedProvisioning != nil {
		return p.cleanupRequests(ctx, job) // provreq.go
	}
	return nil
}

// onPodDeleted keeps the last state of a job's pod that someone else deleted.
func (p *Provider) onPodDeleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	if _, isJob := pod.Labels[launcher.LabelJob]; !isJob {
		return
	}
	p.jobs.mu.Lock()
	defer p.jobs.mu.Unlock()
	if _, ours := p.jobs.ours[pod.Name]; ours {
		delete(p.jobs.ours, pod.Name)
		return
	}
	inst := takenBack(p.instance(pod))
	p.jobs.tombstones[inst.ID] = tombstone{inst: inst, at: time.Now()}
}

// takenBack is the instance of a job's pod that others deleted: unless it was preempted
// already or its program had ended, the cluster took it (a lost or drained node, or someone's
// kubectl delete), which is a preemption to whoever recovers the job.
func takenBack(inst launcher.Instance) launcher.Instance {
	if inst.State != launcher.StatePreempted && inst.ExitCode == nil {
		inst.State, inst.Reason = launcher.StatePreempted, "pod was deleted by the cluster or a user, not by Ferry"
	}
	return inst
}

// jobInstance is instance, also telling a job's pod that others are deleting (still
// terminating) as taken back.
func (p *Provider) jobInstance(pod *corev1.Pod) launcher.Instance {
	inst := p.instance(pod)
	if _, isJob := pod.Labels[launcher.LabelJob]; !isJob || pod.DeletionTimestamp == nil {
		return inst
	}
	p.jobs.mu.Lock()
	_, ours := p.jobs.ours[pod.Name]
	p.jobs.mu.Unlock()
	if ours {
		return inst
	}
	return takenBack(inst)
}

// markOurs records that this provider deletes the pod, so its deletion leaves no tombstone.
func (p *Provider) markOurs(name string) {
	p.jobs.mu.Lock()
	defer p.jobs.mu.Unlock()
	p.jobs.ours[name] = time.Now()
	delete(p.jobs.tombstones, p.infra+"/"+p.ns+"/"+name)
}

// tombstoned are the kept job pods matching selector, dropping those past tombstoneTTL.
func (p *Provider) tombstoned(selector map[string]string, now time.Time) []launcher.Instance {
	p.jobs.mu.Lock()
	defer p.jobs.mu.Unlock()
	var out []launcher.Instance
	for name, at := range p.jobs.ours {
		if now.Sub(at) > tombstoneTTL {
			delete(p.jobs.ours, name) // its deletion event never came: it was gone already
		}
	}
	for id, t := range p.jobs.tombstones {
		if now.Sub(t.at) > tombstoneTTL {
			delete(p.jobs.tombstones, id)
			continue
		}
		if launcher.Matches(t.inst.Labels, selector) {
			out = append(out, t.inst)
		}
	}
	return out
}

// checkPriorityOptions defaults ServingPriority and refuses one above MaxPriority.
func checkPriorityOptions(opts *Options) error {
	if opts.ServingPriority == nil {
		serving := int32(launcher.ServingPriority)
		if opts.MaxPriority != nil {
			serving = min(serving, *opts.MaxPriority)
		}
		opts.ServingPriority = &serving
	}
	if m := opts.MaxPriority; m != nil && *opts.ServingPriority > *m {
		return fmt.Errorf("kubernetes: %w: serving priority %d is above the maximum priority %d", launcher.ErrInvalid, *opts.ServingPriority, *m)
	}
	return nil
}
