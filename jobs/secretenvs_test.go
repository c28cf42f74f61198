package jobs_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/launcher"
)

// recording is the env's local provider, keeping the specs of the gangs it launches.
type recording struct {
	*gangs
	mu    sync.Mutex
	specs []launcher.Spec
}

func (r *recording) LaunchGang(ctx context.Context, spec launcher.Spec, n int) ([]launcher.Instance, error) {
	r.mu.Lock()
	r.specs = append(r.specs, spec)
	r.mu.Unlock()
	return r.gangs.LaunchGang(ctx, spec, n)
}

// TestJobCredentialEnvsAreSecretEnvs: a job's env named like a credential is one of its nodes'
// secret envs (a Kubernetes node gets it from its Secret), and still reaches the program: the
// job succeeds only if its real process sees the value.
func TestJobCredentialEnvsAreSecretEnvs(t *testing.T) {
	e := newEnv(t)
	rec := &recording{gangs: e.prov}
	e.stop()
	e.provider = rec
	e.start()
	j := e.submit(`name: creds
envs:
  HF_TOKEN: hf_job_env_token_7
  MODEL: m
secrets:
  WANDB_API_KEY: wandb-job-secret
run: test "$HF_TOKEN" = hf_job_env_token_7 && test "$WANDB_API_KEY" = wandb-job-secret && test "$MODEL" = m
`)
	e.waitFor(j.ID, time.Minute, "succeeds", func(j jobs.Job) bool { return j.State.Terminal() })
	if got, _ := e.m.Get(j.ID); got.State != jobs.Succeeded {
		t.Fatalf("job %s (%s): the program did not see its envs", got.State, got.Reason)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.specs) == 0 {
		t.Fatal("no gang was launched")
	}
	if got := rec.specs[0].SecretEnvs; !slices.Equal(got, []string{"HF_TOKEN", "WANDB_API_KEY"}) {
		t.Errorf("SecretEnvs %v, want [HF_TOKEN WANDB_API_KEY]", got)
	}
}
