package controller

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// A FerryService's own endpoint (issue 36). Its service's endpoint inside the controller is a
// loopback address nothing else can reach, so where the release runs attached gateway proxies
// (ferry proxy --attach-all, which route each request by its "model") behind one Kubernetes
// Service, the leader keeps, per FerryService, a Service of the FerryService's name that leads
// to those proxies, and optionally a Gateway API HTTPRoute to that Service
// (endpointsync.go). This file is the pure half: the options, and the objects they ask for.

// EndpointOptions say where FerryServices' endpoints lead; the zero value keeps them off.
type EndpointOptions struct {
	// Via is the proxies' Service, [http://|https://]NAME[.NAMESPACE[.svc.DOMAIN]]:PORT
	// (--service-endpoints-via): NAMESPACE defaults to the controller's, DOMAIN to
	// cluster.local, the scheme to http.
	Via string
	// RouteParents are the parentRefs of an HTTPRoute per FerryService, each
	// KEY=VALUE[,KEY=VALUE...] over name (required), namespace, sectionName, port, group and
	// kind (--service-httproute-parent); none: no HTTPRoutes.
	RouteParents []string
	// RouteHostname is the HTTPRoute's hostname, {name} and {namespace} standing for the
	// FerryService's (--service-httproute-hostname); it must hold {name}, so that no two
	// routes claim one host.
	RouteHostname string
}

// Labels on the objects kept for a FerryService: managed-by says Ferry made it (Ferry never
// touches a same-named object without it), labelFerryService whose it is.
const (
	labelManagedBy    = "app.kubernetes.io/managed-by"
	managedByFerry    = "ferry"
	labelFerryService = "ferry.dev/ferryservice"
	// endpointPortName names the one port of a FerryService's Service.
	endpointPortName = "http"
)

// HTTPRouteGVR is the Gateway API's HTTPRoute, kept per FerryService where it is served.
var HTTPRouteGVR = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}

// endpointTarget is EndpointOptions parsed.
type endpointTarget struct {
	scheme string
	// proxies, proxiesNamespace and domain name the proxies' Service; port is its port, which
	// every FerryService's Service serves too.
	proxies, proxiesNamespace, domain string
	port                              int32
	parents                           []any // HTTPRoute parentRefs, as the API takes them
	hostname                          string
}

// Validate checks the options as the controller will read them, naming the flag at fault.
func (o EndpointOptions) Validate() error {
	_, err := o.parse("ferry")
	return err
}

// parse reads o; nil when Via is empty. namespace is the controller's, the proxies' unless
// Via names another.
func (o EndpointOptions) parse(namespace string) (*endpointTarget, error) {
	if o.Via == "" {
		if len(o.RouteParents) > 0 || o.RouteHostname != "" {
			return nil, errors.New("--service-httproute-parent, --service-httproute-hostname: HTTPRoutes lead to FerryServices' Services, so they need --service-endpoints-via")
		}
		return nil, nil
	}
	t, err := parseVia(o.Via, namespace)
	var errs []error
	if err != nil {
		errs = append(errs, fmt.Errorf("--service-endpoints-via %q: %w", o.Via, err))
	}
	if t == nil {
		t = &endpointTarget{}
	}
	for _, p := range o.RouteParents {
		ref, err := parseParentRef(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("--service-httproute-parent %q: %w", p, err))
			continue
		}
		t.parents = append(t.parents, ref)
	}
	switch {
	case len(o.RouteParents) == 0 && o.RouteHostname != "":
		errs = append(errs, errors.New("--service-httproute-hostname: set --service-httproute-parent too (the Gateway the routes attach to)"))
	case len(o.RouteParents) > 0 && !strings.Contains(o.RouteHostname, "{name}"):
		errs = append(errs, fmt.Errorf("--service-httproute-hostname %q: want a template holding {name}, such as {name}.example.com, so that each FerryService's route has a host of its own", o.RouteHostname))
	case o.RouteHostname != "":
		if msgs := validation.IsDNS1123Subdomain(expandHostname(o.RouteHostname, "name", "namespace")); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--service-httproute-hostname %q: not a DNS name once {name} and {namespace} are filled in: %s", o.RouteHostname, strings.Join(msgs, "; ")))
		}
	}
	t.hostname = o.RouteHostname
	return t, errors.Join(errs...)
}

