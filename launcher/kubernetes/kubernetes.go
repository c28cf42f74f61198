// Package kubernetes is the launcher.Provider for a Kubernetes cluster: one pod per instance,
// in one namespace of one kubeconfig context.
//
// The replica manager owns a pod's lifecycle, so pods never restart on their own
// (restartPolicy Never) and no Deployment or ReplicaSet sits between Ferry and its pods. Pods
// carry Ferry's labels, so a restarted controller adopts them by label and `kubectl get pods -l
// ferry.managed=true` shows what Ferry made. The provider reads pods and nodes through watches
// (informers), never a polling loop.
//
// Each service's pods are selected by a NetworkPolicy that admits their port from the
// proxies only (networkpolicy.go).
//
// A pod the scheduler cannot place within ProvisionTimeout is deleted and its launch fails
// with launcher.ErrNoCapacity: that is what lets the next candidate (another context, a cloud)
// take the replica — cloud burst.
//
// An API server that fails costs the rest of Ferry nothing: every error is classified
// (launcher.ErrThrottled, launcher.ErrUnavailable), every request has a deadline
// (Options.RequestTimeout), and List, which reads the watch cache, reports the whole cluster as
// a launcher.Gap once the watch has failed for Options.WatchFailureThreshold (faults.go).
//
// Jobs' pods (launcher.Spec.Job) add priority classes, checkpoint claims, gangs and exit
// codes (jobs.go); pod logs are read through the API server (logs.go). Every pod mounts no
// service-account token and runs with a restricted security context unless its task asks for
// more (securitycontext.go).
//
// Permissions the controller needs: in the namespace, pods get, list, watch, create, patch
// and delete; secrets create, patch and delete; networking.k8s.io networkpolicies get, list,
// create, update and delete; persistentvolumeclaims get, list, create and delete (jobs'
// checkpoints); pods/log get (logs). Cluster-wide: nodes list and watch (accelerators,
// offerings; optional), pods list (GPUs in use; optional), scheduling.k8s.io priorityclasses
// get and create (optional: without it nothing is prioritised, so services do not preempt
// jobs). Queued jobs add podtemplates and autoscaling.x-k8s.io provisioningrequests (get, list,
// create, patch, delete; provreq.go) and kueue.x-k8s.io localqueues list (kueue.go).
package kubernetes

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/buckets"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// Defaults for Options.
const (
	// DefaultProvisionTimeout is how long a pod may stay unschedulable before its launch is a
	// capacity error. A cluster autoscaler adding a GPU node takes minutes; a fixed cluster
	// answers at once, and waiting then only delays the burst.
	DefaultProvisionTimeout = 60 * time.Second
	// DefaultStartTimeout bounds the wait, after scheduling, for the pod's IP (sandbox up).
	DefaultStartTimeout = 10 * time.Minute
	// DefaultImage runs tasks without image_id: it has bash, which the command needs.
	DefaultImage = "ubuntu:24.04"
	// DefaultPort is the container port when the spec gives none.
	DefaultPort = 8080
	// InfraName is the infra prefix; a provider's infra is "kubernetes/CONTEXT".
	InfraName = "kubernetes"
)

// Labels and annotations Ferry adds besides the spec's own labels.
const (
	labelManagedBy      = "app.kubernetes.io/managed-by"
	annotationPrice     = "ferry.dev/price-per-hour"
	annotationInfra     = "ferry.dev/infra"
	containerName       = "replica"
	deleteTimeout       = 30 * time.Second
	informerSyncTimeout = 30 * time.Second
)

// Options configures a Provider for one context and namespace.
type Options struct {
	// Kubeconfig is the kubeconfig file; "" uses $KUBECONFIG, then ~/.kube/config.
	Kubeconfig string
	// Context is the kubeconfig context; "" is the current context.
	Context string
	// Namespace is where pods go; "" is the context's namespace, else "default".
	Namespace string
	// Buckets lists the s3:// sources of file_mounts and presigns their downloads (files.go);
	// nil is buckets.New with the controller's own credentials.
	Buckets nodefiles.Buckets
	// TenantBuckets are the bucket clients made from tenants' Secrets, for FerryServices'
	// s3+secret:// sources (tenantbuckets.go); nil is an empty registry, which the controller
	// fills.
	TenantBuckets *TenantBuckets
	// CostPerHour is what one pod is taken to cost, for the optimizer and status (default 0:
	// a cluster the user already pays for comes first).
	CostPerHour float64
	// ProvisionTimeout is how long a pod may stay unschedulable; default DefaultProvisionTimeout.
	ProvisionTimeout time.Duration
	// StartTimeout bounds the wait for a scheduled pod's IP; default DefaultStartTimeout.
	StartTimeout time.Duration
	// Image is used when a task sets no image_id; default DefaultImage.
	Image string
	// IngressPodLabels and IngressNamespace select the pods that may reach replicas' service
	// port, the controller's and attached proxies' (default DefaultIngressPodLabels, in the
	// replicas' namespace); IngressCIDRs add address ranges, for a controller outside the
	// cluster. Each service's NetworkPolicy admits those only (networkpolicy.go).
	IngressPodLabels map[string]string
	IngressNamespace string
	IngressCIDRs     []string
	Logger           *zap.Logger
	// RESTConfig, when set, is used instead of Kubeconfig (in-cluster or tests); Context then
	// only names the infra.
	RESTConfig *rest.Config
	// GPUSchedulerName is the scheduler of pods that share a GPU; default
	// DefaultGPUSchedulerName (HAMi's). Clusters name it differently.
	GPUSchedulerName string
	// CheckpointSize is the storage a job's checkpoint claim asks for; default
	// DefaultCheckpointSize. CheckpointStorageClass is its storage class ("" the cluster's
	// default); a gang's claim needs one that offers ReadWriteMany.
	CheckpointSize         string
	CheckpointStorageClass string
	// QueuedProvisioning marks a context whose cluster autoscaler provisions capacity for
	// ProvisioningRequests of its class: queued jobs go through one (provreq.go). nil: none.
	QueuedProvisioning *configs.QueuedProvisioning
	// KueueLocalQueue is the LocalQueue queued jobs are submitted to where Kueue runs; ""
	// looks for one (kueue.go).
	KueueLocalQueue string
	// RequestTimeout bounds each request to the API server, so that a hung one is cut even
	// inside a long Launch; default DefaultRequestTimeout (faults.go).
	RequestTimeout time.Duration
	// ServingPriority is the value of the PriorityClass services' pods run in; nil is
	// launcher.ServingPriority, or MaxPriority when that is lower. Jobs' classes keep their
	// distance to it (jobs.go).
	ServingPriority *int32
	// MaxPriority caps every PriorityClass the provider creates or uses, the cluster admin's
	// bound (the chart enforces it in the API server too); nil: no cap.
	MaxPriority *int32
	// WatchFailureThreshold is how long the watches may fail before List reports the whole
	// cluster as a gap and a launch waiting for its pod gives up; default
	// DefaultWatchFailureThreshold (faults.go).
	WatchFailureThreshold time.Duration
	// QPS and Burst are the client-side rate limit of each of the provider's clients (the
	// controller's --kube-api-qps and --kube-api-burst); 0 takes DefaultQPS and DefaultBurst, a
	// negative QPS turns client-side limiting off (the API server's priority and fairness
	// still applies).
	QPS   float32
	Burst int
}

