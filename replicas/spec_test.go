package replicas

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// TestReplicaSpecCarriesTaskLabelsAndInstanceType: resources.labels reach the launcher beside
// Ferry's own labels (which win), and instance_type reaches it as Spec.InstanceType.
func TestReplicaSpecCarriesTaskLabelsAndInstanceType(t *testing.T) {
	task, err := configs.Parse("t.yaml", []byte(`run: serve
resources:
  infra: aws
  instance_type: g5.xlarge
  labels: {team: inference, app.example.com/tier: gold}
service:
  ports: 8000
`), configs.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	spec := replicaSpec("chat", 3, task, 7, false)
	want := map[string]string{
		"team": "inference", "app.example.com/tier": "gold",
		launcher.LabelOwner: "true", launcher.LabelService: "chat", launcher.LabelVersion: "3",
		launcher.LabelReplicaID: "7", LabelKind: kindOnDemand,
	}
	if diff := cmp.Diff(want, spec.Labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	if spec.InstanceType != "g5.xlarge" {
		t.Errorf("InstanceType %q", spec.InstanceType)
	}
	if task.Resources.Labels[launcher.LabelService] != "" {
		t.Error("the task's labels were changed")
	}
}
