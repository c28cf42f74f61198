package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/yaml"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	kubelauncher "github.com/ferryserve/ferry/launcher/kubernetes"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// FerryService objects (charts/ferry/crds) declare services with kubectl: the leader, on the
// Kubernetes store, brings each up (serve up), applies a changed spec (serve update, once per
// generation: status.observedGeneration), takes it down when the object goes (serve down), and
// keeps its status current for `kubectl get fsvc`. The spec is run through configs.Parse, the
// same validation as a task file; what it rejects is reported in status (INVALID) and never
// launched. Status writes carry the leader's term in status.fence, which the fencing policy
// checks (charts/ferry/templates/fencing-policy-status.yaml). Whoever may create FerryServices
// is a tenant, not the operator: the spec is also held to tenancy.go's rules (nothing of the
// controller's host, files or credentials; workdir and file_mounts from the namespace's
// labelled ConfigMaps, Secrets and claims, and S3 buckets read with the credentials of the
// labelled Secret spec.bucketCredentials names), shown in a Tenancy condition, and an object updates or deletes only a service
// that a FerryService brought up, never one started with the CLI.

// FerryServiceGVR is the FerryService resource.
var FerryServiceGVR = schema.GroupVersionResource{Group: "ferry.dev", Version: "v1alpha1", Resource: "ferryservices"}

// statusInvalid is a FerryService's status when its spec is rejected.
const statusInvalid = "INVALID"

// ferryServices follows the namespace's FerryService objects.
type ferryServices struct {
	c      *Controller
	client dynamic.ResourceInterface
	lister cache.GenericNamespaceLister
	// sources reads the namespace's ConfigMaps, Secrets and claims named as sources
	// (tenancysources.go); files is where its snapshots are written.
	sources *namespaceSources
	files   string
	// filesMu is held by a reconcile (which writes snapshots) and by prune.
	filesMu sync.Mutex
	queue   workqueue.TypedRateLimitingInterface[string]
	// observe records each reconcile's duration; nil without metrics.
	observe func(time.Duration)
	log     *zap.Logger
	// applied is the generation last brought up or updated per name, so that a status write
	// that failed does not apply the same generation twice; its keys are the names whose
	// services FerryServices own (a restarted controller learns them from observedGeneration
	// in their status). Only the worker touches it.
	applied map[string]int64
	// endpoints keeps each FerryService's Service and HTTPRoute (endpointsync.go); nil when
	// Options.Endpoints asks for none.
	endpoints *endpointSync
}

// watchFerryServices starts following FerryServices when the store is Kubernetes and the CRD is
// installed, until ctx ends.
func (c *Controller) watchFerryServices(ctx context.Context) error {
	if c.opts.Store.Kind != StoreKubernetes {
		return nil
	}
	cfg, err := c.opts.Store.restConfig()
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ns := c.opts.Store.namespace()
	client := dyn.Resource(FerryServiceGVR).Namespace(ns)
	if _, err := client.List(ctx, metav1.ListOptions{Limit: 1}); apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		c.log.Warn("FerryServices cannot be listed (CRD not installed, or no RBAC): services declared with kubectl are not followed", zap.Error(err))
		return nil
	} else if err != nil {
		return fmt.Errorf("list FerryServices: %w", err)
	}
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, ns, nil)
	inf := factory.ForResource(FerryServiceGVR)
	files := filepath.Join(c.opts.Home.Dir, "ferryservice-files", ns)
	fs := &ferryServices{c: c, client: client, lister: inf.Lister().ByNamespace(ns), log: c.log.Named("ferryservices"), applied: map[string]int64{},
		sources: &namespaceSources{namespace: ns, configMaps: kube.CoreV1().ConfigMaps(ns), secrets: kube.CoreV1().Secrets(ns),
			claims: kube.CoreV1().PersistentVolumeClaims(ns), root: files, podNamespaces: c.podNamespaces, registerBuckets: c.registerTenantBuckets},
		files: files, queue: newFerryServiceQueue(c.control), observe: c.control.observeReconcile(loopFerryServices)}
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			fs.queue.Add(key)
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) }, DeleteFunc: enqueue}); err != nil {
		return err
	}
	if fs.endpoints, err = newEndpointSync(ctx, c, kube, dyn, ns, func(name string) { fs.queue.Add(ns + "/" + name) }); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return fmt.Errorf("FerryService informer did not sync: %w", context.Cause(ctx))
	}
	c.spawn(&c.wg, "ferryservice worker", func() { fs.work(ctx) })
	c.spawn(&c.wg, "ferryservice status", func() { fs.statusLoop(ctx) })
	go func() { <-ctx.Done(); fs.queue.ShutDown(); factory.Shutdown() }()
	return nil
}