// DefaultQPS and DefaultBurst are the client-side rate limit Ferry's Kubernetes clients use
// unless configured, instead of client-go's 5 QPS and burst 10, which made 20 services × 5
// replicas take 97 s to become READY where 200 QPS took 15 s (issue 36).
//
// Sized for 1,000 replicas: the 97 s at 5 QPS put about 5 requests per replica through the
// busier client (the launcher's pod, Secret and NetworkPolicy writes and reads; the store's
// record writes through PROVISIONING, STARTING and READY); allowing 10 for retries and serve
// down, 1,000 replicas launched at once are ~10,000 requests, 50 s at 200 QPS, inside the 120 s
// a scale-up of that size is given, and a burst of 400 lets the first wave of a `serve up` go
// out unthrottled. Each client (store, launcher, leader election, FerryService watch) has its
// own token bucket, and the API server's priority and fairness protects it from the sum.
const (
	DefaultQPS   float32 = 200
	DefaultBurst int     = 400
)

// RateLimit sets cfg's client-side rate limit to qps and burst, DefaultQPS and DefaultBurst
// for zeros; a negative qps leaves client-go without a limiter. Every Kubernetes client Ferry
// builds goes through it, so that none is left at client-go's defaults.
func RateLimit(cfg *rest.Config, qps float32, burst int) {
	cfg.QPS, cfg.Burst = cmp.Or(qps, DefaultQPS), cmp.Or(burst, DefaultBurst)
	cfg.RateLimiter = nil // a limiter set by the caller would override QPS and Burst
}

// Provider launches pods in one namespace of one context. Create it with New; it connects
// lazily, so a controller starts even while the cluster is unreachable.
type Provider struct {
	opts   Options
	log    *zap.Logger
	client kubernetes.Interface // every request, each within RequestTimeout
	// streams is client without RequestTimeout, for what streams for minutes: watches and
	// followed logs (faults.go).
	streams kubernetes.Interface
	dyn     dynamic.Interface // ProvisioningRequests, Kueue's LocalQueues
	infra   string
	ns      string

	startMu  sync.Mutex
	started  bool
	stop     chan struct{}
	pods     listerscorev1.PodLister
	nodes    listerscorev1.NodeLister // nil when nodes may not be listed
	podsSync cache.InformerSynced
	// podsHealth and nodesHealth say whether the informers' watches work (faults.go);
	// nodesHealth is nil when nodes may not be listed.
	podsHealth, nodesHealth *watchHealth

	// usedMu guards the last cluster-wide count of GPUs in use (see gpusInUse).
	usedMu sync.Mutex
	used   map[string]int64
	usedAt time.Time

	// policyMu orders the creation and deletion of pods against their services'
	// NetworkPolicies, so that no pod runs without one (holdPolicy); it guards policy.
	policyMu sync.Mutex
	policy   policyState

	// jobs keeps priority classes, and the last state of jobs' pods deleted by others.
	jobs jobState
	// kueue caches whether Kueue runs and its LocalQueue (kueue.go).
	kueue kueueState
}

// usedTTL is how long a cluster-wide count of GPUs in use is reused: every launch plans, and
// a burst of launches would otherwise list every pod in the cluster once each.
const usedTTL = 10 * time.Second

var (
	_ launcher.Provider  = (*Provider)(nil)
	_ launcher.Offerer   = (*Provider)(nil)
	_ launcher.Checker   = (*Provider)(nil)
	_ launcher.LogHinter = (*Provider)(nil)
)

// New resolves the context and namespace from the kubeconfig and returns a Provider. It does
// not contact the cluster.
func New(opts Options) (*Provider, error) {
	launcher.SetDefault(&opts.ProvisionTimeout, DefaultProvisionTimeout)
	launcher.SetDefault(&opts.StartTimeout, DefaultStartTimeout)
	launcher.SetDefault(&opts.Image, DefaultImage)
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	launcher.SetDefault(&opts.GPUSchedulerName, DefaultGPUSchedulerName)
	if opts.Buckets == nil {
		opts.Buckets = buckets.New(buckets.Options{})
	}
	if opts.TenantBuckets == nil {
		opts.TenantBuckets = NewTenantBuckets()
	}
	launcher.SetDefault(&opts.CheckpointSize, DefaultCheckpointSize)
	launcher.SetDefault(&opts.RequestTimeout, DefaultRequestTimeout)
	launcher.SetDefault(&opts.WatchFailureThreshold, DefaultWatchFailureThreshold)
	if err := checkPriorityOptions(&opts); err != nil {
		return nil, err
	}
	if err := checkIngressOptions(&opts); err != nil {
		return nil, err
	}
	routeKlog(opts.Logger)
	cfg, ctxName, ns, err := clusterConfig(opts)
	if err != nil {
		return nil, err
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "ferry"
	RateLimit(cfg, opts.QPS, opts.Burst)
	streamCfg := rest.CopyConfig(cfg)
	streamCfg.Timeout = 0 // bounded otherwise (faults.go)
	cfg.Timeout = opts.RequestTimeout
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: context %q: %w", ctxName, err)
	}
	streams, err := kubernetes.NewForConfig(streamCfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: context %q: %w", ctxName, err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: context %q: %w", ctxName, err)
	}
	infra := InfraName + "/" + ctxName
	return &Provider{
		opts:    opts,
		log:     opts.Logger.With(zap.String("infra", infra), zap.String("namespace", ns)),
		client:  client,
		streams: streams,
		dyn:     dyn,
		infra:   infra,
		ns:      ns,
		policy:  policyState{ports: map[string][]int32{}, creating: map[string]int{}},
		jobs:    jobState{classes: map[string]string{}, ours: map[string]time.Time{}, tombstones: map[string]tombstone{}},
	}, nil
}

