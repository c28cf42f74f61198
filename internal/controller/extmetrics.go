package controller

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/extmetrics"
)

// The external metrics API (internal/extmetrics) on a listener of its own, for a
// HorizontalPodAutoscaler of the attached proxies: the chart's APIService
// v1beta1.external.metrics.k8s.io leads the API server's aggregation layer here. The one metric
// is MetricProxyRequestsInFlight, what the attached proxies' load reports say, per service.
//
// Every controller serves it, since the APIService's Service reaches any of them. Only the
// leader hears the proxies' reports, so a follower asks the leader (GET ProxyLoadPath, with the
// controller token, over the pinned certificate as a forwarded request goes) and answers with
// that.

// MetricProxyRequestsInFlight is the requests the release's attached proxies hold now, in
// flight to a replica or waiting in a proxy for one, one series per service (label service).
// An HPA of the proxies with `type: External` and `target.averageValue: N` keeps about N of
// them per proxy.
const MetricProxyRequestsInFlight = "ferry_proxy_requests_in_flight"

// ProxyLoadPath is the API route that reports MetricProxyRequestsInFlight per service: what a
// follower's external metrics ask of the leader.
const ProxyLoadPath = "/v1/attach/load"

// ExternalMetricsOptions serve the external metrics API (off when Addr is empty).
type ExternalMetricsOptions struct {
	// Addr is host:port; CertFile and KeyFile are its TLS certificate and key (PEM), which
	// the APIService's caBundle must verify for the name <service>.<namespace>.svc.
	Addr, CertFile, KeyFile string
}

// ProxyLoad is one service's attached load, as ProxyLoadPath answers it.
type ProxyLoad struct {
	Service  string  `json:"service"`
	InFlight float64 `json:"in_flight"`
}

// startExternalMetrics serves the external metrics API when configured; stop shuts it down. It
// reaches the API server as the store does (--kubeconfig, --kube-context, else in-cluster) to
// read the aggregation layer's CA and to review each reader's access.
func (c *Controller) startExternalMetrics(ctx context.Context, tokens api.Tokens) (stop func(), err error) {
	o := c.opts.ExternalMetrics
	if o.Addr == "" {
		return func() {}, nil
	}
	if o.CertFile == "" || o.KeyFile == "" {
		return nil, errors.New("the external metrics API needs a TLS certificate and key: the API server's aggregation layer calls it over HTTPS only")
	}
	cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
	if err != nil {
		return nil, err
	}
	cfg, err := c.opts.Store.restConfig()
	if err != nil {
		return nil, fmt.Errorf("external metrics: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return nil, err
	}
	authn := extmetrics.NewRequestHeader(client, time.Minute)
	c.spawn(nil, "external metrics authentication", func() {
		authn.Run(ctx, func(err error) {
			c.log.Warn("external metrics: cannot authenticate the aggregation layer", zap.Error(err))
		})
	})
	srv := &http.Server{
		Handler: extmetrics.NewServer(extmetrics.Options{
			Metrics:       []string{MetricProxyRequestsInFlight},
			Source:        externalMetricsSource{c: c, token: tokens.Full},
			Authenticator: authn,
			Authorizer:    extmetrics.NewSubjectAccessReviewer(client, 10*time.Second),
		}),
		ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		TLSConfig: extmetrics.TLSConfig(cert),
	}
	c.spawn(nil, "external metrics", func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			c.log.Error("external metrics API stopped", zap.Error(err))
		}
	})
	c.log.Info("external metrics API serving", zap.String("addr", ln.Addr().String()), zap.String("metric", MetricProxyRequestsInFlight))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

// proxyLoad is every running service's attached load, by name.
func (c *Controller) proxyLoad() []ProxyLoad {
	services := c.serviceList()
	out := make([]ProxyLoad, 0, len(services))
	for _, s := range services {
		inflight, _ := s.attach.Load()
		out = append(out, ProxyLoad{Service: s.name, InFlight: inflight})
	}
	return out
}

// leads reports whether this controller runs the services (no election, or elected and loaded).
func (c *Controller) leads() bool {
	return c.opts.Elector == nil || c.api.Load() != nil
}

// proxyLoadRoute serves ProxyLoadPath on the leader.
func (c *Controller) proxyLoadRoute() api.Route {
	return api.Route{Method: http.MethodGet, Pattern: ProxyLoadPath, Handler: func(w http.ResponseWriter, _ *http.Request) {
		api.WriteJSON(w, http.StatusOK, c.proxyLoad())
	}}
}

// externalMetricsSource answers the metric from this controller's hubs when it leads, else
// from the leader's.
type externalMetricsSource struct {
	c     *Controller
	token string
}

var _ extmetrics.Source = externalMetricsSource{}

func (s externalMetricsSource) ExternalMetric(ctx context.Context, name string) ([]extmetrics.Sample, error) {
	if name != MetricProxyRequestsInFlight {
		return nil, fmt.Errorf("no metric %q", name)
	}
	var loads []ProxyLoad
	if s.c.leads() {
		loads = s.c.proxyLoad()
	} else {
		var err error
		if loads, err = s.c.leaderProxyLoad(ctx, s.token); err != nil {
			return nil, err
		}
	}
	samples := make([]extmetrics.Sample, 0, len(loads))
	for _, l := range loads {
		samples = append(samples, extmetrics.Sample{Labels: map[string]string{"service": l.Service}, Value: l.InFlight})
	}
	return samples, nil
}

// leaderLoadTimeout bounds a follower's question to the leader: a hung leader fails the metric
// read (the HPA then keeps its scale) well inside the aggregator's own timeout.
var leaderLoadTimeout = 5 * time.Second

// leaderProxyLoad asks the leader named on the Lease for its ProxyLoadPath.
func (c *Controller) leaderProxyLoad(ctx context.Context, token string) ([]ProxyLoad, error) {
	id, to, err := c.opts.Elector.Leader(ctx)
	if err != nil {
		return nil, err
	}
	if id == "" || to == "" || id == c.opts.Elector.Identity() {
		return nil, errors.New("no leader is known yet")
	}
	ctx, cancel := context.WithTimeout(ctx, leaderLoadTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, to+ProxyLoadPath, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set(headerForwarded, c.opts.Elector.Identity())
	resp, err := (&http.Client{Transport: c.leaderRoundTripper()}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("ask the leader: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("ask the leader: %s: %.200s", resp.Status, body)
	}
	var loads []ProxyLoad
	if err := json.Unmarshal(body, &loads); err != nil {
		return nil, fmt.Errorf("the leader's %s: %w", ProxyLoadPath, err)
	}
	return loads, nil
}
