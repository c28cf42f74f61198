package autoscaler

import (
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
)

// BenchmarkDecide is one decision of each windowed policy with a full 20-minute stable window,
// what the simulator runs millions of times and the controller once a second per service.
func BenchmarkDecide(b *testing.B) {
	for _, policy := range []string{PolicyRequestRate, PolicyConcurrency, PolicyLLM} {
		b.Run(policy, func(b *testing.B) {
			s := New(Spec{Policy: policy, Min: 1, Max: 50, TargetQPS: 1, TargetInflight: 2,
				StableWindow: 20 * time.Minute, UpscaleDelay: time.Minute, DownscaleDelay: 5 * time.Minute})
			now := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
			obs := Observation{Arrivals: 3, InFlight: 7, Engine: &EngineLoad{Waiting: 2, KVCacheUsage: 0.5}}
			st := State{Ready: 4, Target: 4}
			for range 1200 { // fill the window
				now = now.Add(time.Second)
				s.Decide(now, obs, st)
			}
			b.ReportAllocs()
			for b.Loop() {
				now = now.Add(time.Second)
				st.Target = s.Decide(now, obs, st).Target
			}
		})
	}
	// The defaults: target, windows and headroom learned, over a 20-minute window too.
	b.Run("concurrency-learned", func(b *testing.B) {
		s := New(SpecFor(configs.ReplicaPolicy{MinReplicas: 1, MaxReplicas: 50, Autoscaler: PolicyConcurrency}))
		now := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
		obs := Observation{Arrivals: 3, InFlight: 7, ColdStart: 4 * time.Minute,
			Engine: &EngineLoad{Waiting: 2, Running: 6, KVCacheUsage: 0.5, Replicas: 4}}
		st := State{Ready: 4, Target: 4}
		for range 3600 { // fill the windows
			now = now.Add(time.Second)
			s.Decide(now, obs, st)
		}
		b.ReportAllocs()
		for b.Loop() {
			now = now.Add(time.Second)
			st.Target = s.Decide(now, obs, st).Target
		}
	})
}