// clusterConfig is the cluster opts name: opts.RESTConfig as it is, or the context of the
// kubeconfig (its current one unless opts.Context names another), with the context's name
// ("in-cluster" for a RESTConfig without one) and the namespace (the context's, else
// "default", unless opts.Namespace names one).
func clusterConfig(opts Options) (cfg *rest.Config, ctxName, ns string, err error) {
	cfg = opts.RESTConfig
	ctxName, ns = opts.Context, opts.Namespace
	if cfg == nil {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		if opts.Kubeconfig != "" {
			rules.ExplicitPath = opts.Kubeconfig
		}
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: opts.Context})
		raw, err := cc.RawConfig()
		if err != nil {
			return nil, "", "", fmt.Errorf("kubernetes: read kubeconfig: %w", err)
		}
		if ctxName == "" {
			ctxName = raw.CurrentContext
		}
		if _, ok := raw.Contexts[ctxName]; !ok || ctxName == "" {
			return nil, "", "", fmt.Errorf("kubernetes: %w: context %q is not in the kubeconfig (%s)", launcher.ErrInvalid, ctxName, kubeconfigPaths(rules))
		}
		if cfg, err = cc.ClientConfig(); err != nil {
			return nil, "", "", fmt.Errorf("kubernetes: context %q: %w", ctxName, err)
		}
		if ns == "" {
			ns, _, _ = cc.Namespace()
		}
	}
	if ctxName == "" {
		ctxName = "in-cluster"
	}
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	return cfg, ctxName, ns, nil
}

func kubeconfigPaths(rules *clientcmd.ClientConfigLoadingRules) string {
	if rules.ExplicitPath != "" {
		return rules.ExplicitPath
	}
	if len(rules.Precedence) > 0 {
		return strings.Join(rules.Precedence, string(os.PathListSeparator))
	}
	return filepath.Join("~", ".kube", "config")
}

// Infra is "kubernetes/CONTEXT", the infra name instances and the optimizer use.
func (p *Provider) Infra() string { return p.infra }

// Namespace is where the provider's pods live.
func (p *Provider) Namespace() string { return p.ns }

// Close stops the watches.
func (p *Provider) Close() {
	p.startMu.Lock()
	defer p.startMu.Unlock()
	if p.started {
		close(p.stop)
		p.started = false
		p.podsHealth.close()
		if p.nodesHealth != nil {
			p.nodesHealth.close()
		}
	}
}

// ensureStarted starts the pod (and, if allowed, node) informers once and waits for their
// first sync, so List after a controller restart sees every pod Ferry made.
func (p *Provider) ensureStarted(ctx context.Context) error {
	p.startMu.Lock()
	defer p.startMu.Unlock()
	if p.started {
		return p.waitSynced(ctx)
	}
	// Probe permissions first: an informer on a forbidden resource retries forever.
	if _, err := p.client.CoreV1().Pods(p.ns).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return p.classify(err, "list pods")
	}
	nodesAllowed := true
	if _, err := p.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		if !apierrors.IsForbidden(err) {
			return p.classify(err, "list nodes")
		}
		nodesAllowed = false
		p.log.Warn("nodes may not be listed: accelerators are not checked before launch and show-gpus knows nothing", zap.Error(err))
	}
	p.stop = make(chan struct{})
	podsHealth := p.newInformerHealth("pods")
	podInf := cache.NewSharedIndexInformer(observedListWatch(podsHealth, p.opts.RequestTimeout,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = launcher.LabelOwner + "=true"
			return p.client.CoreV1().Pods(p.ns).List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = launcher.LabelOwner + "=true"
			return p.streams.CoreV1().Pods(p.ns).Watch(ctx, o)
		}), &corev1.Pod{}, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if err := podInf.SetWatchErrorHandlerWithContext(watchErrorHandler(podsHealth, p.log)); err != nil {
		return err
	}
	if _, err := podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: p.onPodDeleted}); err != nil {
		return err
	}
	p.pods = listerscorev1.NewPodLister(podInf.GetIndexer())
	p.podsHealth = podsHealth
	syncs := []cache.InformerSynced{podInf.HasSynced}
	go podInf.Run(p.stop)
	p.nodesHealth = nil
	if nodesAllowed {
		nodesHealth := p.newInformerHealth("nodes")
		nodeInf := cache.NewSharedIndexInformer(observedListWatch(nodesHealth, p.opts.RequestTimeout,
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return p.client.CoreV1().Nodes().List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return p.streams.CoreV1().Nodes().Watch(ctx, o)
			}), &corev1.Node{}, 0, cache.Indexers{})
		if err := nodeInf.SetWatchErrorHandlerWithContext(watchErrorHandler(nodesHealth, p.log)); err != nil {
			return err
		}
		p.nodes = listerscorev1.NewNodeLister(nodeInf.GetIndexer())
		p.nodesHealth = nodesHealth
		syncs = append(syncs, nodeInf.HasSynced)
		go nodeInf.Run(p.stop)
	}
	p.podsSync = func() bool {
		for _, s := range syncs {
			if !s() {
				return false
			}
		}
		return true
	}
	p.started = true
	return p.waitSynced(ctx)
}