// parseVia reads [SCHEME://]NAME[.NAMESPACE[.svc.DOMAIN]]:PORT.
func parseVia(via, namespace string) (*endpointTarget, error) {
	t := &endpointTarget{scheme: "http", proxiesNamespace: namespace, domain: "cluster.local"}
	rest := via
	if scheme, after, ok := strings.Cut(via, "://"); ok {
		if scheme != "http" && scheme != "https" {
			return nil, fmt.Errorf("scheme %q: want http or https", scheme)
		}
		t.scheme, rest = scheme, after
	}
	host, portStr, ok := strings.Cut(rest, ":")
	if !ok {
		return nil, errors.New("want the proxies' Service as NAME[.NAMESPACE]:PORT, such as ferry-proxy:80")
	}
	port, err := strconv.ParseInt(portStr, 10, 32)
	if err != nil || port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %q: want 1 to 65535", portStr)
	}
	t.port = int32(port)
	labels := strings.Split(host, ".")
	t.proxies = labels[0]
	if len(labels) > 1 {
		t.proxiesNamespace = labels[1]
	}
	switch {
	case len(labels) == 3 || len(labels) > 3 && labels[2] != "svc":
		return nil, fmt.Errorf("%q: want NAME, NAME.NAMESPACE or NAME.NAMESPACE.svc.CLUSTER_DOMAIN", host)
	case len(labels) > 3:
		t.domain = strings.Join(labels[3:], ".")
	}
	for _, l := range labels[:min(2, len(labels))] {
		if msgs := validation.IsDNS1123Label(l); len(msgs) > 0 {
			return nil, fmt.Errorf("%q: %s", l, strings.Join(msgs, "; "))
		}
	}
	return t, nil
}

// parentRefKeys are the fields of a Gateway API ParentReference.
var parentRefKeys = []string{"group", "kind", "namespace", "name", "sectionName", "port"}

// parseParentRef reads KEY=VALUE[,KEY=VALUE...] as a ParentReference.
func parseParentRef(s string) (map[string]any, error) {
	ref := map[string]any{}
	for pair := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		switch {
		case !ok || v == "":
			return nil, fmt.Errorf("%q: want KEY=VALUE", pair)
		case !slices.Contains(parentRefKeys, k):
			return nil, fmt.Errorf("%q: want one of %s", k, strings.Join(parentRefKeys, ", "))
		case ref[k] != nil:
			return nil, fmt.Errorf("%s given twice", k)
		case k == "port":
			port, err := strconv.ParseInt(v, 10, 32)
			if err != nil || port < 1 || port > 65535 {
				return nil, fmt.Errorf("port %q: want 1 to 65535", v)
			}
			ref[k] = port
		default:
			ref[k] = v
		}
	}
	if ref["name"] == nil {
		return nil, errors.New("name= is required (the Gateway's name)")
	}
	return ref, nil
}

// expandHostname fills the FerryService's name and namespace into the hostname template.
func expandHostname(template, name, namespace string) string {
	return strings.NewReplacer("{name}", name, "{namespace}", namespace).Replace(template)
}

// routes says whether HTTPRoutes are asked for.
func (t *endpointTarget) routes() bool { return len(t.parents) > 0 }

// sharedEndpoint is the proxies' own Service, which reaches every service by its model: what a
// FerryService's status shows while it has no Service of its own.
func (t *endpointTarget) sharedEndpoint() string {
	return fmt.Sprintf("%s://%s.%s.svc:%d", t.scheme, t.proxies, t.proxiesNamespace, t.port)
}

// endpoint is the URL of the FerryService name's own Service in namespace.
func (t *endpointTarget) endpoint(namespace, name string) string {
	return fmt.Sprintf("%s://%s.%s.svc:%d", t.scheme, name, namespace, t.port)
}

// endpointLabels mark an object as kept by Ferry for the FerryService name.
func endpointLabels(name string) map[string]string {
	return map[string]string{labelManagedBy: managedByFerry, labelFerryService: name}
}

// keptFor says whether obj is the object Ferry keeps for the FerryService name: one without
// these labels (someone else's) is never changed or deleted.
func keptFor(obj metav1.Object, name string) bool {
	l := obj.GetLabels()
	return l[labelManagedBy] == managedByFerry && l[labelFerryService] == name
}

// ownerRef makes the FerryService fsvc the owner of what is kept for it (for kubectl and the
// garbage collector; the controller deletes them itself, endpointsync.go).
func ownerRef(fsvc *unstructured.Unstructured) metav1.OwnerReference {
	controller := true
	return metav1.OwnerReference{APIVersion: fsvc.GetAPIVersion(), Kind: fsvc.GetKind(), Name: fsvc.GetName(),
		UID: fsvc.GetUID(), Controller: &controller}
}