// newFerryServiceQueue is the FerryService work queue, its depth exported as
// ferry_workqueue_depth{queue="ferryservices"} when m is not nil.
func newFerryServiceQueue(m *controlPlaneMetrics) workqueue.TypedRateLimitingInterface[string] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: queueFerryServices, MetricsProvider: m.queueMetricsProvider()})
}

// work reconciles queued FerryServices one at a time; an error retries with backoff.
func (fs *ferryServices) work(ctx context.Context) {
	for {
		key, quit := fs.queue.Get()
		if quit {
			return
		}
		_, name, _ := cache.SplitMetaNamespaceKey(key)
		fs.filesMu.Lock() // prune must not take the snapshot it resolves before the service names it
		start := time.Now()
		err := fs.reconcile(ctx, name)
		if fs.observe != nil {
			fs.observe(time.Since(start))
		}
		fs.filesMu.Unlock()
		if err != nil && ctx.Err() == nil {
			fs.log.Warn("reconcile FerryService", zap.String("service", name), zap.Error(err))
			fs.queue.AddRateLimited(key)
		} else {
			fs.queue.Forget(key)
		}
		fs.queue.Done(key)
	}
}

// prune removes the snapshots that no service's current task names: a FerryService's service
// runs the task its sources resolved to, so these are the snapshots no current FerryService
// names (one deleted, or one whose ConfigMap or Secret changed). It runs every status tick,
// between reconciles (filesMu), and not while any service's rollout is under way (its old
// version may relaunch from its own snapshot). A snapshot removed too early is not lost: the
// next reconcile of its FerryService writes it again, as after a restart on an empty disk.
func (fs *ferryServices) prune() {
	fs.filesMu.Lock()
	defer fs.filesMu.Unlock()
	inUse := map[string]bool{}
	fs.c.mu.Lock()
	services := slices.Collect(maps.Values(fs.c.services))
	fs.c.mu.Unlock()
	for _, s := range services {
		if s.mgr != nil && s.mgr.Rollout().Active() {
			return
		}
		s.mu.Lock()
		t := s.task
		s.mu.Unlock()
		if t != nil {
			snapshotsNamed(fs.files, t, inUse)
		}
	}
	if n, err := pruneSnapshots(fs.files, inUse); err != nil {
		fs.log.Warn("prune FerryService file snapshots", zap.Error(err))
	} else if n > 0 {
		fs.log.Info("pruned FerryService file snapshots no FerryService names", zap.Int("removed", n))
	}
}

// reconcile brings the service to what the named FerryService declares.
func (fs *ferryServices) reconcile(ctx context.Context, name string) error {
	obj, err := fs.lister.Get(name)
	if apierrors.IsNotFound(err) {
		return fs.gone(ctx, name)
	}
	if err != nil {
		return err
	}
	u := obj.(*unstructured.Unstructured)
	if observed, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration"); observed > 0 {
		// Only the leader writes a generation it brought up (a restarted one learns it here).
		if _, known := fs.applied[name]; !known {
			fs.applied[name] = observed
		}
	}
	task, creds, err := parseFerryService(u)
	if err != nil {
		return fs.refuse(ctx, u, err)
	}
	fromSnapshots, err := resolveSources(ctx, fs.sources, task, creds)
	if err != nil {
		// A ConfigMap, Secret or claim made or labelled later is found by a retry.
		if st := fs.setStatus(ctx, u, invalidStatus(err, "SourceUnavailable")); st != nil {
			return st
		}
		return err
	}
	gen := u.GetGeneration()
	observed, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
	svc, missing := fs.c.serviceNamed(name)
	switch {
	case missing != nil:
		_, err = fs.c.CreateService(ctx, api.CreateServiceRequest{Name: name, Task: task})
	case !fs.owns(name):
		// A service of this name that no FerryService brought up is the operator's (serve up):
		// a tenant's object must not update it, nor take it down when deleted. Retried: it may
		// be one going down, or the operator's, taken down later.
		taken := &TenancyError{Problems: []string{fmt.Sprintf("a service named %s runs that no FerryService brought up (started with the CLI): name this FerryService otherwise", name)}}
		if err := fs.setStatus(ctx, u, invalidStatus(taken, "NameTaken")); err != nil {
			return err
		}
		return taken
	case observed != gen && fs.applied[name] != gen:
		_, err = fs.c.UpdateService(ctx, name, api.UpdateServiceRequest{Task: task})
	case fromSnapshots && filesMoved(svc, task):
		// A controller restarted after a source ConfigMap or Secret changed: its snapshot is no
		// more, so the service rolls to the object's content now.
		_, err = fs.c.UpdateService(ctx, name, api.UpdateServiceRequest{Task: task})
	default:
		return fs.keepEndpoint(ctx, u)
	}
	if err != nil {
		return fs.setStatus(ctx, u, invalidStatus(err, "Rejected"))
	}
	fs.applied[name] = gen
	epErr := fs.keepEndpoint(ctx, u)
	return errors.Join(fs.refresh(ctx, u, gen), epErr)
}

