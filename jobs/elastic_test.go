package jobs_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/launcher"
)

// elasticJob is the workers of SkyPilot's elastic-training example (DYNAMIC_NODE_SET, min
// nodes), as a task of its own: each node says its rank and gang size, rank 0 counts the gangs
// in the checkpoint directory (which outlives them), and every node runs until marker exists.
func elasticJob(n, min int, marker string) string {
	return fmt.Sprintf(`name: workers
num_nodes: %d
resources:
  job_recovery:
    strategy: DYNAMIC_NODE_SET
    min_nodes: %d
run: |
  echo "rank $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES"
  if [ "$SKYPILOT_NODE_RANK" = 0 ]; then
    n=$(cat "$FERRY_CHECKPOINT_DIR/gangs" 2>/dev/null || echo 0)
    echo $((n+1)) > "$FERRY_CHECKPOINT_DIR/gangs"
    echo "gang number $((n+1))"
  fi
  while [ ! -f %s ]; do sleep 0.05; done
`, n, min, marker)
}

// TestElasticJobShrinksAndGrows: on a machine with room for two nodes, a 4-node job with
// min_nodes 2 runs on two; given room for four, it grows back (its gang restarts at four,
// from its checkpoint); a node lost with room for three comes back on three; done, it
// succeeds on the gang it has.
func TestElasticJobShrinksAndGrows(t *testing.T) {
	e := newEnv(t)
	e.stop()
	e.tune = func(cfg *jobs.Config) { cfg.GrowInterval = 100 * time.Millisecond }
	e.start()
	e.prov.setCapacity(2)
	marker := filepath.Join(t.TempDir(), "done")
	j := e.submit(elasticJob(4, 2, marker))

	small := e.waitFor(j.ID, 30*time.Second, "runs on 2 nodes", func(j jobs.Job) bool { return j.State == jobs.Running && len(j.Nodes) == 2 })
	if small.GangSize != 2 || !strings.Contains(small.Reason, "2 of 4 node(s)") {
		t.Errorf("small gang: size %d, reason %q", small.GangSize, small.Reason)
	}
	e.waitFor(j.ID, 10*time.Second, "rank 1 runs", func(jobs.Job) bool { return strings.Contains(e.logOf(j.ID, 1), "rank 1 of 2") })

	e.prov.setCapacity(4)
	big := e.waitFor(j.ID, 30*time.Second, "grows to 4 nodes", func(j jobs.Job) bool { return j.State == jobs.Running && len(j.Nodes) == 4 })
	if big.Resizes != 1 || big.Recoveries != 0 || big.RestartsOnErrors != 0 || big.GangSize != 4 {
		t.Errorf("after growing: resizes %d recoveries %d restarts %d size %d", big.Resizes, big.Recoveries, big.RestartsOnErrors, big.GangSize)
	}
	if h := big.History[len(big.History)-1]; !h.Resize || !strings.Contains(h.Reason, "growing from 2 to 4 node(s)") || h.ResumedAt.IsZero() {
		t.Errorf("history %+v: want a resize from 2 to 4, resumed", h)
	}
	e.waitFor(j.ID, 10*time.Second, "the big gang runs", func(jobs.Job) bool {
		return strings.Contains(e.logOf(j.ID, 3), "rank 3 of 4") && strings.Contains(e.logOf(j.ID, 0), "gang number 2")
	})
	if probes := e.probes(j.ID); len(probes) != 0 {
		t.Errorf("grow placeholders still running: %v", probes)
	}

	// A node lost with room for three: recovered on three.
	e.prov.setCapacity(3)
	if err := e.prov.Terminate(context.Background(), big.Nodes[3].InstanceID); err != nil {
		t.Fatal(err)
	}
	three := e.waitFor(j.ID, 30*time.Second, "recovers on 3 nodes", func(j jobs.Job) bool {
		return j.State == jobs.Running && len(j.Nodes) == 3 && j.Recoveries == 1
	})
	if three.GangSize != 3 || !strings.Contains(three.Reason, "3 of 4 node(s)") || !strings.Contains(three.History[len(three.History)-1].Reason, "node 3") {
		t.Errorf("after the lost node: size %d reason %q history %+v", three.GangSize, three.Reason, three.History)
	}

	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	done := e.waitState(j.ID, jobs.Succeeded)
	if fmt.Sprint(done.ExitCodes) != "[0 0 0]" {
		t.Errorf("exit codes %v, want the three-node gang's", done.ExitCodes)
	}
}