// newInformerHealth is the health of one of the provider's informers, which logs when its
// watch has failed for WatchFailureThreshold and when it works again — never per retry.
func (p *Provider) newInformerHealth(what string) *watchHealth {
	h := newWatchHealth(what, p.opts.WatchFailureThreshold)
	h.onStale = func(since time.Time, err error) {
		p.log.Warn("the API server has not answered a watch for a while: what it shows is unknown until it does (List reports a gap, Offerings fails)",
			zap.String("watch", what), zap.Time("since", since), zap.Error(err))
	}
	h.onRecover = func(since time.Time) {
		p.log.Info("the API server answers the watch again", zap.String("watch", what), zap.Duration("failed_for", time.Since(since).Round(time.Millisecond)))
	}
	return h
}

// waitSynced waits for the informers' first sync, within informerSyncTimeout; an API server
// that fails the watches for WatchFailureThreshold meanwhile ends the wait at once.
func (p *Provider) waitSynced(ctx context.Context) error {
	if p.podsSync() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, informerSyncTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !p.podsSync() {
		if err := errors.Join(p.podsHealth.staleErr(p.infra), p.nodesHealth.staleErr(p.infra)); err != nil {
			return err
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			err := fmt.Errorf("kubernetes %s: watches did not sync: %w", p.infra, context.Cause(ctx))
			if fault := infraFault(err); fault != nil {
				return fmt.Errorf("%w: %w", fault, err)
			}
			return err
		}
	}
	return nil
}

// Check reports whether the cluster answers and pods may be listed in the namespace.
func (p *Provider) Check(ctx context.Context) error {
	if _, err := p.client.Discovery().ServerVersion(); err != nil {
		return p.classify(err, "reach the API server")
	}
	if _, err := p.client.CoreV1().Pods(p.ns).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return p.classify(err, "list pods in namespace "+p.ns)
	}
	return nil
}

// Launch creates the pod and returns once it is scheduled and has an IP. An unschedulable pod
// is deleted after ProvisionTimeout and the error wraps launcher.ErrNoCapacity. If ctx ends
// first, the pod is left for the next controller to adopt.
//
// A job's node (spec.Job set) is a gang of one: LaunchGang.
func (p *Provider) Launch(ctx context.Context, spec launcher.Spec) (launcher.Instance, error) {
	if spec.Job != nil {
		insts, err := p.LaunchGang(ctx, spec, 1)
		if err != nil {
			return launcher.Instance{}, err
		}
		return insts[0], nil
	}
	if err := p.ensureStarted(ctx); err != nil {
		return launcher.Instance{}, err
	}
	pod, err := p.podFor(spec)
	if err != nil {
		return launcher.Instance{}, err
	}
	created, err := p.create(ctx, pod, spec)
	if err != nil {
		return launcher.Instance{}, err
	}
	ready, err := p.waitStarted(ctx, created)
	if err != nil {
		if ctx.Err() == nil {
			p.deletePod(created.Name)
		}
		return launcher.Instance{}, err
	}
	return p.instance(ready), nil
}

// create creates the pod in its priority class, with its files, Secret and Ferry's security
// defaults.
func (p *Provider) create(ctx context.Context, pod *corev1.Pod, spec launcher.Spec) (*corev1.Pod, error) {
	if err := p.ensurePriorityClass(ctx, pod, spec); err != nil {
		return nil, err
	}
	spec, claims, err := splitClaims(spec) // mounted, not copied (claims.go)
	if err != nil {
		return nil, err
	}
	files, err := p.attachFiles(ctx, pod, spec)
	if err != nil {
		return nil, err
	}
	attachClaims(pod, claims)
	restrict(pod) // after pod_config and the files: what they set wins (securitycontext.go)
	if files != nil {
		if err := p.createFiles(ctx, files); err != nil {
			return nil, err
		}
	}
	created, secret, err := p.createPod(ctx, pod, spec)
	if err != nil {
		if files != nil {
			_ = p.deleteFiles(context.WithoutCancel(ctx), pod.Name)
		}
		return nil, err
	}
	if files != nil {
		p.ownFiles(ctx, created)
	}
	if secret != nil {
		// Owned by the pod, the cluster's garbage collector removes it with the pod even if
		// Ferry never gets to; Terminate deletes it too.
		patch := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":%q,"uid":%q}]}}`, created.Name, created.UID)
		if _, err := p.client.CoreV1().Secrets(p.ns).Patch(ctx, secret.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			p.log.Warn("set the pod as the secret's owner", zap.String("secret", secret.Name), zap.Error(err))
		}
	}
	p.log.Info("created pod", zap.String("pod", created.Name), zap.String("node_selector", describeAffinity(created)), zap.String("priority_class", created.Spec.PriorityClassName))
	return created, nil
}

// createPod creates the pod, after its Secret (if it has secrets) and its service's
// NetworkPolicy, so that it never runs unselected by one.
func (p *Provider) createPod(ctx context.Context, pod *corev1.Pod, spec launcher.Spec) (*corev1.Pod, *corev1.Secret, error) {
	service := pod.Labels[launcher.LabelService]
	if err := p.holdPolicy(ctx, service, pod.Spec.Containers[0].Ports[0].ContainerPort); err != nil {
		return nil, nil, err
	}
	defer p.unholdPolicy(service)
	secret := secretFor(pod, spec)
	if secret != nil {
		if _, err := p.client.CoreV1().Secrets(p.ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
			return nil, nil, p.classify(err, "create secret "+secret.Name)
		}
	}
	created, err := p.client.CoreV1().Pods(p.ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		if secret != nil {
			p.deleteSecret(pod.Name)
		}
		return nil, nil, podSecurityHint(p.classify(err, "create pod "+pod.Name))
	}
	return created, secret, nil
}

// preemptionWait bounds the wait for a pod the scheduler nominated to a node after preempting
// lower-priority pods there: their longest grace (a job's, at most configs.MaxGracePeriodSeconds)
// and then some.
const preemptionWait = 150 * time.Second