// gone takes down what the deleted FerryService name brought up: the service it owned (a
// service it never owned, one started with the CLI, stays) and its Service and HTTPRoute.
func (fs *ferryServices) gone(ctx context.Context, name string) error {
	if fs.endpoints != nil {
		if err := fs.endpoints.remove(ctx, fs.sources.namespace, name); err != nil {
			return err
		}
	}
	if _, owned := fs.applied[name]; !owned {
		return nil
	}
	delete(fs.applied, name)
	if _, err := fs.c.DeleteService(ctx, name); err != nil && !errors.Is(err, api.ErrNotFound) {
		return err
	}
	return nil
}

// keepEndpoint keeps u's Service and HTTPRoute, where they are asked for.
func (fs *ferryServices) keepEndpoint(ctx context.Context, u *unstructured.Unstructured) error {
	if fs.endpoints == nil {
		return nil
	}
	return fs.endpoints.ensure(ctx, u)
}

// podNamespaces maps each Kubernetes infra t may launch on (kubernetes/CONTEXT) to the
// namespace its pods run in: a claim source must be in it.
func (c *Controller) podNamespaces(t *configs.Task) map[string]string {
	if c.infras == nil {
		return nil
	}
	out := map[string]string{}
	for _, cand := range t.Resources.Candidates() {
		cloud, _, _ := strings.Cut(cand.Infra, "/")
		if cloud != kubernetesInfra {
			continue
		}
		for _, p := range c.infras.Kube {
			if cand.Infra == kubernetesInfra || cand.Infra == p.Infra() {
				out[p.Infra()] = p.Namespace()
			}
		}
	}
	return out
}

// registerTenantBuckets registers a tenant's bucket client (ref NAMESPACE/SECRET, version a
// digest of the Secret's values) with every Kubernetes infra, which presign the tenant's s3
// sources with it, in memory only; a nil newClient forgets it.
func (c *Controller) registerTenantBuckets(ref, version string, newClient func() nodefiles.Buckets) {
	if c.infras == nil {
		return
	}
	for _, p := range c.infras.Kube {
		p.TenantBuckets().Set(ref, version, newClient)
	}
}

// takenDownNote ends the message of a refusal that took the object's service down.
const takenDownNote = " (its service, brought up before these rules, was taken down)"

// refuse shows why u's spec is refused. A service u brought up before the tenancy rules
// that breaks them (infra local, the controller's files) is taken down: left up, it would go
// on launching replicas as it was declared.
func (fs *ferryServices) refuse(ctx context.Context, u *unstructured.Unstructured, err error) error {
	var te *TenancyError
	if svc, missing := fs.c.serviceNamed(u.GetName()); errors.As(err, &te) && missing == nil && fs.owns(u.GetName()) && fs.breaksTenancy(svc) {
		if fs.endpoints != nil {
			if rmErr := fs.endpoints.remove(ctx, u.GetNamespace(), u.GetName()); rmErr != nil {
				return rmErr
			}
		}
		if _, downErr := fs.c.DeleteService(ctx, u.GetName()); downErr != nil && !errors.Is(downErr, api.ErrNotFound) {
			return downErr
		}
		delete(fs.applied, u.GetName())
		err = fmt.Errorf("%w%s", err, takenDownNote)
	} else if old, _, _ := unstructured.NestedString(u.Object, "status", "message"); old == err.Error()+takenDownNote {
		err = fmt.Errorf("%w%s", err, takenDownNote) // the same refusal: keep saying what it did
	}
	return fs.setStatus(ctx, u, invalidStatus(err, "Invalid"))
}

