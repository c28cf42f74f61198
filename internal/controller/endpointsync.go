package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// endpointSync keeps the Service, and where asked for and served the HTTPRoute, of each
// FerryService (endpoints.go says what they are). It follows the objects it made through
// informers filtered by its labels, so a Service or route someone deletes or edits is put
// back by its FerryService's next reconcile, and deletes them itself when their FerryService
// goes: the API server's garbage collector, which the owner reference would call on, need
// not run. Only the FerryService worker calls ensure and remove; the status loop reads status
// and orphans.
type endpointSync struct {
	target *endpointTarget
	kube   kubernetes.Interface
	// services lists the Services Ferry keeps, from the informer; routes and routeLister are
	// nil when no HTTPRoutes are kept (none asked for, or the API not served).
	services    corelisters.ServiceLister
	routes      dynamic.NamespaceableResourceInterface
	routeLister cache.GenericLister
	// writable says whether this controller may write now (it leads).
	writable func() bool
	log      *zap.Logger

	mu    sync.Mutex
	state map[string]endpointState // by the FerryService's namespace/name
}

// endpointState is what a FerryService's status says of its endpoint.
type endpointState struct {
	// service and route are why the FerryService has no Service, or no HTTPRoute, of its
	// own: a same-named object Ferry did not make; empty when it has one.
	service, route string
}

// NameTakenError is a same-named object that Ferry did not make standing where a
// FerryService's Service or HTTPRoute would: Ferry leaves it alone and says so in the
// FerryService's status.
type NameTakenError struct {
	Kind, Namespace, Name string
}

func (e *NameTakenError) Error() string {
	return fmt.Sprintf("a %s named %s exists in namespace %s that Ferry did not create (it lacks the labels %s=%s and %s=%s): Ferry leaves it alone, so this FerryService has no %s of its own until it is deleted or renamed, or the FerryService is",
		e.Kind, e.Name, e.Namespace, labelManagedBy, managedByFerry, labelFerryService, e.Name, e.Kind)
}

// keptSelector selects the objects Ferry keeps for FerryServices.
var keptSelector = labelManagedBy + "=" + managedByFerry + "," + labelFerryService

// newEndpointSync starts following the Services (and HTTPRoutes) kept for the FerryServices
// of namespace, until ctx ends; nil when the options ask for none, or when the controller may
// not list Services (logged). enqueue is handed the FerryService's name whenever one of its
// objects changes.
func newEndpointSync(ctx context.Context, c *Controller, kube kubernetes.Interface, dyn dynamic.Interface, namespace string, enqueue func(name string)) (*endpointSync, error) {
	target, err := c.opts.Endpoints.parse(namespace)
	if target == nil || err != nil {
		return nil, err
	}
	log := c.log.Named("endpoints")
	if _, err := kube.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{Limit: 1, LabelSelector: keptSelector}); err != nil {
		log.Error("FerryServices get no Service of their own: Services cannot be listed (no RBAC?)", zap.Error(err))
		return nil, nil
	}
	es := &endpointSync{target: target, kube: kube, log: log, state: map[string]endpointState{},
		writable: func() bool { return true }}
	if fence := c.opts.Store.Fence; fence != nil {
		es.writable = func() bool { _, ok := fence(); return ok }
	}
	handler := keptHandler(enqueue)
	tweak := func(o *metav1.ListOptions) { o.LabelSelector = keptSelector }
	factory := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace(namespace), informers.WithTweakListOptions(tweak))
	svcInf := factory.Core().V1().Services()
	if _, err := svcInf.Informer().AddEventHandler(handler); err != nil {
		return nil, err
	}
	es.services = svcInf.Lister()
	synced := []cache.InformerSynced{svcInf.Informer().HasSynced}
	var dynFactory dynamicinformer.DynamicSharedInformerFactory
	if target.routes() && es.routesServed(ctx, kube.Discovery(), dyn, namespace) {
		dynFactory = dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, namespace, tweak)
		inf := dynFactory.ForResource(HTTPRouteGVR)
		if _, err := inf.Informer().AddEventHandler(handler); err != nil {
			return nil, err
		}
		es.routes, es.routeLister = dyn.Resource(HTTPRouteGVR), inf.Lister()
		synced = append(synced, inf.Informer().HasSynced)
		dynFactory.Start(ctx.Done())
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil, fmt.Errorf("FerryService endpoint informers did not sync: %w", context.Cause(ctx))
	}
	go func() {
		<-ctx.Done()
		factory.Shutdown()
		if dynFactory != nil {
			dynFactory.Shutdown()
		}
	}()
	log.Info("FerryServices get a Service of their own leading to the proxies", zap.String("proxies", target.sharedEndpoint()),
		zap.Bool("httproutes", es.routes != nil))
	return es, nil
}

