package attach

import (
	"maps"
	"slices"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/proxy"
)

// ProxyConfig is the part of a service's YAML a proxy needs to serve it as the controller's own
// proxy does. TLS is not in it: a standalone proxy terminates TLS with its own certificate.
type ProxyConfig struct {
	Policy                  string             `json:"load_balancing_policy"`
	TargetQPSPerAccelerator map[string]float64 `json:"target_qps_per_accelerator,omitempty"`
	// AuthRequired makes the proxy require an API key from APIKeyHashes (hex SHA-256 of each
	// key, configs.HashAPIKey); with no hashes it rejects every request. The flag keeps "no
	// auth" apart from "auth with no keys", which an empty JSON list would blur.
	AuthRequired bool     `json:"auth_required"`
	APIKeyHashes []string `json:"api_key_hashes,omitempty"`
	// Limits, as service.limits; zero keeps the proxy's default.
	MaxRequestBodyMB      int `json:"max_request_body_mb,omitempty"`
	MaxConcurrentRequests int `json:"max_concurrent_requests,omitempty"`
	IdleTimeoutSeconds    int `json:"idle_timeout_seconds,omitempty"`
	MaxQueuedRequests     int `json:"max_queued_requests,omitempty"`
	MaxQueueWaitSeconds   int `json:"max_queue_wait_seconds,omitempty"`
	MaxConcurrentStreams  int `json:"max_concurrent_streams,omitempty"`
	MaxInFlightPerReplica int `json:"max_in_flight_per_replica,omitempty"`
	// RateLimitPerKey is service.limits.rate_limit_per_key with its default burst filled in;
	// nil means none.
	RateLimitPerKey *configs.RateLimit `json:"rate_limit_per_key,omitempty"`
	// HealthCheck is service.health_check; nil keeps the proxy's defaults.
	HealthCheck *configs.HealthCheck `json:"health_check,omitempty"`
	// Adapters is service.adapters; nil when the service has none.
	Adapters *configs.Adapters `json:"adapters,omitempty"`
}

// ProxyConfigFor extracts a service's proxy configuration; it is the same mapping the
// controller's own proxy uses.
func ProxyConfigFor(svc *configs.Service) ProxyConfig {
	if svc == nil {
		return ProxyConfig{}
	}
	pc := ProxyConfig{Policy: svc.LoadBalancingPolicy}
	if len(svc.ReplicaPolicy.TargetQPSPerAccelerator) > 0 {
		pc.TargetQPSPerAccelerator = maps.Clone(svc.ReplicaPolicy.TargetQPSPerAccelerator)
	}
	if a := svc.Auth; a != nil {
		pc.AuthRequired = true
		pc.APIKeyHashes = slices.Clone(a.KeyHashes)
	}
	if l := svc.Limits; l != nil {
		pc.MaxRequestBodyMB = l.MaxRequestBodyMB
		pc.MaxConcurrentRequests = l.MaxConcurrentRequests
		pc.IdleTimeoutSeconds = l.IdleTimeoutSeconds
		pc.MaxQueuedRequests = l.MaxQueuedRequests
		pc.MaxQueueWaitSeconds = l.MaxQueueWaitSeconds
		pc.MaxConcurrentStreams = l.MaxConcurrentStreams
		pc.MaxInFlightPerReplica = l.MaxInFlightPerReplica
		if r := l.RateLimitPerKey; r != nil {
			rate := *r
			pc.RateLimitPerKey = &rate
		}
	}
	if h := svc.HealthCheck; h != nil {
		hc := *h
		pc.HealthCheck = &hc
	}
	if a := svc.Adapters; a != nil {
		ac := *a
		ac.Modules = maps.Clone(a.Modules)
		pc.Adapters = &ac
	}
	return pc
}

// Apply adds this configuration of a service to a proxy's own (name, TLS, logs, metrics): the
// one mapping from a service's YAML to its proxy, used by the controller's proxies and by
// attached ones.
func (pc ProxyConfig) Apply(base proxy.ServiceConfig) proxy.ServiceConfig {
	cfg := base
	cfg.Policy = pc.Policy
	cfg.TargetQPSPerAccelerator = pc.TargetQPSPerAccelerator
	cfg.APIKeyHashes = nil
	if pc.AuthRequired {
		cfg.APIKeyHashes = append([]string{}, pc.APIKeyHashes...) // non-nil even when empty: reject all
	}
	cfg.MaxRequestBodySize = pc.MaxRequestBodyMB << 20
	cfg.MaxConcurrentRequests = pc.MaxConcurrentRequests
	cfg.IdleTimeout = time.Duration(pc.IdleTimeoutSeconds) * time.Second
	cfg.MaxQueuedRequests = pc.MaxQueuedRequests
	cfg.MaxQueueWait = time.Duration(pc.MaxQueueWaitSeconds) * time.Second
	cfg.MaxConcurrentStreams = pc.MaxConcurrentStreams
	cfg.MaxInFlightPerReplica = pc.MaxInFlightPerReplica
	cfg.RateLimit = proxy.RateLimit{}
	if r := pc.RateLimitPerKey; r != nil {
		cfg.RateLimit = proxy.RateLimit{RequestsPerSecond: r.RequestsPerSecond, Burst: r.Burst}
	}
	cfg.HealthCheck = proxy.HealthCheck{}
	if h := pc.HealthCheck; h != nil {
		cfg.HealthCheck = proxy.HealthCheckFor(h.Path, h.IntervalSeconds, h.TimeoutSeconds, h.Disabled)
	}
	cfg.Adapters, cfg.MaxLoRAs, cfg.LoadAdapters, cfg.MaxLoadedAdapters = nil, 0, nil, 0
	if a := pc.Adapters; a != nil {
		cfg.Adapters, cfg.MaxLoRAs = a.Names(), a.MaxLoRAs
		if a.Load == configs.AdaptersOnDemand {
			cfg.LoadAdapters, cfg.MaxLoadedAdapters = maps.Clone(a.Modules), a.MaxLoaded
		}
	}
	return cfg
}