// waitStarted watches the pod until it is scheduled and has an IP.
//
// The wait has a watch of its own. Once that has failed for WatchFailureThreshold, the API
// server is down: the wait ends with launcher.ErrUnavailable, rather than, after
// ProvisionTimeout, with a lack of capacity nobody saw.
func (p *Provider) waitStarted(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	caller := ctx
	ctx, down := context.WithCancelCause(ctx)
	defer down(nil)
	health := newWatchHealth("pod "+pod.Name, p.opts.WatchFailureThreshold)
	defer health.close()
	health.onStale = func(since time.Time, err error) {
		down(fmt.Errorf("%w: %s: the API server has not answered the watch of pod %s since %s: %v",
			launcher.ErrUnavailable, p.infra, pod.Name, since.Format(time.RFC3339), err))
	}
	byName := fields.OneTermEqualSelector("metadata.name", pod.Name).String()
	lw := observedListWatch(health, p.opts.RequestTimeout,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = byName
			return p.client.CoreV1().Pods(p.ns).List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = byName
			return p.streams.CoreV1().Pods(p.ns).Watch(ctx, o)
		})
	until := func(ctx context.Context, timeout time.Duration, cond func(*corev1.Pod) (bool, error)) (*corev1.Pod, error) {
		return untilPod(ctx, lw, pod.Name, timeout, cond)
	}
	var unschedulable string
	nominated := ""
	waitScheduled := func(cur *corev1.Pod) (bool, error) {
		if err := startEnded(cur); err != nil {
			return false, err
		}
		if cur.Spec.NodeName != "" {
			return true, nil
		}
		nominated = cur.Status.NominatedNodeName
		if c := podCondition(cur, corev1.PodScheduled); c != nil && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			unschedulable = c.Message
		}
		return false, nil
	}
	scheduled, err := until(ctx, p.provisionTimeout(pod), waitScheduled)
	if errors.Is(err, errTimeout) && nominated != "" {
		// The scheduler preempted lower-priority pods (a preemptible job's) for this one and
		// waits for them to end: they have their grace period to checkpoint, longer than a
		// launch waits for an unschedulable pod. Capacity is coming; wait for it.
		scheduled, err = until(ctx, preemptionWait, waitScheduled)
	}
	if err != nil {
		if errors.Is(err, errTimeout) {
			why := unschedulable
			if why == "" {
				why = "not scheduled"
			}
			return nil, fmt.Errorf("%w: %s: pod unschedulable for %v: %s", launcher.ErrNoCapacity, p.infra, p.provisionTimeout(pod), why)
		}
		return nil, p.waitError(caller, ctx, err)
	}
	started, err := until(ctx, p.opts.StartTimeout, func(cur *corev1.Pod) (bool, error) {
		if err := startEnded(cur); err != nil {
			return false, err
		}
		return cur.Status.PodIP != "", nil
	})
	if err != nil {
		if errors.Is(err, errTimeout) {
			return nil, fmt.Errorf("%s: pod %s on node %s got no IP within %v", p.infra, scheduled.Name, scheduled.Spec.NodeName, p.opts.StartTimeout)
		}
		return nil, p.waitError(caller, ctx, err)
	}
	return started, nil
}

// errTimeout is what untilPod returns when its timeout passed first (UntilWithSync reports
// that as its own "timed out waiting for the condition").
var errTimeout = errors.New("timed out")

// untilPod follows the pod name through lw until cond holds for it (the pod as it then is),
// cond fails, the pod is deleted, timeout passes (errTimeout) or ctx ends.
func untilPod(ctx context.Context, lw *cache.ListWatch, name string, timeout time.Duration, cond func(*corev1.Pod) (bool, error)) (*corev1.Pod, error) {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ev, err := watchtools.UntilWithSync(wctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		if ev.Type == watch.Deleted {
			return false, fmt.Errorf("pod %s was deleted while starting", name)
		}
		cur, ok := ev.Object.(*corev1.Pod)
		if !ok {
			return false, nil
		}
		return cond(cur)
	})
	if err != nil {
		if wctx.Err() != nil && ctx.Err() == nil {
			return nil, errTimeout
		}
		return nil, err
	}
	return ev.Object.(*corev1.Pod), nil
}

// startEnded says why a starting pod cur will not start: it ended already.
func startEnded(cur *corev1.Pod) error {
	if cur.Status.Phase == corev1.PodFailed || cur.Status.Phase == corev1.PodSucceeded {
		return fmt.Errorf("pod %s ended while starting: %s", cur.Name, podEndReason(cur))
	}
	return nil
}

// waitError is the error of a wait for a pod that ended by err: the caller's context's, the
// API server's failure that ended it, or err.
func (p *Provider) waitError(caller, wait context.Context, err error) error {
	if caller.Err() != nil {
		return caller.Err()
	}
	if cause := context.Cause(wait); cause != nil {
		return cause
	}
	return fmt.Errorf("%s: %w", p.infra, err)
}

// LogHint is the kubectl command that prints the pod's output.
func (p *Provider) LogHint(id string) string {
	name, err := p.podName(id)
	if err != nil {
		return "kubectl logs (unknown pod " + id + ")"
	}
	return fmt.Sprintf("kubectl --context %s -n %s logs %s", strings.TrimPrefix(p.infra, InfraName+"/"), p.ns, name)
}

// Terminate deletes the pod. A pod already gone is not an error.
func (p *Provider) Terminate(ctx context.Context, id string) error {
	name, err := p.podName(id)
	if err != nil {
		return err
	}
	service, known := p.podService(ctx, name)
	p.markOurs(name)
	err = p.client.CoreV1().Pods(p.ns).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return p.classify(err, "delete pod "+name)
	}
	err = p.client.CoreV1().Secrets(p.ns).Delete(ctx, secretName(name), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return p.classify(err, "delete secret "+secretName(name))
	}
	if err := p.deleteFiles(ctx, name); err != nil {
		return err
	}
	p.log.Info("deleted pod", zap.String("pod", name))
	if known {
		p.policyMu.Lock()
		defer p.policyMu.Unlock()
		if err := p.releasePolicy(ctx, service, name); err != nil {
			// The pod is gone; List deletes the policy later.
			p.log.Warn("delete the service's network policy", zap.String("pod", name), zap.Error(err))
		}
	}
	return nil
}

// podService is the service label of a pod, from the watch cache or else the API server;
// known is false when the pod is not found.
func (p *Provider) podService(ctx context.Context, name string) (service string, known bool) {
	if p.pods != nil {
		if pod, err := p.pods.Pods(p.ns).Get(name); err == nil {
			return pod.Labels[launcher.LabelService], true
		}
	}
	pod, err := p.client.CoreV1().Pods(p.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", false
	}
	return pod.Labels[launcher.LabelService], true
}

