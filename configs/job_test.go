package configs

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseJob(t *testing.T) {
	tests := map[string]struct {
		yaml string
		want Job
	}{
		"defaults": {"run: train\n", DefaultJob()},
		"recovery as a name, any case": {"run: train\nresources:\n  job_recovery: failover\n",
			func() Job { j := DefaultJob(); j.Recovery.Strategy = RecoveryFailover; return j }()},
		"recovery none": {"run: train\nresources:\n  job_recovery: none\n",
			func() Job { j := DefaultJob(); j.Recovery.Strategy = RecoveryNone; return j }()},
		"recovery mapping, SkyPilot's example": {
			"run: train\nresources:\n  job_recovery: {strategy: EAGER_NEXT_REGION, max_restarts_on_errors: 3, recover_on_exit_codes: [33, 34]}\n",
			func() Job {
				j := DefaultJob()
				j.Recovery = JobRecovery{Strategy: RecoveryEagerNextRegion, MaxRestartsOnErrors: 3, RecoverOnExitCodes: []int{33, 34}}
				return j
			}()},
		"one exit code as an int": {"run: train\nresources:\n  job_recovery:\n    recover_on_exit_codes: 7\n",
			func() Job { j := DefaultJob(); j.Recovery.RecoverOnExitCodes = []int{7}; return j }()},
		"job section": {"run: train\njob:\n  priority: 1200\n  preemptible: false\n  grace_period_seconds: 90\n",
			func() Job {
				j := DefaultJob()
				j.Priority, j.Preemptible, j.GracePeriodSeconds = 1200, false, 90
				return j
			}()},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task, err := Parse("job.yaml", []byte(tc.yaml), Overrides{})
			if err != nil {
				t.Fatal(err)
			}
			if task.Job == nil || task.Service != nil {
				t.Fatalf("task without service: is not a job: %+v", task)
			}
			if diff := cmp.Diff(tc.want, *task.Job); diff != "" {
				t.Errorf("job (-want +got):\n%s", diff)
			}
			// What `jobs launch --dry-run` shows parses back to the same job.
			again, out := reparse(t, task)
			if diff := cmp.Diff(task.Job, again.Job); diff != "" {
				t.Errorf("resolved YAML changed the job (-first +again):\n%s\n%s", diff, out)
			}
		})
	}
}

func TestParseJobErrors(t *testing.T) {
	tests := map[string]struct {
		yaml string
		want wantErr
	}{
		"unknown strategy": {"run: x\nresources:\n  job_recovery: eager\n",
			wantErr{3, 17, "resources.job_recovery", `unknown recovery strategy "eager"`}},
		"exit code out of range": {"run: x\nresources:\n  job_recovery:\n    recover_on_exit_codes: [1, 300]\n",
			wantErr{4, 32, "resources.job_recovery.recover_on_exit_codes[1]", "an exit code is 0–255, got 300"}},
		"recovery inside an alternative": {"run: x\nresources:\n  any_of:\n    - infra: aws\n      job_recovery: none\n",
			wantErr{5, 7, "resources.any_of[0].job_recovery", "applies to the whole job"}},
		"job section on a service": {"run: x\nservice:\n  ports: 8080\njob:\n  priority: 1\n",
			wantErr{4, 1, "job", "a service has no job section"}},
		"priority too high": {"run: x\njob:\n  priority: 20000\n",
			wantErr{3, 13, "job.priority", "must be at most 10000"}},
		"grace beyond any warning": {"run: x\njob:\n  grace_period_seconds: 600\n",
			wantErr{3, 25, "job.grace_period_seconds", "must be at most 120"}},
		"misspelt job field": {"run: x\njob:\n  preemptable: false\n",
			wantErr{3, 3, "job.preemptable", `did you mean "preemptible"`}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("job.yaml", []byte(tc.yaml), Overrides{})
			errs := Errors(err)
			if len(errs) != 1 {
				t.Fatalf("got %d errors, want 1: %v", len(errs), err)
			}
			e := errs[0]
			if e.Line != tc.want.Line || e.Col != tc.want.Col || e.Field != tc.want.Field || !strings.Contains(e.Msg, tc.want.Msg) {
				t.Errorf("got %v, want %d:%d %s: …%s…", e, tc.want.Line, tc.want.Col, tc.want.Field, tc.want.Msg)
			}
		})
	}
}
