package kubernetes

import (
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// TestClientRateLimit checks that the provider's clients are made with the configured
// client-side rate limit, and with DefaultQPS and DefaultBurst rather than client-go's 5 and
// 10 when none is configured: the request client's and the streams' token buckets.
func TestClientRateLimit(t *testing.T) {
	tests := map[string]struct {
		qps     float32
		burst   int
		wantQPS float32
	}{
		"defaults": {wantQPS: DefaultQPS},
		"set":      {qps: 30, burst: 60, wantQPS: 30},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			// A caller's own limit (client-go's defaults, here) is replaced, not kept.
			cfg := &rest.Config{Host: "https://127.0.0.1:6443", QPS: 5, Burst: 10, RateLimiter: flowcontrol.NewFakeAlwaysRateLimiter()}
			p, err := New(Options{RESTConfig: cfg, Namespace: "ns", QPS: tc.qps, Burst: tc.burst})
			if err != nil {
				t.Fatal(err)
			}
			for what, client := range map[string]kubernetes.Interface{"requests": p.client, "streams": p.streams} {
				limiter := client.CoreV1().RESTClient().GetRateLimiter()
				if limiter == nil {
					t.Errorf("%s client has no rate limiter, want one at %v QPS", what, tc.wantQPS)
				} else if got := limiter.QPS(); got != tc.wantQPS {
					t.Errorf("%s client rate limiter at %v QPS, want %v", what, got, tc.wantQPS)
				}
			}
			if cfg.QPS != 5 {
				t.Error("New changed the caller's configuration")
			}
		})
	}
	for _, tc := range []struct {
		qps, wantQPS     float32
		burst, wantBurst int
	}{{0, DefaultQPS, 0, DefaultBurst}, {30, 30, 60, 60}, {-1, -1, 0, DefaultBurst}} {
		cfg := &rest.Config{}
		RateLimit(cfg, tc.qps, tc.burst)
		if cfg.QPS != tc.wantQPS || cfg.Burst != tc.wantBurst {
			t.Errorf("RateLimit(%v, %d) = %v, %d; want %v, %d", tc.qps, tc.burst, cfg.QPS, cfg.Burst, tc.wantQPS, tc.wantBurst)
		}
	}
}
