package controller

import (
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/proxy"
)

// TestProxyConfig: the controller's own proxy for a service enforces its API keys and every
// limit of its YAML (an attached proxy gets the same through attach.ProxyConfigFor).
func TestProxyConfig(t *testing.T) {
	c := New(Options{})
	svc := &configs.Service{
		LoadBalancingPolicy: "least_load",
		Auth:                &configs.Auth{KeyHashes: []string{configs.HashAPIKey("sk-ferry-controller-0123456789")}},
		Limits: &configs.Limits{MaxRequestBodyMB: 8, MaxConcurrentRequests: 100, IdleTimeoutSeconds: 30,
			MaxQueuedRequests: -1, MaxQueueWaitSeconds: 10, MaxConcurrentStreams: 20,
			RateLimitPerKey: &configs.RateLimit{RequestsPerSecond: 0.5, Burst: 4}},
	}
	cfg, err := c.proxyConfig("chat", svc)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.APIKeyHashes) != 1 || cfg.APIKeyHashes[0] != svc.Auth.KeyHashes[0] {
		t.Errorf("key hashes %v", cfg.APIKeyHashes)
	}
	if cfg.MaxRequestBodySize != 8<<20 || cfg.MaxConcurrentRequests != 100 || cfg.IdleTimeout != 30*time.Second ||
		cfg.MaxQueuedRequests != -1 || cfg.MaxQueueWait != 10*time.Second || cfg.MaxConcurrentStreams != 20 ||
		cfg.RateLimit != (proxy.RateLimit{RequestsPerSecond: 0.5, Burst: 4}) {
		t.Errorf("limits not all applied: %+v", cfg)
	}
	if _, err := proxy.NewService(cfg); err != nil {
		t.Fatalf("the config is rejected: %v", err)
	}
	open, err := c.proxyConfig("open", &configs.Service{Auth: &configs.Auth{}})
	if err != nil {
		t.Fatal(err)
	}
	if open.APIKeyHashes == nil {
		t.Error("auth without keys became no auth; it must reject every request")
	}
}