// routesServed says whether HTTPRoutes can be kept: the Gateway API's HTTPRoute v1 served, and
// listable by this controller. When not, it says so once, in one log line.
func (es *endpointSync) routesServed(ctx context.Context, disco discovery.DiscoveryInterface, dyn dynamic.Interface, namespace string) bool {
	resources, err := disco.ServerResourcesForGroupVersion(HTTPRouteGVR.GroupVersion().String())
	served := false
	if err == nil {
		for _, r := range resources.APIResources {
			served = served || r.Name == HTTPRouteGVR.Resource
		}
	}
	if !served {
		es.log.Warn("FerryServices get no HTTPRoute: the cluster does not serve the Gateway API's HTTPRoute (gateway.networking.k8s.io/v1); install its CRDs and restart the controller",
			zap.NamedError("discovery", err))
		return false
	}
	if _, err := dyn.Resource(HTTPRouteGVR).Namespace(namespace).List(ctx, metav1.ListOptions{Limit: 1, LabelSelector: keptSelector}); err != nil {
		es.log.Error("FerryServices get no HTTPRoute: HTTPRoutes cannot be listed (no RBAC?)", zap.Error(err))
		return false
	}
	return true
}

// keptHandler hands enqueue the FerryService of every kept object that changes.
func keptHandler(enqueue func(string)) cache.ResourceEventHandler {
	owner := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if m, err := metaOf(obj); err == nil && m.GetLabels()[labelFerryService] != "" {
			enqueue(m.GetLabels()[labelFerryService])
		}
	}
	return cache.ResourceEventHandlerFuncs{AddFunc: owner, UpdateFunc: func(_, obj any) { owner(obj) }, DeleteFunc: owner}
}

// metaOf is obj's metadata.
func metaOf(obj any) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no metadata", obj)
	}
	return m, nil
}

// ensure creates or corrects fsvc's Service and HTTPRoute. A same-named object Ferry did not
// make is left alone: a *NameTakenError, also kept for the status.
func (es *endpointSync) ensure(ctx context.Context, fsvc *unstructured.Unstructured) error {
	if !es.writable() {
		return nil
	}
	svcErr := es.ensureService(ctx, fsvc)
	var routeErr error
	if svcErr == nil && es.routes != nil {
		routeErr = es.ensureRoute(ctx, fsvc)
	}
	var st endpointState
	var taken *NameTakenError
	switch {
	case errors.As(svcErr, &taken):
		st.service = svcErr.Error()
	case svcErr != nil:
		return svcErr // the API server's trouble: retried, the status as it was
	case errors.As(routeErr, &taken):
		st.route = routeErr.Error()
	case routeErr != nil:
		return routeErr
	}
	es.mu.Lock()
	es.state[fsvc.GetNamespace()+"/"+fsvc.GetName()] = st
	es.mu.Unlock()
	return errors.Join(svcErr, routeErr)
}

// ensureService creates fsvc's Service, or corrects the one Ferry made.
func (es *endpointSync) ensureService(ctx context.Context, fsvc *unstructured.Unstructured) error {
	ns, name := fsvc.GetNamespace(), fsvc.GetName()
	var proxies *corev1.Service
	if ns == es.target.proxiesNamespace {
		var err error
		if proxies, err = es.kube.CoreV1().Services(ns).Get(ctx, es.target.proxies, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("the proxies' Service (--service-endpoints-via): %w", err)
		}
	}
	want, err := es.target.desiredService(fsvc, proxies)
	if err != nil {
		return err
	}
	client := es.kube.CoreV1().Services(ns)
	have, err := es.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		// Not Ferry's, as far as the cache knows: create it, unless something stands there.
		if _, err = client.Create(ctx, want, metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
			return err
		}
		if have, err = client.Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	switch {
	case !keptFor(have, name):
		return &NameTakenError{Kind: "Service", Namespace: ns, Name: name}
	case have.Spec.Type != want.Spec.Type:
		// The proxies moved to or from this namespace: a Service changes type only cleared
		// of what its old type set, so it is made again.
		if err := ignoreGone(client.Delete(ctx, name, deleteIfStill(have.UID))); err != nil {
			return err
		}
		_, err := client.Create(ctx, want, metav1.CreateOptions{})
		return err
	case serviceDiffers(have, want):
		upd := have.DeepCopy()
		upd.Labels = mergeLabels(upd.Labels, want.Labels)
		upd.OwnerReferences = want.OwnerReferences
		upd.Spec.Selector, upd.Spec.Ports, upd.Spec.ExternalName = want.Spec.Selector, want.Spec.Ports, want.Spec.ExternalName
		_, err := client.Update(ctx, upd, metav1.UpdateOptions{})
		return err
	}
	return nil
}

// mergeLabels is have with want's labels set.
func mergeLabels(have, want map[string]string) map[string]string {
	out := maps.Clone(have)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, want)
	return out
}