// breaksTenancy says whether s runs a task a FerryService may not declare now; its snapshots
// of ConfigMaps count as ConfigMaps.
func (fs *ferryServices) breaksTenancy(s *service) bool {
	s.mu.Lock()
	t := *s.task
	s.mu.Unlock()
	creds := ""
	snapshot := func(p string) string {
		if rel, err := filepath.Rel(fs.files, p); err == nil && filepath.IsLocal(rel) {
			return configMapScheme + "snapshot"
		}
		if ref, bucket, ok, err := kubelauncher.ParseTenantS3Source(p); ok && err == nil {
			_, creds, _ = strings.Cut(ref, "/")
			return bucket
		}
		return p
	}
	if t.GitWorkdir == nil && t.Workdir != "" {
		t.Workdir = snapshot(t.Workdir)
	}
	t.FileMounts = maps.Clone(t.FileMounts)
	for dst, src := range t.FileMounts {
		t.FileMounts[dst] = snapshot(src)
	}
	return checkTenancy(&t, creds) != nil
}

// owns says whether name's service was brought up by its FerryService.
func (fs *ferryServices) owns(name string) bool {
	_, ok := fs.applied[name]
	return ok
}

// invalidStatus is the status of a FerryService refused for err; reason says at which step.
// A tenancy refusal says so in the Tenancy condition as well.
func invalidStatus(err error, reason string) statusFields {
	st := statusFields{Status: statusInvalid, Message: err.Error(), Reason: reason, Tenancy: "Unknown", TenancyReason: "NotChecked"}
	var te *TenancyError
	switch {
	case errors.As(err, &te):
		st.Reason, st.Tenancy, st.TenancyReason = "TenancyRefused", "False", "Refused"
	case reason == "SourceUnavailable":
		st.Tenancy, st.TenancyReason = "False", reason
	case reason == "Rejected":
		st.Tenancy, st.TenancyReason = "True", "Accepted"
	}
	return st
}

// filesMoved says whether s runs with other workdir or file_mounts sources than t.
func filesMoved(s *service, t *configs.Task) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.task.Workdir != t.Workdir || !maps.Equal(s.task.FileMounts, t.FileMounts)
}

// parseFerryService runs the spec through Ferry's own task validation, as a task file would
// be, and the checks serve up adds. creds is spec.bucketCredentials, the Secret of the
// tenant's bucket credentials (tenancy.go), which is no field of a task.
func parseFerryService(u *unstructured.Unstructured) (task *configs.Task, creds string, err error) {
	spec, _, _ := unstructured.NestedMap(u.Object, "spec")
	if v, ok := spec[bucketCredentialsField]; ok {
		if creds, ok = v.(string); !ok {
			return nil, "", fmt.Errorf("spec.%s: want the name of a Secret, got %T", bucketCredentialsField, v)
		}
		delete(spec, bucketCredentialsField)
	}
	data, err := yaml.Marshal(spec)
	if err != nil {
		return nil, "", err
	}
	task, err = configs.Parse(fmt.Sprintf("ferryservice/%s/%s spec", u.GetNamespace(), u.GetName()), data, configs.Overrides{Name: u.GetName()})
	if err != nil {
		return nil, "", err
	}
	if task.Service == nil {
		return nil, "", errors.New("spec has no service: section")
	}
	if err := checkAuth(task); err != nil {
		return nil, "", err
	}
	return task, creds, checkTenancy(task, creds)
}

// statusLoop keeps every FerryService's status current.
func (fs *ferryServices) statusLoop(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fs.prune()
		if fs.endpoints != nil {
			for _, name := range fs.endpoints.orphans(fs.exists) {
				fs.queue.Add(fs.sources.namespace + "/" + name)
			}
		}
		objs, err := fs.lister.List(labels.Everything())
		if err != nil {
			continue
		}
		for _, obj := range objs {
			u := obj.(*unstructured.Unstructured)
			if st, _, _ := unstructured.NestedString(u.Object, "status", "status"); st == statusInvalid {
				continue
			}
			observed, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
			if err := fs.refresh(ctx, u, observed); err != nil && !apierrors.IsConflict(err) {
				fs.log.Debug("refresh FerryService status", zap.String("service", u.GetName()), zap.Error(err))
			}
		}
	}
}

