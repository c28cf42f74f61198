package autoscaler

import (
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
)

// SkyPilot's examples/serve/min_replicas_zero.yaml (its workdir left out).
const minReplicasZero = `service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 20
  replica_policy:
    min_replicas: 0
    max_replicas: 2
    target_qps_per_replica: 1
resources:
  ports: 8081
  cpus: 2+
run: python3 server.py
`

// TestSkyServeMinReplicasZeroStartsAtZero: min_replicas: 0 under target_qps_per_replica is
// SkyServe's request_rate autoscaler starting with no replica; idle, it stays there decision
// after decision, and the first request jumps it to one at once (SkyServe's "from zero").
func TestSkyServeMinReplicasZeroStartsAtZero(t *testing.T) {
	task, err := configs.Parse("min_replicas_zero.yaml", []byte(minReplicasZero), configs.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	spec := SpecFor(task.Service.ReplicaPolicy)
	if spec.Policy != PolicyRequestRate || spec.InitialTarget() != 0 {
		t.Fatalf("policy %q, initial target %d: want request_rate starting at 0", spec.Policy, spec.InitialTarget())
	}
	s := New(spec)
	now := time.Unix(0, 0)
	st := State{}
	for i := range 3600 {
		d := s.Decide(now, Observation{}, st)
		if d.Target != 0 {
			t.Fatalf("decision %d with no load: target %d (%s)", i, d.Target, d.Reason)
		}
		now = now.Add(spec.DecisionInterval)
	}
	d := s.Decide(now, Observation{Arrivals: 1, InFlight: 1}, st)
	if d.Target != 1 || !strings.Contains(d.Reason, "from zero") {
		t.Errorf("first request: target %d (%s), want 1 from zero", d.Target, d.Reason)
	}
}
