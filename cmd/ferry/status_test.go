package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/replicas"
)

func TestPrintStatusCostZonesAndKinds(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	st := api.ServiceStatus{Name: "chat", Version: 1, CreatedAt: now.Add(-time.Hour), Status: "READY", ReadyReplicas: 2, TargetReplicas: 2,
		Replicas: []replicas.Record{
			{ID: 1, Status: replicas.StatusReady, InstanceID: "aws/us-east-1/i-1", Infra: "aws", Zone: "use1-az4", Spot: true, Price: 0.4265},
			{ID: 2, Status: replicas.StatusReady, InstanceID: "gcp/us-central1-a/chat-2", Infra: "gcp", Zone: "us-central1-a", Price: 1.2},
			{ID: 3, Status: replicas.StatusPreempted, InstanceID: "aws/us-east-1/i-3", Infra: "aws", Spot: true, Price: 0.43},
			{ID: 4, Status: replicas.StatusProvisioning, Infra: "", Price: 0},
		}}
	if got := serviceCost(st.Replicas); got != 0.4265+1.2 {
		t.Errorf("serviceCost = %v, want the two live instances' prices", got)
	}
	var b bytes.Buffer
	printStatus(&b, []api.ServiceStatus{st}, false, now)
	out := b.String()
	for _, want := range []string{"COST ($/hr)", "1.63", "use1-az4", "spot", "on-demand", "0.43", "1.20"} {
		if !strings.Contains(out, want) {
			t.Errorf("status -v lacks %q:\n%s", want, out)
		}
	}
}