func (p *Provider) deletePod(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
	defer cancel()
	p.markOurs(name)
	if err := p.client.CoreV1().Pods(p.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		p.log.Warn("delete pod of a failed launch", zap.String("pod", name), zap.Error(err))
	}
	p.deleteSecret(name)
	if err := p.deleteFiles(ctx, name); err != nil {
		p.log.Warn("delete the files of a failed launch", zap.String("pod", name), zap.Error(err))
	}
}

// deleteSecret removes the pod's Secret, if it has one.
func (p *Provider) deleteSecret(pod string) {
	ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
	defer cancel()
	if err := p.client.CoreV1().Secrets(p.ns).Delete(ctx, secretName(pod), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		p.log.Warn("delete secret", zap.String("secret", secretName(pod)), zap.Error(err))
	}
}

// secretName is the Secret holding a pod's secret environment.
func secretName(pod string) string { return pod + "-env" }

// secretFor is the Secret with spec's secret environment values, labelled like the pod; nil
// when the task has no secrets.
func secretFor(pod *corev1.Pod, spec launcher.Spec) *corev1.Secret {
	data := map[string]string{}
	for _, k := range spec.SecretEnvs {
		if v, ok := spec.Envs[k]; ok {
			data[k] = v
		}
	}
	if len(data) == 0 {
		return nil
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secretName(pod.Name), Labels: maps.Clone(pod.Labels)},
		Type:       corev1.SecretTypeOpaque,
		StringData: data,
	}
}

// List returns Ferry's pods whose labels match selector, from the watch cache. Once the watch
// has failed for WatchFailureThreshold, the cached pods come with a whole-cluster
// launcher.Gap (launcher.PartialList): they are what was last seen, not what is (faults.go).
func (p *Provider) List(ctx context.Context, selector map[string]string) ([]launcher.Instance, error) {
	if err := p.ensureStarted(ctx); err != nil {
		return nil, err
	}
	sel := labels.SelectorFromSet(labels.Set{launcher.LabelOwner: "true"})
	for k, v := range selector {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return nil, fmt.Errorf("%w: label key %q: %s", launcher.ErrInvalid, k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return nil, fmt.Errorf("%w: label %s=%q: %s", launcher.ErrInvalid, k, v, strings.Join(errs, "; "))
		}
	}
	pods, err := p.pods.Pods(p.ns).List(sel)
	if err != nil {
		return nil, err
	}
	// While the watch fails, so would the requests below, each after its own timeout: they
	// only complete what the cache shows, and wait for the API server to answer again.
	since, _, _ := p.podsHealth.failing()
	answering := since.IsZero()
	out := make([]launcher.Instance, 0, len(pods))
	listed := map[string]bool{}
	var revoked map[string]string
	if answering {
		revoked = p.revokedRequests(ctx, pods, selector) // provreq.go
	}
	for _, pod := range pods {
		if launcher.Matches(pod.Labels, selector) {
			inst := p.jobInstance(pod)
			if why, ok := revoked[pod.Annotations[AnnotationConsumeProvReq]]; ok && inst.ExitCode == nil {
				inst.State, inst.Reason = launcher.StatePreempted, why
			}
			out = append(out, inst)
			listed[inst.ID] = true
		}
	}
	for _, inst := range p.tombstoned(selector, time.Now()) {
		if !listed[inst.ID] {
			out = append(out, inst)
		}
	}
	slices.SortFunc(out, func(a, b launcher.Instance) int { return strings.Compare(a.ID, b.ID) })
	if err := p.podsHealth.staleErr(p.infra); err != nil {
		return out, launcher.PartialList([]launcher.Gap{{Infra: p.infra, Err: err}})
	}
	if answering {
		p.syncPolicies(ctx)
		p.completeGangs(ctx, pods)
	}
	return out, nil
}

// Offerings describes the cluster's GPUs by type: the most one pod can request (the largest
// node's allocatable), and the total and free across nodes; plus one CPU-only entry.
func (p *Provider) Offerings(ctx context.Context) ([]launcher.Offering, error) {
	if err := p.ensureStarted(ctx); err != nil {
		return nil, err
	}
	if p.nodes == nil {
		return nil, fmt.Errorf("%w: %s: nodes may not be listed", launcher.ErrUnauthorized, p.infra)
	}
	if err := p.nodesHealth.staleErr(p.infra); err != nil {
		return nil, err // the nodes, and what is free on them, are unknown
	}
	nodes, err := p.nodes.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	used := p.gpusInUse(ctx)
	byGPU := map[string]*launcher.Offering{}
	cpu := launcher.Offering{PricePerHour: p.opts.CostPerHour, Total: -1, Free: -1}
	for _, n := range nodes {
		if !nodeReady(n) || n.Spec.Unschedulable {
			continue
		}
		vcpus := float64(n.Status.Allocatable.Cpu().MilliValue()) / 1000
		mem := float64(n.Status.Allocatable.Memory().Value()) / (1 << 30)
		cpu.VCPUs = math.Max(cpu.VCPUs, vcpus)
		cpu.MemoryGiB = math.Max(cpu.MemoryGiB, mem)
		name, _, _, count := nodeGPU(n)
		if name == "" {
			continue
		}
		o := byGPU[name]
		if o == nil {
			o = &launcher.Offering{Accelerator: name, PricePerHour: p.opts.CostPerHour}
			byGPU[name] = o
		}
		if _, shares := nodeShare(n); shares {
			o.SharesGPU = true
		}
		o.AcceleratorCount = math.Max(o.AcceleratorCount, float64(count))
		o.VCPUs = math.Max(o.VCPUs, vcpus)
		o.MemoryGiB = math.Max(o.MemoryGiB, mem)
		o.Total += int(count)
		if used != nil {
			o.Free += int(max(count-used[n.Name], 0))
		}
	}
	out := []launcher.Offering{cpu}
	for _, name := range slices.Sorted(maps.Keys(byGPU)) {
		o := byGPU[name]
		if used == nil {
			o.Free = -1
		}
		out = append(out, *o)
	}
	return append(out, p.queuedOfferings()...), nil // provreq.go
}