// refresh writes the running service's status into the object, observedGeneration as given.
func (fs *ferryServices) refresh(ctx context.Context, u *unstructured.Unstructured, generation int64) error {
	list, err := fs.c.Services([]string{u.GetName()})
	if err != nil || len(list) != 1 {
		return err
	}
	st := list[0]
	fields := statusFields{Status: st.Status, Ready: st.ReadyReplicas, Target: st.TargetReplicas,
		Endpoint: st.Endpoint, Version: st.Version, Generation: generation, Message: st.Message, Reason: "Running",
		Tenancy: "True", TenancyReason: "Accepted"}
	if fs.endpoints != nil {
		var msg string
		fields.Endpoint, msg, fields.Conditions = fs.endpoints.status(u.GetNamespace(), u.GetName())
		fields.Message = strings.Join(slices.DeleteFunc([]string{fields.Message, msg}, func(m string) bool { return m == "" }), "; ")
	}
	return fs.setStatus(ctx, u, fields)
}

// exists says whether the FerryService name is in the informer's cache.
func (fs *ferryServices) exists(name string) bool {
	_, err := fs.lister.Get(name)
	return !apierrors.IsNotFound(err)
}

// statusFields is what a FerryService's status says.
type statusFields struct {
	Status, Endpoint, Message, Reason string
	// Tenancy is the Tenancy condition's status (True, False, Unknown): whether the spec keeps
	// to what a tenant may have Ferry do (tenancy.go), and TenancyReason why.
	Tenancy, TenancyReason string
	Ready, Target, Version int
	Generation             int64
	// Conditions follow Ready and Tenancy: the Endpoint (and Routed) conditions where
	// FerryServices get Services of their own.
	Conditions []map[string]any
}

// setStatus writes st as u's status when it differs from what u shows; only the leader writes.
func (fs *ferryServices) setStatus(ctx context.Context, u *unstructured.Unstructured, st statusFields) error {
	var fence map[string]any
	if f := fs.c.opts.Store.Fence; f != nil {
		term, ok := f()
		if !ok {
			return nil
		}
		// The fencing policy checks these on /status writes, which cannot carry annotations.
		fence = map[string]any{"term": strconv.FormatInt(term, 10), "holder": fs.c.opts.Store.Holder}
	}
	ready := "False"
	if st.Status == "READY" {
		ready = "True"
	}
	status := map[string]any{"status": st.Status, "replicas": fmt.Sprintf("%d/%d", st.Ready, st.Target),
		"readyReplicas": int64(st.Ready), "targetReplicas": int64(st.Target), "endpoint": st.Endpoint,
		"version": int64(st.Version), "observedGeneration": st.Generation, "message": st.Message}
	old, _, _ := unstructured.NestedMap(u.Object, "status")
	tenancyMsg := ""
	if st.Tenancy != "True" {
		tenancyMsg = st.Message
	}
	status["conditions"] = conditions(old, u.GetGeneration(), append([]map[string]any{
		{"type": "Ready", "status": ready, "reason": st.Reason, "message": st.Message},
		{"type": "Tenancy", "status": st.Tenancy, "reason": st.TenancyReason, "message": tenancyMsg}},
		st.Conditions...)...)
	if fence != nil {
		status["fence"] = fence
	}
	if reflect.DeepEqual(old, status) {
		return nil
	}
	out := u.DeepCopy()
	out.Object["status"] = status
	_, err := fs.client.UpdateStatus(ctx, out, metav1.UpdateOptions{})
	return err
}

// conditions completes conds with generation and each one's lastTransitionTime: kept from old's
// condition of the same type while its status holds, now when it changes.
func conditions(old map[string]any, generation int64, conds ...map[string]any) []any {
	prev := map[any]map[string]any{}
	if oldConds, ok := old["conditions"].([]any); ok {
		for _, c := range oldConds {
			if m, ok := c.(map[string]any); ok {
				prev[m["type"]] = m
			}
		}
	}
	out := make([]any, len(conds))
	for i, c := range conds {
		c["observedGeneration"] = generation
		if p, ok := prev[c["type"]]; ok && p["status"] == c["status"] && p["lastTransitionTime"] != nil {
			c["lastTransitionTime"] = p["lastTransitionTime"]
		} else {
			c["lastTransitionTime"] = time.Now().UTC().Format(time.RFC3339)
		}
		out[i] = c
	}
	return out
}