// An elastic job never runs below min_nodes: with room for one node, a job of at least two
// waits for capacity, and starts on two when there is room.
func TestElasticJobWaitsBelowMinNodes(t *testing.T) {
	e := newEnv(t)
	e.prov.setCapacity(1)
	marker := filepath.Join(t.TempDir(), "done")
	j := e.submit(elasticJob(3, 2, marker))
	e.waitFor(j.ID, 30*time.Second, "waits for capacity", func(j jobs.Job) bool {
		return j.State == jobs.Pending && j.Attempt >= 2 && strings.Contains(j.Reason, "waiting for capacity")
	})
	if r := e.running(j.ID); len(r) != 0 {
		t.Fatalf("nodes running below min_nodes: %v", r)
	}
	e.prov.setCapacity(2)
	run := e.waitFor(j.ID, 30*time.Second, "runs on 2", func(j jobs.Job) bool { return j.State == jobs.Running })
	if len(run.Nodes) != 2 {
		t.Errorf("%d nodes, want 2", len(run.Nodes))
	}
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	e.waitState(j.ID, jobs.Succeeded)
}

// hiding is the env's local provider behind a listing that can be made to hide the local
// infra (a gap: launcher.PartialList), counting listings and grow placeholders launched.
type hiding struct {
	*gangs
	mu            sync.Mutex
	hidden        bool
	lists, probes int
}

func (h *hiding) ListIn(ctx context.Context, infras []string, sel map[string]string) ([]launcher.Instance, error) {
	return h.List(ctx, sel)
}

func (h *hiding) List(ctx context.Context, sel map[string]string) ([]launcher.Instance, error) {
	h.mu.Lock()
	h.lists++
	hidden := h.hidden
	h.mu.Unlock()
	if hidden {
		return nil, launcher.PartialList([]launcher.Gap{{Infra: "local", Err: fmt.Errorf("local: %w", launcher.ErrUnavailable)}})
	}
	return h.gangs.List(ctx, sel)
}

func (h *hiding) LaunchGang(ctx context.Context, spec launcher.Spec, n int) ([]launcher.Instance, error) {
	if strings.HasPrefix(spec.Labels[launcher.LabelAttempt], "grow-") {
		h.mu.Lock()
		h.probes++
		h.mu.Unlock()
	}
	return h.gangs.LaunchGang(ctx, spec, n)
}

func (h *hiding) set(hidden bool) {
	h.mu.Lock()
	h.hidden = hidden
	h.mu.Unlock()
}

func (h *hiding) counts() (lists, probes int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lists, h.probes
}