// gpusInUse sums GPU requests of unfinished pods per node, across namespaces, at most usedTTL
// old; nil when pods may not be listed cluster-wide.
func (p *Provider) gpusInUse(ctx context.Context) map[string]int64 {
	p.usedMu.Lock()
	defer p.usedMu.Unlock()
	if p.used != nil && time.Since(p.usedAt) < usedTTL {
		return p.used
	}
	used := p.listGPUsInUse(ctx)
	if used != nil {
		p.used, p.usedAt = used, time.Now()
	}
	return used
}

func (p *Provider) listGPUsInUse(ctx context.Context) map[string]int64 {
	pods, err := p.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: "status.phase!=Succeeded,status.phase!=Failed",
	})
	if err != nil {
		return nil
	}
	used := map[string]int64{}
	for _, pod := range pods.Items {
		if pod.Spec.NodeName == "" {
			continue
		}
		for _, c := range pod.Spec.Containers {
			if q, ok := c.Resources.Requests[ResourceGPU]; ok {
				used[pod.Spec.NodeName] += q.Value()
			}
		}
	}
	return used
}

// podFor builds the pod for spec.
func (p *Provider) podFor(spec launcher.Spec) (*corev1.Pod, error) {
	name, err := podName(spec.Name)
	if err != nil {
		return nil, err
	}
	podLabels := map[string]string{labelManagedBy: "ferry", launcher.LabelOwner: "true"}
	for k, v := range spec.Labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return nil, fmt.Errorf("%w: label key %q: %s", launcher.ErrInvalid, k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return nil, fmt.Errorf("%w: label %s=%q is not a valid Kubernetes label value: %s", launcher.ErrInvalid, k, v, strings.Join(errs, "; "))
		}
		podLabels[k] = v
	}
	port := spec.Port
	if port <= 0 {
		port = DefaultPort
	}
	image := p.opts.Image
	if id := spec.Resources.ImageID; id != "" {
		img, ok := strings.CutPrefix(id, "docker:")
		if !ok || img == "" {
			return nil, fmt.Errorf("%w: image_id %q: Kubernetes runs container images, written docker:IMAGE", launcher.ErrInvalid, id)
		}
		image = img
	}
	res, affinity, err := p.resourcesFor(spec)
	if err != nil {
		return nil, err
	}
	env := make([]corev1.EnvVar, 0, len(spec.Envs)+2)
	for _, k := range slices.Sorted(maps.Keys(spec.Envs)) {
		if slices.Contains(spec.SecretEnvs, k) {
			// From the pod's Secret: `kubectl describe pod` shows the reference, not the value.
			env = append(env, corev1.EnvVar{Name: k, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: secretName(name)}, Key: k,
			}}})
			continue
		}
		env = append(env, corev1.EnvVar{Name: k, Value: spec.Envs[k]})
	}
	env = append(env,
		corev1.EnvVar{Name: "FERRY_PORT", Value: strconv.Itoa(port)},
		corev1.EnvVar{Name: "FERRY_HOST", Value: "0.0.0.0"})
	infra := p.infra
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: podLabels,
			Annotations: map[string]string{
				annotationPrice: strconv.FormatFloat(p.opts.CostPerHour, 'f', -1, 64),
				annotationInfra: infra,
			},
		},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Affinity:      affinity,
			// GPU nodes are commonly tainted so that only GPU pods land there.
			Tolerations: []corev1.Toleration{{Key: string(ResourceGPU), Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{{
				Name:      containerName,
				Image:     image,
				Command:   []string{"/bin/bash", "-c", nodefiles.RenderScript(spec)},
				Env:       env,
				Ports:     []corev1.ContainerPort{{Name: "serve", ContainerPort: int32(port), Protocol: corev1.ProtocolTCP}},
				Resources: res,
			}},
		},
	}
	p.applyGPUShare(pod, spec.Resources, sharesGPU(res))
	if spec.Job != nil {
		addJob(pod, spec.Job)
	}
	return withPodConfig(pod, spec.Kubernetes) // podconfig.go
}

// resourcesFor turns the chosen accelerator, cpus and memory into requests, and the GPU type
// into a node affinity on whichever label the cluster's nodes use for it.
func (p *Provider) resourcesFor(spec launcher.Spec) (corev1.ResourceRequirements, *corev1.Affinity, error) {
	req := corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	r := spec.Resources
	if v, ok := atLeast(r.CPUs); ok {
		req.Requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(int64(v*1000), resource.DecimalSI)
	}
	if v, ok := atLeast(r.Memory); ok {
		req.Requests[corev1.ResourceMemory] = *resource.NewQuantity(int64(v*(1<<30)), resource.BinarySI)
	}
	acc, count := spec.Placement.Accelerator, spec.Placement.AcceleratorCount
	if acc == "" && len(r.Accelerators) > 0 {
		acc, count = p.pickAccelerator(r)
	}
	if acc == "" {
		return req, nil, nil
	}
	if share, ok := r.SharedGPU(configs.Accelerator{Name: acc, Count: count}); ok {
		return p.sharedResources(req, acc, share, r.GPUShare) // gpushare.go
	}
	gpus := *resource.NewQuantity(int64(count), resource.DecimalSI)
	req.Requests[ResourceGPU], req.Limits[ResourceGPU] = gpus, gpus
	if p.nodes == nil {
		// Without node access, trust the product label to carry the canonical name somewhere.
		return req, gpuAffinity(map[string][]string{LabelGPUProduct: {acc}}), nil
	}
	values := map[string][]string{}
	var most int64
	nodes, err := p.nodes.List(labels.Everything())
	if err != nil {
		return req, nil, err
	}
	pinnedOut := false
	for _, n := range nodes {
		name, label, value, c := nodeGPU(n)
		if !strings.EqualFold(name, acc) {
			continue
		}
		if !admitsNode(n, r.GPUShare) {
			pinnedOut = true
			continue
		}
		most = max(most, c)
		if !slices.Contains(values[label], value) {
			values[label] = append(values[label], value)
		}
	}
	if aff, ok := p.queuedAffinity(spec, acc, count, values); ok {
		return req, aff, nil // the nodes its queue makes (provreq.go)
	}
	switch {
	case len(values) == 0 && pinnedOut:
		return req, nil, fmt.Errorf("%w: %s: no %s node passes gpu_share's type and UUID pins", launcher.ErrNoCapacity, p.infra, acc)
	case len(values) == 0:
		return req, nil, fmt.Errorf("%w: %s: no node has %s", launcher.ErrNoCapacity, p.infra, acc)
	case most < int64(count):
		return req, nil, fmt.Errorf("%w: %s: no node has %v x %s (largest: %d)", launcher.ErrNoCapacity, p.infra, count, acc, most)
	}
	for _, v := range values {
		slices.Sort(v)
	}
	return req, gpuAffinity(values), nil
}

