// Package extmetrics serves Kubernetes' external metrics API (external.metrics.k8s.io/v1beta1)
// behind the API server's aggregation layer, so that a HorizontalPodAutoscaler can scale on a
// metric only Ferry knows, such as the requests its attached proxies hold (`type: External`).
//
// It is what prometheus-adapter or KEDA's metrics server does, written by hand in a few hundred
// lines rather than on k8s.io/apiserver: discovery, one list endpoint per metric, the
// aggregator authenticated by its front-proxy client certificate against the request-header CA
// the API server publishes in kube-system/extension-apiserver-authentication (authn.go), and
// every metric read authorized by a SubjectAccessReview for the user the aggregator names
// (authz.go). Values come from a Source; the package imports nothing of Ferry's.
//
// Only one APIService can serve external.metrics.k8s.io v1beta1 in a cluster: with KEDA or
// prometheus-adapter installed, Ferry's cannot be registered beside them.
package extmetrics

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	externalmetrics "k8s.io/metrics/pkg/apis/external_metrics/v1beta1"
)

// Group and Version are the API this package serves.
const (
	Group        = "external.metrics.k8s.io"
	Version      = "v1beta1"
	GroupVersion = Group + "/" + Version
)

// Sample is one series of a metric now: the labels that tell it from the metric's other series
// (say, service=chat) and its value.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Source gives the current series of a metric. The server lists only the names in
// Options.Metrics, so Source is asked only for those.
type Source interface {
	ExternalMetric(ctx context.Context, name string) ([]Sample, error)
}

// Options configure a Server.
type Options struct {
	// Metrics are the names served, each a resource of the API (lowercase, as an HPA's
	// metric.name must be a resource name).
	Metrics []string
	Source  Source
	// Authenticator and Authorizer judge every request; both are required (NewRequestHeader,
	// NewSubjectAccessReviewer).
	Authenticator Authenticator
	Authorizer    Authorizer
	// Now is the clock for the samples' timestamps; nil is time.Now.
	Now func() time.Time
}

// Server is the API's HTTP handler.
type Server struct {
	opts Options
	mux  *http.ServeMux
}

var _ http.Handler = (*Server)(nil)

// NewServer returns the handler; serve it over TLS with client certificates requested
// (TLSConfig).
func NewServer(opts Options) *Server {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Server{opts: opts, mux: http.NewServeMux()}
	s.mux.HandleFunc("GET /apis", s.groupList)
	s.mux.HandleFunc("GET /apis/"+Group, s.group)
	s.mux.HandleFunc("GET /apis/"+GroupVersion, s.resources)
	s.mux.HandleFunc("GET /apis/"+GroupVersion+"/namespaces/{namespace}/{metric}", s.list)
	for _, path := range []string{"/healthz", "/readyz", "/livez"} {
		s.mux.HandleFunc("GET "+path, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	}
	return s
}

// ServeHTTP authenticates every request but the health checks, then routes it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" || r.URL.Path == "/livez" {
		s.mux.ServeHTTP(w, r)
		return
	}
	u, err := s.opts.Authenticator.Authenticate(r)
	if err != nil {
		writeStatus(w, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized: "+err.Error())
		return
	}
	s.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, u)))
}

type userKey struct{}

// groupList is /apis: this server's one group. The aggregator asks it for aggregated discovery
// first and, on a plain APIGroupList, falls back to the version's resource list.
func (s *Server) groupList(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, &metav1.APIGroupList{
		TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"},
		Groups:   []metav1.APIGroup{apiGroup()},
	})
}

func (s *Server) group(w http.ResponseWriter, _ *http.Request) {
	g := apiGroup()
	g.TypeMeta = metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}
	writeJSON(w, http.StatusOK, &g)
}

func apiGroup() metav1.APIGroup {
	v := metav1.GroupVersionForDiscovery{GroupVersion: GroupVersion, Version: Version}
	return metav1.APIGroup{Name: Group, Versions: []metav1.GroupVersionForDiscovery{v}, PreferredVersion: v}
}

// resources is the version's discovery: each metric a namespaced resource that can be read,
// as prometheus-adapter and KEDA list theirs.
func (s *Server) resources(w http.ResponseWriter, _ *http.Request) {
	list := &metav1.APIResourceList{
		TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
		GroupVersion: GroupVersion,
		APIResources: []metav1.APIResource{},
	}
	for _, name := range s.opts.Metrics {
		list.APIResources = append(list.APIResources, metav1.APIResource{
			Name: name, Namespaced: true, Kind: "ExternalMetricValueList", Verbs: metav1.Verbs{"get"},
		})
	}
	writeJSON(w, http.StatusOK, list)
}

// list answers GET .../namespaces/NS/METRIC?labelSelector=SEL: the metric's series whose
// labels SEL matches. The metric is the same in every namespace (it is external to them); who
// may read it in a namespace is the cluster's RBAC's say, through the Authorizer.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	namespace, name := r.PathValue("namespace"), r.PathValue("metric")
	u := r.Context().Value(userKey{}).(User)
	allowed, reason, err := s.opts.Authorizer.Authorize(r.Context(), u, Attributes{Verb: "list", Namespace: namespace, Metric: name})
	if err != nil {
		writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError, "authorization: "+err.Error())
		return
	}
	if !allowed {
		msg := `external metric "` + name + `" is forbidden: User "` + u.Name + `" cannot list resource "` + name +
			`" in API group "` + Group + `" in the namespace "` + namespace + `"`
		if reason != "" {
			msg += ": " + reason
		}
		writeStatus(w, http.StatusForbidden, metav1.StatusReasonForbidden, msg)
		return
	}
	if !slices.Contains(s.opts.Metrics, name) {
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, `external metric "`+name+`" not found; this server serves `+strings.Join(s.opts.Metrics, ", "))
		return
	}
	selector, err := labels.Parse(r.URL.Query().Get("labelSelector"))
	if err != nil {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, "labelSelector: "+err.Error())
		return
	}
	samples, err := s.opts.Source.ExternalMetric(r.Context(), name)
	if err != nil {
		writeStatus(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "read "+name+": "+err.Error())
		return
	}
	now := metav1.NewTime(s.opts.Now())
	out := &externalmetrics.ExternalMetricValueList{
		TypeMeta: metav1.TypeMeta{Kind: "ExternalMetricValueList", APIVersion: GroupVersion},
		Items:    []externalmetrics.ExternalMetricValue{},
	}
	for _, sample := range samples {
		if !selector.Matches(labels.Set(sample.Labels)) {
			continue
		}
		metricLabels := sample.Labels
		if metricLabels == nil {
			metricLabels = map[string]string{}
		}
		out.Items = append(out.Items, externalmetrics.ExternalMetricValue{
			MetricName:   name,
			MetricLabels: metricLabels,
			Timestamp:    now,
			Value:        *resource.NewMilliQuantity(int64(sample.Value*1000), resource.DecimalSI),
		})
	}
	writeJSON(w, http.StatusOK, out)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// writeStatus answers an error as the API server does, a metav1.Status that kubectl and
// client-go read.
func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	writeJSON(w, code, &metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: msg, Reason: reason, Code: int32(code),
	})
}
