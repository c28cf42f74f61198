package main

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/proxy"
)

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
	got := api.ProxyConfigFor(svc).Apply(base)
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

	open := api.ProxyConfigFor(&configs.Service{LoadBalancingPolicy: "round_robin"}).Apply(got)
	if open.APIKeyHashes != nil || open.RateLimit != (proxy.RateLimit{}) || open.MaxConcurrentStreams != 0 {
		t.Errorf("limits survive a configuration without them: keys %v, rate %+v, streams %d",
			open.APIKeyHashes, open.RateLimit, open.MaxConcurrentStreams)
	}
}