// pickAccelerator chooses, among the task's accelerator alternatives, the first the cluster's
// nodes carry (the optimizer normally chose already and set Placement).
func (p *Provider) pickAccelerator(r configs.Resources) (string, float64) {
	first := r.Accelerators[0]
	if p.nodes == nil {
		return first.Name, first.Count
	}
	nodes, err := p.nodes.List(labels.Everything())
	if err != nil {
		return first.Name, first.Count
	}
	for _, a := range r.Accelerators {
		for _, n := range nodes {
			if name, _, _, c := nodeGPU(n); strings.EqualFold(name, a.Name) && float64(c) >= a.Count {
				return a.Name, a.Count
			}
		}
	}
	return first.Name, first.Count
}

// gpuAffinity requires a node whose GPU label has one of the values: one selector term per
// label, any of which may match.
func gpuAffinity(values map[string][]string) *corev1.Affinity {
	var terms []corev1.NodeSelectorTerm
	for _, label := range gpuLabels {
		if v := values[label]; len(v) > 0 {
			terms = append(terms, corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: label, Operator: corev1.NodeSelectorOpIn, Values: v,
			}}})
		}
	}
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms},
	}}
}

func describeAffinity(pod *corev1.Pod) string {
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	var parts []string
	for _, t := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, e := range t.MatchExpressions {
			parts = append(parts, e.Key+" in ("+strings.Join(e.Values, ",")+")")
		}
	}
	return strings.Join(parts, " or ")
}

// instance describes a pod.
func (p *Provider) instance(pod *corev1.Pod) launcher.Instance {
	inst := launcher.Instance{
		ID:         p.infra + "/" + pod.Namespace + "/" + pod.Name,
		Name:       pod.Name,
		Labels:     maps.Clone(pod.Labels),
		Infra:      p.infra,
		LaunchedAt: pod.CreationTimestamp.Time,
	}
	inst.PricePerHour, _ = strconv.ParseFloat(pod.Annotations[annotationPrice], 64)
	inst.IP = pod.Status.PodIP
	if pod.Status.PodIP != "" && len(pod.Spec.Containers) > 0 && len(pod.Spec.Containers[0].Ports) > 0 {
		inst.Endpoint = net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(pod.Spec.Containers[0].Ports[0].ContainerPort)))
	}
	switch {
	case podPreempted(pod):
		inst.State, inst.Reason = launcher.StatePreempted, podEndReason(pod)
	case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
		inst.State, inst.Reason = launcher.StateTerminated, podEndReason(pod)
		inst.ExitCode = exitCode(pod)
	case pod.DeletionTimestamp != nil:
		inst.State, inst.Reason = launcher.StateTerminated, "pod is being deleted"
	case pod.Status.Phase == corev1.PodRunning:
		inst.State = launcher.StateRunning
	default:
		inst.State = launcher.StatePending
	}
	return inst
}

// exitCode is the exit status of the pod's program (its first container) once it ended.
func exitCode(pod *corev1.Pod) *int {
	if len(pod.Spec.Containers) == 0 {
		return nil
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == pod.Spec.Containers[0].Name && cs.State.Terminated != nil {
			code := int(cs.State.Terminated.ExitCode)
			return &code
		}
	}
	return nil
}

// podPreempted reports a pod that the cluster took away: evicted, preempted by a higher
// priority pod, or marked as a disruption target (node drain, node loss).
func podPreempted(pod *corev1.Pod) bool {
	switch pod.Status.Reason {
	case "Evicted", "Preempting", "NodeLost", "Terminated":
		return true
	}
	if c := podCondition(pod, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue {
		return true
	}
	return false
}

func podEndReason(pod *corev1.Pod) string {
	if pod.Status.Reason != "" || pod.Status.Message != "" {
		return strings.TrimSpace(pod.Status.Reason + ": " + pod.Status.Message)
	}
	if c := podCondition(pod, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue {
		return strings.TrimSpace(c.Reason + ": " + c.Message)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			return fmt.Sprintf("container exited with code %d (%s)", t.ExitCode, t.Reason)
		}
	}
	return "pod " + strings.ToLower(string(pod.Status.Phase))
}

func podCondition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podName is a DNS-1123 label from the instance name plus a random suffix, so that a name
// reused after `serve down --purge` never meets a pod still terminating.
func podName(name string) (string, error) {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case r == '-' || r == '_' || r == '.':
			b.WriteByte('-')
		}
	}
	base := strings.Trim(b.String(), "-")
	if base == "" {
		return "", fmt.Errorf("%w: instance name %q has no letters or digits", launcher.ErrInvalid, name)
	}
	if len(base) > 56 {
		base = strings.TrimRight(base[:56], "-")
	}
	return base + "-" + randomSuffix(), nil
}

const suffixAlphabet = "bcdfghjklmnpqrstvwxz2456789"

func randomSuffix() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = suffixAlphabet[int(b[i])%len(suffixAlphabet)]
	}
	return string(b[:])
}

// podName extracts the pod name from an instance id "kubernetes/CONTEXT/NAMESPACE/POD".
func (p *Provider) podName(id string) (string, error) {
	rest, ok := strings.CutPrefix(id, p.infra+"/")
	ns, name, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || ns != p.ns || name == "" || strings.Contains(name, "/") {
		return "", fmt.Errorf("%w: %q is not a pod of %s in namespace %s", launcher.ErrInvalid, id, p.infra, p.ns)
	}
	return name, nil
}

// atLeast reads SkyPilot's "4" or "4+" as the amount to request.
func atLeast(s string) (float64, bool) {
	v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), "+"), 64)
	if err != nil || v <= 0 {
		return 0, false
	}
	return v, true
}
