package configs

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// elasticWorkers is the workers of SkyPilot's elastic-training example (a job group's
// DYNAMIC_NODE_SET task: 8 nodes, min 4), as a task of its own.
const elasticWorkers = `name: workers
num_nodes: 8
resources:
  infra: kubernetes
  cpus: 2
  job_recovery:
    strategy: DYNAMIC_NODE_SET
    min_nodes: 4
run: python worker.py
`

func TestElasticJobRecovery(t *testing.T) {
	tests := map[string]struct {
		yaml string
		want JobRecovery
	}{
		"SkyPilot's spelling": {elasticWorkers, JobRecovery{Strategy: RecoveryDynamicNodeSet, MinNodes: 4}},
		"min_nodes defaults to one": {"num_nodes: 4\nresources:\n  job_recovery: dynamic_node_set\nrun: x\n",
			JobRecovery{Strategy: RecoveryDynamicNodeSet, MinNodes: 1}},
		"with restarts on errors": {"num_nodes: 3\nresources:\n  job_recovery: {strategy: DYNAMIC_NODE_SET, min_nodes: 3, max_restarts_on_errors: 2}\nrun: x\n",
			JobRecovery{Strategy: RecoveryDynamicNodeSet, MinNodes: 3, MaxRestartsOnErrors: 2}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task, err := Parse("job.yaml", []byte(tc.yaml), Overrides{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, task.Job.Recovery); diff != "" {
				t.Errorf("recovery (-want +got):\n%s", diff)
			}
			if !task.Job.Recovery.Elastic() {
				t.Error("not elastic")
			}
			again, out := reparse(t, task)
			if diff := cmp.Diff(task.Job, again.Job); diff != "" {
				t.Errorf("resolved YAML changed the job (-first +again):\n%s\n%s", diff, out)
			}
		})
	}
}

func TestElasticJobRecoveryErrors(t *testing.T) {
	tests := map[string]struct {
		yaml string
		want wantErr
	}{
		"min_nodes above num_nodes": {"num_nodes: 2\nresources:\n  job_recovery: {strategy: DYNAMIC_NODE_SET, min_nodes: 3}\nrun: x\n",
			wantErr{3, 57, "resources.job_recovery.min_nodes", "min_nodes 3 is more than num_nodes 2"}},
		"min_nodes without the strategy": {"num_nodes: 2\nresources:\n  job_recovery: {strategy: FAILOVER, min_nodes: 1}\nrun: x\n",
			wantErr{3, 49, "resources.job_recovery.min_nodes", "only with strategy: DYNAMIC_NODE_SET"}},
		"min_nodes zero": {"num_nodes: 2\nresources:\n  job_recovery: {strategy: DYNAMIC_NODE_SET, min_nodes: 0}\nrun: x\n",
			wantErr{3, 57, "resources.job_recovery.min_nodes", "must be at least 1"}},
		"a misspelt strategy": {"num_nodes: 2\nresources:\n  job_recovery: DYNAMIC_NODESET\nrun: x\n",
			wantErr{3, 17, "resources.job_recovery", `(valid strategies: FAILOVER, EAGER_NEXT_REGION, DYNAMIC_NODE_SET), or none`}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("job.yaml", []byte(tc.yaml), Overrides{})
			want := []wantErr{tc.want}
			if diff := cmp.Diff(want, project(Errors(err), want)); diff != "" {
				t.Errorf("errors (-want +got):\n%s\nfull error:\n%v", diff, err)
			}
		})
	}
}