// Issue 32's rule holds for an elastic job: while a gap hides its nodes, its gang is unknown,
// not lost and not asked to grow however much room there is; once its infra answers, it grows.
func TestElasticJobDoesNotGrowWhileHidden(t *testing.T) {
	e := newEnv(t)
	h := &hiding{gangs: e.prov}
	e.stop()
	e.provider = h
	e.tune = func(cfg *jobs.Config) { cfg.GrowInterval = time.Millisecond }
	e.start()
	e.prov.setCapacity(2)
	marker := filepath.Join(t.TempDir(), "done")
	j := e.submit(elasticJob(4, 2, marker))
	e.waitFor(j.ID, 30*time.Second, "runs on 2", func(j jobs.Job) bool { return j.State == jobs.Running && len(j.Nodes) == 2 })

	h.set(true)
	e.waitFor(j.ID, 10*time.Second, "says its nodes are unknown", func(j jobs.Job) bool { return strings.Contains(j.Reason, "not answering since") })
	e.prov.setCapacity(4)
	lists, probes := h.counts()
	e.waitFor(j.ID, 10*time.Second, "looked five more times", func(jobs.Job) bool { l, _ := h.counts(); return l >= lists+5 })
	cur, _ := e.m.Get(j.ID)
	if _, now := h.counts(); now != probes || cur.State != jobs.Running || len(cur.Nodes) != 2 || cur.Resizes != 0 {
		t.Fatalf("while hidden: %d placeholder launches (before %d), %s with %d nodes, %d resizes; want none, RUNNING on 2",
			now, probes, cur.State, len(cur.Nodes), cur.Resizes)
	}

	h.set(false)
	big := e.waitFor(j.ID, 30*time.Second, "grows once seen", func(j jobs.Job) bool { return j.State == jobs.Running && len(j.Nodes) == 4 })
	if big.Resizes != 1 || big.Recoveries != 0 {
		t.Errorf("resizes %d recoveries %d: want one resize, no recovery (a gap loses nothing)", big.Resizes, big.Recoveries)
	}
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	e.waitState(j.ID, jobs.Succeeded)
}

// probes lists job id's grow placeholders still running.
func (e *env) probes(id int64) []launcher.Instance {
	var out []launcher.Instance
	for _, in := range e.running(id) {
		if strings.HasPrefix(in.Labels[launcher.LabelAttempt], "grow-") {
			out = append(out, in)
		}
	}
	return out
}

// A controller restarted while an elastic job runs below num_nodes adopts its smaller gang as
// it is (not as half a gang), stops a grow placeholder it left (a node of no attempt), and the
// job grows once there is room.
func TestElasticJobAdoptedAfterRestart(t *testing.T) {
	e := newEnv(t)
	e.stop()
	e.tune = func(cfg *jobs.Config) { cfg.GrowInterval = 100 * time.Millisecond }
	e.start()
	e.prov.setCapacity(2)
	marker := filepath.Join(t.TempDir(), "done")
	j := e.submit(elasticJob(4, 2, marker))
	run := e.waitFor(j.ID, 30*time.Second, "runs on 2", func(j jobs.Job) bool { return j.State == jobs.Running && len(j.Nodes) == 2 })

	e.stop() // the controller dies; a placeholder it was starting is left running
	id := strconv.FormatInt(j.ID, 10)
	e.prov.setCapacity(0)
	if _, err := launcher.LaunchGang(context.Background(), e.prov.Provider, launcher.Spec{Name: "workers-" + id + "-grow-x",
		Labels: map[string]string{launcher.LabelOwner: "true", launcher.LabelJob: id, launcher.LabelAttempt: "grow-" + strconv.Itoa(run.Attempt)},
		Run:    "while :; do sleep 3600; done", Job: &launcher.JobSpec{}}, 2); err != nil {
		t.Fatal(err)
	}
	e.prov.setCapacity(2)
	e.start()
	e.waitFor(j.ID, 10*time.Second, "its placeholder stopped", func(jobs.Job) bool { return len(e.probes(j.ID)) == 0 })
	cur, _ := e.m.Get(j.ID)
	if cur.State != jobs.Running || cur.Attempt != run.Attempt || len(cur.Nodes) != 2 {
		t.Fatalf("after the restart: %s attempt %d (was %d) with %d nodes; want its 2-node gang adopted", cur.State, cur.Attempt, run.Attempt, len(cur.Nodes))
	}
	e.prov.setCapacity(4)
	e.waitFor(j.ID, 30*time.Second, "grows to 4", func(j jobs.Job) bool { return j.State == jobs.Running && len(j.Nodes) == 4 })
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	e.waitState(j.ID, jobs.Succeeded)
}