// ensureRoute creates fsvc's HTTPRoute, or corrects the one Ferry made.
func (es *endpointSync) ensureRoute(ctx context.Context, fsvc *unstructured.Unstructured) error {
	ns, name := fsvc.GetNamespace(), fsvc.GetName()
	want := es.target.desiredRoute(fsvc)
	client := es.routes.Namespace(ns)
	var have *unstructured.Unstructured
	cached, err := es.routeLister.ByNamespace(ns).Get(name)
	switch {
	case apierrors.IsNotFound(err):
		if _, err = client.Create(ctx, want, metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
			return err
		}
		if have, err = client.Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
	case err != nil:
		return err
	default:
		have = cached.(*unstructured.Unstructured)
	}
	if !keptFor(have, name) {
		return &NameTakenError{Kind: "HTTPRoute", Namespace: ns, Name: name}
	}
	if !routeDiffers(have, want) {
		return nil
	}
	upd := have.DeepCopy()
	upd.SetLabels(mergeLabels(upd.GetLabels(), want.GetLabels()))
	upd.SetOwnerReferences(want.GetOwnerReferences())
	upd.Object["spec"] = want.Object["spec"]
	_, err = client.Update(ctx, upd, metav1.UpdateOptions{})
	return err
}

// remove deletes the Service and HTTPRoute Ferry made for the FerryService name, which is
// gone (or no longer runs a service); a same-named object Ferry did not make stays. It reads
// from the API server, not the cache, so an object made just before is not missed.
func (es *endpointSync) remove(ctx context.Context, namespace, name string) error {
	if !es.writable() {
		return nil
	}
	svcs := es.kube.CoreV1().Services(namespace)
	var errs []error
	if svc, err := svcs.Get(ctx, name, metav1.GetOptions{}); err == nil && keptFor(svc, name) {
		errs = append(errs, ignoreGone(svcs.Delete(ctx, name, deleteIfStill(svc.UID))))
	} else if err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err)
	}
	if es.routes != nil {
		routes := es.routes.Namespace(namespace)
		if route, err := routes.Get(ctx, name, metav1.GetOptions{}); err == nil && keptFor(route, name) {
			errs = append(errs, ignoreGone(routes.Delete(ctx, name, deleteIfStill(route.GetUID()))))
		} else if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	es.mu.Lock()
	delete(es.state, namespace+"/"+name)
	es.mu.Unlock()
	return nil
}

// deleteIfStill deletes an object only while it is still uid: one made again since is left.
func deleteIfStill(uid types.UID) metav1.DeleteOptions {
	return metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}
}

// ignoreGone is err, unless it says the object is gone or was made again (deleteIfStill).
func ignoreGone(err error) error {
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// orphans are the FerryServices, by name, that Ferry keeps objects for in the cache but that
// exists says are gone (deleted while no controller led): each reconcile of such a name
// removes them.
func (es *endpointSync) orphans(exists func(name string) bool) []string {
	seen := map[string]bool{}
	var out []string
	add := func(m metav1.Object) {
		if name := m.GetLabels()[labelFerryService]; name != "" && !seen[name] && !exists(name) {
			seen[name] = true
			out = append(out, name)
		}
	}
	svcs, _ := es.services.List(labels.Everything())
	for _, s := range svcs {
		add(s)
	}
	if es.routeLister != nil {
		routes, _ := es.routeLister.List(labels.Everything())
		for _, r := range routes {
			if m, err := metaOf(r); err == nil {
				add(m)
			}
		}
	}
	return out
}

// status is what the status of the FerryService name in namespace says of its endpoint: the
// URL clients use (its own Service's, else the proxies' shared one, which reaches it by its
// model), the Endpoint condition (and Routed, with HTTPRoutes), and a message when it has no
// Service or route of its own.
func (es *endpointSync) status(namespace, name string) (endpoint, message string, conds []map[string]any) {
	es.mu.Lock()
	st, known := es.state[namespace+"/"+name]
	es.mu.Unlock()
	endpoint = es.target.sharedEndpoint()
	cond := map[string]any{"type": "Endpoint", "status": "Unknown", "reason": "Pending",
		"message": "its Service is being made; meanwhile " + endpoint + " reaches it by its model"}
	switch {
	case known && st.service != "":
		cond["status"], cond["reason"] = "False", "ServiceNameTaken"
		cond["message"] = st.service + "; meanwhile " + endpoint + " reaches it by its model"
		message = cond["message"].(string)
	case known:
		endpoint = es.target.endpoint(namespace, name)
		cond["status"], cond["reason"], cond["message"] = "True", "ServiceReady", "Service "+name+" leads to the proxies at "+es.target.sharedEndpoint()
	}
	conds = []map[string]any{cond}
	if es.routes == nil {
		return endpoint, message, conds
	}
	route := map[string]any{"type": "Routed", "status": "Unknown", "reason": "Pending", "message": ""}
	switch {
	case known && st.route != "":
		route["status"], route["reason"], route["message"] = "False", "HTTPRouteNameTaken", st.route
		message = st.route
	case known && st.service == "":
		route["status"], route["reason"] = "True", "HTTPRouteReady"
		route["message"] = "HTTPRoute " + name + " for host " + expandHostname(es.target.hostname, name, namespace)
	}
	return endpoint, message, append(conds, route)
}
