package launcher

import "testing"

func TestGangNodeEnvironment(t *testing.T) {
	spec := Spec{Name: "train", Envs: map[string]string{"A": "1"}, Job: &JobSpec{NodeIPs: []string{"127.0.0.2", "127.0.0.3"}}}
	s := GangNode(spec, 1, 2)
	want := map[string]string{"A": "1", EnvNodeRank: "1", EnvSetupNodeRank: "1", EnvNumNodes: "2",
		EnvNodeIPs: "127.0.0.2\n127.0.0.3", EnvSetupNodeIPs: "127.0.0.2\n127.0.0.3"}
	for k, v := range want {
		if s.Envs[k] != v {
			t.Errorf("%s = %q, want %q", k, s.Envs[k], v)
		}
	}
	if s.Name != "train-1" || s.Labels[LabelNodeRank] != "1" {
		t.Errorf("name %q rank label %q", s.Name, s.Labels[LabelNodeRank])
	}
	if _, ok := spec.Envs[EnvNodeRank]; ok {
		t.Error("GangNode changed the caller's spec")
	}
}