// desiredService is the Service that reaches the proxies under fsvc's name. In the proxies'
// namespace it selects their pods (proxies is their Service, which names the selector and the
// pods' port); elsewhere a selector cannot reach them, so it is an ExternalName for their
// Service's DNS name, and proxies is not read.
func (t *endpointTarget) desiredService(fsvc *unstructured.Unstructured, proxies *corev1.Service) (*corev1.Service, error) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fsvc.GetName(), Namespace: fsvc.GetNamespace(),
		Labels: endpointLabels(fsvc.GetName()), OwnerReferences: []metav1.OwnerReference{ownerRef(fsvc)}}}
	port := corev1.ServicePort{Name: endpointPortName, Port: t.port, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(t.port)}
	if fsvc.GetNamespace() != t.proxiesNamespace {
		svc.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName,
			ExternalName: fmt.Sprintf("%s.%s.svc.%s", t.proxies, t.proxiesNamespace, t.domain), Ports: []corev1.ServicePort{port}}
		return svc, nil
	}
	if len(proxies.Spec.Selector) == 0 {
		return nil, fmt.Errorf("the proxies' Service %s/%s has no selector to copy", proxies.Namespace, proxies.Name)
	}
	i := slices.IndexFunc(proxies.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == t.port })
	if i < 0 {
		return nil, fmt.Errorf("the proxies' Service %s/%s has no port %d (--service-endpoints-via)", proxies.Namespace, proxies.Name, t.port)
	}
	port.TargetPort = proxies.Spec.Ports[i].TargetPort
	svc.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Selector: maps.Clone(proxies.Spec.Selector), Ports: []corev1.ServicePort{port}}
	return svc, nil
}

// serviceDiffers says whether have lacks what want asks for: the type, selector, external
// name, port and labels, and fsvc's ownership. What the API server fills in (a cluster IP,
// defaults) does not count.
func serviceDiffers(have, want *corev1.Service) bool {
	if have.Spec.Type != want.Spec.Type || !maps.Equal(have.Spec.Selector, want.Spec.Selector) ||
		have.Spec.ExternalName != want.Spec.ExternalName || len(have.Spec.Ports) != 1 ||
		!reflect.DeepEqual(have.Spec.Ports[0], want.Spec.Ports[0]) {
		return true
	}
	return labelsOrOwnerDiffer(have, want)
}

// labelsOrOwnerDiffer says whether have misses want's labels or its owner.
func labelsOrOwnerDiffer(have, want metav1.Object) bool {
	for k, v := range want.GetLabels() {
		if have.GetLabels()[k] != v {
			return true
		}
	}
	return !reflect.DeepEqual(have.GetOwnerReferences(), want.GetOwnerReferences())
}

// desiredRoute is fsvc's HTTPRoute: the configured parents, its hostname, and every request
// to its Service.
func (t *endpointTarget) desiredRoute(fsvc *unstructured.Unstructured) *unstructured.Unstructured {
	route := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": HTTPRouteGVR.GroupVersion().String(), "kind": "HTTPRoute",
		"spec": map[string]any{
			"parentRefs": runtime.DeepCopyJSONValue(t.parents),
			"hostnames":  []any{expandHostname(t.hostname, fsvc.GetName(), fsvc.GetNamespace())},
			"rules":      []any{map[string]any{"backendRefs": []any{map[string]any{"name": fsvc.GetName(), "port": int64(t.port)}}}},
		},
	}}
	route.SetName(fsvc.GetName())
	route.SetNamespace(fsvc.GetNamespace())
	route.SetLabels(endpointLabels(fsvc.GetName()))
	route.SetOwnerReferences([]metav1.OwnerReference{ownerRef(fsvc)})
	return route
}

// routeDiffers says whether have lacks what want's spec, labels or owner ask for. The API
// server fills in defaults (a rule's path match, a backend's kind and weight), so want need
// only be contained in have.
func routeDiffers(have, want *unstructured.Unstructured) bool {
	return !contains(have.Object["spec"], want.Object["spec"]) || labelsOrOwnerDiffer(have, want)
}

// contains says whether have holds every value of want: maps key by key, lists element by
// element and of the same length, other values equal.
func contains(have, want any) bool {
	switch w := want.(type) {
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range w {
			if !contains(h[k], v) {
				return false
			}
		}
		return true
	case []any:
		h, ok := have.([]any)
		if !ok || len(h) != len(w) {
			return false
		}
		for i := range w {
			if !contains(h[i], w[i]) {
				return false
			}
		}
		return true
	default:
		return reflect.DeepEqual(have, want)
	}
}
