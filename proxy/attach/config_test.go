package attach

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/proxy"
)

func TestProxyConfigFor(t *testing.T) {
	tests := map[string]struct {
		svc  *configs.Service
		want ProxyConfig
	}{
		"no auth": {svc: &configs.Service{LoadBalancingPolicy: "least_load"}, want: ProxyConfig{Policy: "least_load"}},
		"auth without keys rejects all": {
			svc:  &configs.Service{Auth: &configs.Auth{KeysFromEnv: []string{"K"}}},
			want: ProxyConfig{AuthRequired: true},
		},
		"keys, qps and limits": {
			svc: &configs.Service{
				LoadBalancingPolicy: "instance_aware_least_load",
				ReplicaPolicy:       configs.ReplicaPolicy{TargetQPSPerAccelerator: map[string]float64{"A100": 2}},
				Auth:                &configs.Auth{KeyHashes: []string{"abc"}},
				Limits: &configs.Limits{MaxRequestBodyMB: 8, MaxConcurrentRequests: 100, IdleTimeoutSeconds: 30,
					MaxQueuedRequests: -1, MaxQueueWaitSeconds: 10, MaxConcurrentStreams: 20, MaxInFlightPerReplica: 16,
					RateLimitPerKey: &configs.RateLimit{RequestsPerSecond: 0.5, Burst: 4}},
			},
			want: ProxyConfig{Policy: "instance_aware_least_load", TargetQPSPerAccelerator: map[string]float64{"A100": 2},
				AuthRequired: true, APIKeyHashes: []string{"abc"}, MaxRequestBodyMB: 8, MaxConcurrentRequests: 100,
				IdleTimeoutSeconds: 30, MaxQueuedRequests: -1, MaxQueueWaitSeconds: 10, MaxConcurrentStreams: 20, MaxInFlightPerReplica: 16,
				RateLimitPerKey: &configs.RateLimit{RequestsPerSecond: 0.5, Burst: 4}},
		},
		"health check": {
			svc:  &configs.Service{HealthCheck: &configs.HealthCheck{Path: "/ping", IntervalSeconds: 0.2, Disabled: true}},
			want: ProxyConfig{HealthCheck: &configs.HealthCheck{Path: "/ping", IntervalSeconds: 0.2, Disabled: true}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ProxyConfigFor(tc.svc)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestAttachedServiceConfig: an attached proxy enforces the auth and every limit the controller
// hands it, as the controller's own proxy does, and a configuration without them turns them off.
func TestAttachedServiceConfig(t *testing.T) {
	base := proxy.ServiceConfig{Name: "llama", MaxRequestBodySize: 1 << 20}
	svc := &configs.Service{
		LoadBalancingPolicy: "round_robin",
		Auth:                &configs.Auth{KeyHashes: []string{configs.HashAPIKey("sk-ferry-attached-0123456789")}},
		Limits: &configs.Limits{MaxRequestBodyMB: 8, MaxConcurrentRequests: 100, IdleTimeoutSeconds: 30,
			MaxQueuedRequests: -1, MaxQueueWaitSeconds: 10, MaxConcurrentStreams: 20,
			RateLimitPerKey: &configs.RateLimit{RequestsPerSecond: 0.5, Burst: 4}},
	}
	got := ProxyConfigFor(svc).Apply(base)
	want := proxy.ServiceConfig{Name: "llama", Policy: "round_robin", APIKeyHashes: svc.Auth.KeyHashes,
		MaxRequestBodySize: 8 << 20, MaxConcurrentRequests: 100, IdleTimeout: 30 * time.Second,
		MaxQueuedRequests: -1, MaxQueueWait: 10 * time.Second, MaxConcurrentStreams: 20,
		RateLimit: proxy.RateLimit{RequestsPerSecond: 0.5, Burst: 4}}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreUnexported(proxy.ServiceConfig{})); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if _, err := proxy.NewService(got); err != nil {
		t.Fatalf("the attached config is rejected: %v", err)
	}

	open := ProxyConfigFor(&configs.Service{LoadBalancingPolicy: "round_robin"}).Apply(got)
	if open.APIKeyHashes != nil || open.RateLimit != (proxy.RateLimit{}) || open.MaxConcurrentStreams != 0 {
		t.Errorf("limits survive a configuration without them: keys %v, rate %+v, streams %d",
			open.APIKeyHashes, open.RateLimit, open.MaxConcurrentStreams)
	}
}
