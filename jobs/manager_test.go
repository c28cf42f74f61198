package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/local"
)

// gangs is the real local provider with LaunchGang, as the provisioner gives it: PrepareGang
// (a loopback address per node) then LaunchEach. capacity, when above zero, bounds the nodes
// running at once, refusing more with ErrNoCapacity as a full cluster would.
type gangs struct {
	*local.Provider
	mu       sync.Mutex
	capacity int
}

func (g *gangs) LaunchGang(ctx context.Context, spec launcher.Spec, n int) ([]launcher.Instance, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.capacity > 0 {
		running, err := g.List(ctx, map[string]string{launcher.LabelOwner: "true"})
		if err != nil {
			return nil, err
		}
		busy := 0
		for _, in := range running {
			if in.State == launcher.StateRunning {
				busy++
			}
		}
		if busy+n > g.capacity {
			return nil, fmt.Errorf("%w: %d of %d nodes busy", launcher.ErrNoCapacity, busy, g.capacity)
		}
	}
	return launcher.LaunchGang(ctx, g.Provider, spec, n)
}

func (g *gangs) setCapacity(n int) {
	g.mu.Lock()
	g.capacity = n
	g.mu.Unlock()
}

// env is one manager over a real local provider and a real SQLite store, in a temp home.
type env struct {
	t     *testing.T
	home  string
	prov  *gangs
	store *store.SQLite
	m     *jobs.Manager
	stop  func()
	// provider, when set, is what the manager runs on instead of prov; tune adjusts its
	// config.
	provider jobs.Provider
	tune     func(*jobs.Config)
}

func newEnv(t *testing.T) *env {
	t.Helper()
	home := t.TempDir()
	p, err := local.New(local.Options{Dir: filepath.Join(home, "local"), WorkRoot: t.TempDir(), StopGrace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.OpenSQLite(filepath.Join(home, "ferry.db"))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, home: home, prov: &gangs{Provider: p}, store: st}
	e.start()
	t.Cleanup(func() {
		e.stop()
		// Nothing a test launched may outlive it.
		insts, _ := p.List(context.Background(), map[string]string{launcher.LabelOwner: "true"})
		for _, in := range insts {
			_ = p.Terminate(context.Background(), in.ID)
		}
		st.Close()
	})
	return e
}

// start runs a manager (a controller process) over the env's store and nodes.
func (e *env) start() {
	cfg := jobs.Config{Provider: e.prov, Store: e.store, Dir: filepath.Join(e.home, "jobs"),
		WatchInterval: 50 * time.Millisecond, RetryInterval: 200 * time.Millisecond}
	if e.provider != nil {
		cfg.Provider = e.provider
	}
	if e.tune != nil {
		e.tune(&cfg)
	}
	m, err := jobs.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Start(ctx); err != nil {
		e.t.Fatal(err)
	}
	e.m = m
	e.stop = func() { cancel(); m.Stop() }
}

// submit parses yaml as a job and submits it.
func (e *env) submit(yaml string) jobs.Job {
	e.t.Helper()
	task, err := configs.Parse("job.yaml", []byte(yaml), configs.Overrides{})
	if err != nil {
		e.t.Fatal(err)
	}
	j, err := e.m.Submit(task)
	if err != nil {
		e.t.Fatal(err)
	}
	return j
}

// waitFor polls job id until cond holds, failing after d.
func (e *env) waitFor(id int64, d time.Duration, what string, cond func(jobs.Job) bool) jobs.Job {
	e.t.Helper()
	deadline := time.Now().Add(d)
	for {
		j, err := e.m.Get(id)
		if err != nil {
			e.t.Fatal(err)
		}
		if cond(j) {
			return j
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("job %d never %s: %s (%s) %+v", id, what, j.State, j.Reason, j)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) waitState(id int64, s jobs.State) jobs.Job {
	e.t.Helper()
	// A terminal state is saved before the nodes are stopped: wait for both.
	return e.waitFor(id, 30*time.Second, "reached "+string(s), func(j jobs.Job) bool {
		return j.State == s && (!s.Terminal() || len(j.Nodes) == 0)
	})
}

// ckpt is job id's checkpoint directory on local.
func (e *env) ckpt(id int64) string {
	return filepath.Join(e.home, "local", "checkpoints", launcher.CheckpointClaim(strconv.FormatInt(id, 10)))
}

// running lists the job's nodes still running.
func (e *env) running(id int64) []launcher.Instance {
	insts, err := e.prov.List(context.Background(), map[string]string{launcher.LabelJob: strconv.FormatInt(id, 10)})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []launcher.Instance
	for _, in := range insts {
		if in.State == launcher.StateRunning {
			out = append(out, in)
		}
	}
	return out
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return string(b)
}

// logOf is node rank's whole output, as `ferry jobs logs` shows it.
func (e *env) logOf(id int64, rank int) string {
	e.t.Helper()
	var b strings.Builder
	if err := e.m.Logs(context.Background(), strconv.FormatInt(id, 10), rank, false, &b); err != nil {
		e.t.Fatalf("logs of job %d node %d: %v", id, rank, err)
	}
	return b.String()
}

func TestGangSucceedsWithSkyPilotEnvironment(t *testing.T) {
	e := newEnv(t)
	j := e.submit(`name: env
num_nodes: 2
resources:
  accelerators: A100:0.5
setup: echo "setup rank=$SKYPILOT_SETUP_NODE_RANK ips=$(echo "$SKYPILOT_SETUP_NODE_IPS" | paste -sd,)"
run: |
  echo "rank=$SKYPILOT_NODE_RANK num=$SKYPILOT_NUM_NODES gpus=$SKYPILOT_NUM_GPUS_PER_NODE"
  echo "task=$SKYPILOT_TASK_ID"
  echo "host=$FERRY_HOST ips=$(echo "$SKYPILOT_NODE_IPS" | paste -sd,)"
  test -d "$FERRY_CHECKPOINT_DIR" && echo "checkpoint dir ok"
`)
	done := e.waitState(j.ID, jobs.Succeeded)
	if len(done.ExitCodes) != 2 || done.ExitCodes[0] != 0 || done.ExitCodes[1] != 0 || len(done.Nodes) != 0 {
		t.Errorf("exit codes %v, nodes %v: want [0 0] and none left", done.ExitCodes, done.Nodes)
	}
	if done.StartedAt.IsZero() || done.EndedAt.IsZero() || done.Ran <= 0 || done.Attempt != 1 {
		t.Errorf("started %v ended %v ran %v attempt %d", done.StartedAt, done.EndedAt, done.Ran, done.Attempt)
	}
	if !strings.HasPrefix(done.TaskID, "sky-managed-") || !strings.HasSuffix(done.TaskID, "_env_"+strconv.FormatInt(j.ID, 10)+"-0") {
		t.Errorf("task id %q", done.TaskID)
	}
	var ips string
	for rank := range 2 {
		out := e.logOf(j.ID, rank)
		for _, want := range []string{
			fmt.Sprintf("setup rank=%d ips=127.", rank),
			fmt.Sprintf("rank=%d num=2 gpus=1", rank),
			"task=" + done.TaskID,
			"checkpoint dir ok",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("node %d output lacks %q:\n%s", rank, want, out)
			}
		}
		host, list, _ := strings.Cut(out[strings.Index(out, "host=")+5:], " ips=")
		list, _, _ = strings.Cut(list, "\n")
		parts := strings.Split(list, ",")
		if len(parts) != 2 || parts[rank] != host || parts[0] == parts[1] {
			t.Errorf("node %d: host %s, SKYPILOT_NODE_IPS %v: want two addresses, its own at its rank", rank, host, parts)
		}
		if ips != "" && list != ips {
			t.Errorf("nodes disagree on SKYPILOT_NODE_IPS: %s vs %s", ips, list)
		}
		ips = list
	}
	if _, err := os.Stat(e.ckpt(j.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("checkpoint of a finished job kept: %v", err)
	}
}

// One failing node fails the job and stops the others, which report no exit status.
func TestFailingNodeStopsTheGang(t *testing.T) {
	e := newEnv(t)
	j := e.submit("num_nodes: 2\nrun: |\n  if [ $SKYPILOT_NODE_RANK = 1 ]; then exit 3; fi\n  exec sleep 600\n")
	done := e.waitState(j.ID, jobs.Failed)
	if fmt.Sprint(done.ExitCodes) != "[-1 3]" || !strings.Contains(done.Reason, "node 1 exited with status 3") {
		t.Errorf("exit codes %v, reason %q", done.ExitCodes, done.Reason)
	}
	if left := e.running(j.ID); len(left) != 0 {
		t.Errorf("nodes still running after the job failed: %v", left)
	}
}

func TestSetupFailureIsFailedSetup(t *testing.T) {
	e := newEnv(t)
	j := e.submit("setup: |\n  echo installing\n  exit 9\nrun: echo never\n")
	done := e.waitState(j.ID, jobs.FailedSetup)
	if !strings.Contains(e.logOf(j.ID, 0), "ferry: setup failed with exit status 9") {
		t.Errorf("log lacks the setup's own status:\n%s", e.logOf(j.ID, 0))
	}
	if done.ExitCodes[0] != launcher.ExitSetupFailed {
		t.Errorf("exit codes %v", done.ExitCodes)
	}
}

// max_restarts_on_errors restarts a failing program, which resumes from its checkpoint; exit
// codes in recover_on_exit_codes restart without counting.
func TestRestartsOnErrorsResumeFromCheckpoint(t *testing.T) {
	e := newEnv(t)
	j := e.submit(`resources:
  job_recovery:
    max_restarts_on_errors: 2
    recover_on_exit_codes: [33]
run: |
  n=$(cat "$FERRY_CHECKPOINT_DIR/step" 2>/dev/null || echo 0)
  n=$((n+1)); echo $n > "$FERRY_CHECKPOINT_DIR/step"
  echo "step $n"
  case $n in 1) exit 33;; 2|3) exit 1;; esac
  echo "finished at step $n"
`)
	done := e.waitState(j.ID, jobs.Succeeded)
	if done.RestartsOnErrors != 2 || done.Recoveries != 1 || done.Attempt != 4 || len(done.History) != 3 {
		t.Errorf("restarts %d recoveries %d attempt %d history %+v: want 2, 1, 4, three entries",
			done.RestartsOnErrors, done.Recoveries, done.Attempt, done.History)
	}
	if out := e.logOf(j.ID, 0); !strings.Contains(out, "finished at step 4") {
		t.Errorf("last attempt's log: %q", out)
	}
	for _, h := range done.History {
		if h.ResumedAt.IsZero() || h.Lost <= 0 {
			t.Errorf("recovery without its lost time: %+v", h)
		}
	}

	// Out of restarts: FAILED with the program's status.
	j = e.submit("resources:\n  job_recovery: {max_restarts_on_errors: 1}\nrun: exit 5\n")
	done = e.waitState(j.ID, jobs.Failed)
	if done.RestartsOnErrors != 1 || done.ExitCodes[0] != 5 {
		t.Errorf("restarts %d exit codes %v", done.RestartsOnErrors, done.ExitCodes)
	}
}

// A node killed from outside (a lost machine) recovers the whole gang, which resumes from the
// checkpoint; the lost time is reported.
func TestLostNodeRecoversFromCheckpoint(t *testing.T) {
	e := newEnv(t)
	j := e.submit(`num_nodes: 2
run: |
  [ $SKYPILOT_NODE_RANK = 0 ] || exec sleep 600
  n=$(cat "$FERRY_CHECKPOINT_DIR/epoch" 2>/dev/null || echo 0)
  while [ $n -lt 40 ]; do n=$((n+1)); echo $n > "$FERRY_CHECKPOINT_DIR/epoch"; sleep 0.05; done
  echo "resumed from $(cat "$FERRY_CHECKPOINT_DIR/first" 2>/dev/null || echo none)"
  [ -f "$FERRY_CHECKPOINT_DIR/first" ] || echo $n > "$FERRY_CHECKPOINT_DIR/first"
  exec sleep 600
`)
	e.waitFor(j.ID, 30*time.Second, "ran a while", func(j jobs.Job) bool { return j.State == jobs.Running })
	time.Sleep(500 * time.Millisecond)
	// Kill rank 1's process group, as a machine lost would.
	killRank(t, e, j.ID, 1)
	rec := e.waitFor(j.ID, 30*time.Second, "recovered", func(j jobs.Job) bool {
		return j.State == jobs.Running && j.Attempt == 2
	})
	if rec.Recoveries != 1 || len(rec.History) != 1 || !strings.Contains(rec.History[0].Reason, "node 1 stopped without exiting") || rec.History[0].Lost <= 0 {
		t.Fatalf("recovery not recorded: %+v", rec.History)
	}
	if rec.RestartsOnErrors != 0 {
		t.Errorf("a lost node counted as an error restart")
	}
	if _, err := e.m.Cancel(j.ID); err != nil {
		t.Fatal(err)
	}
	e.waitState(j.ID, jobs.Cancelled)
}

func killRank(t *testing.T, e *env, id int64, rank int) {
	t.Helper()
	for _, in := range e.running(id) {
		if in.Labels[launcher.LabelNodeRank] == strconv.Itoa(rank) {
			meta := read(t, filepath.Join(e.home, "local", in.ID, "instance.json"))
			i := strings.Index(meta, `"pgid": `)
			pgid, _ := strconv.Atoi(strings.TrimRight(strings.Fields(meta[i+8:])[0], ","))
			if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("job %d has no running node %d", id, rank)
}

// A job with no capacity waits PENDING with the reason; jobs start in priority, then
// submission order as capacity frees.
func TestQueueWaitsAndStartsInPriorityOrder(t *testing.T) {
	e := newEnv(t)
	e.prov.setCapacity(1)
	hold := e.submit("name: hold\nrun: exec sleep 600\n")
	e.waitState(hold.ID, jobs.Running)
	low := e.submit("name: low\njob: {priority: 100}\nrun: exec sleep 600\n")
	mid := e.submit("name: mid\nrun: exec sleep 600\n")
	high := e.submit("name: high\njob: {priority: 900}\nrun: exec sleep 600\n")
	for _, j := range []jobs.Job{low, mid, high} {
		w := e.waitFor(j.ID, 10*time.Second, "said why it waits", func(j jobs.Job) bool {
			return j.State == jobs.Pending && strings.Contains(j.Reason, "no capacity")
		})
		if w.Attempt == 0 {
			t.Errorf("%s never tried", w.Name)
		}
	}
	order := []jobs.Job{hold, high, mid, low}
	for i := 1; i < len(order); i++ {
		if _, err := e.m.Cancel(order[i-1].ID); err != nil {
			t.Fatal(err)
		}
		e.waitState(order[i].ID, jobs.Running)
		for _, other := range order[i+1:] {
			if cur, _ := e.m.Get(other.ID); cur.State != jobs.Pending {
				t.Fatalf("%s is %s while %s took the capacity first", other.Name, cur.State, order[i].Name)
			}
		}
	}
}

// freesDuringTry frees capacity while the first try of the job named first is failing for the
// lack of it: it cancels job hold and waits until hold's node is gone. The queue's pass then
// reaches the next job down after capacity was freed. tail keeps Terminate from returning for
// that long after the node is gone (a VM's disk, a pod's finalizer), so that the stop is still
// under way when the pass goes on.
type freesDuringTry struct {
	*gangs
	e     *env
	first string
	hold  int64
	tail  time.Duration
	once  sync.Once
}

func (f *freesDuringTry) LaunchGang(ctx context.Context, spec launcher.Spec, n int) ([]launcher.Instance, error) {
	insts, err := f.gangs.LaunchGang(ctx, spec, n)
	if err != nil && strings.HasPrefix(spec.Name, f.first+"-") {
		f.once.Do(func() {
			if _, err := f.e.m.Cancel(f.hold); err != nil {
				f.e.t.Error(err)
			}
			for deadline := time.Now().Add(10 * time.Second); len(f.e.running(f.hold)) > 0; {
				if time.Now().After(deadline) {
					f.e.t.Error("the cancelled job's node never went")
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	return insts, err
}

func (f *freesDuringTry) Terminate(ctx context.Context, id string) error {
	err := f.gangs.Terminate(ctx, id)
	time.Sleep(f.tail)
	return err
}

// Capacity freed in the middle of the queue's pass goes to the job the pass passed over for
// want of it, not to the next one down in priority: whether the stop that freed it has returned
// by then or is still under way.
func TestQueueCapacityFreedMidPassGoesToTheHigherJob(t *testing.T) {
	for _, tail := range []time.Duration{0, 300 * time.Millisecond} {
		t.Run(fmt.Sprintf("tail=%v", tail), func(t *testing.T) {
			e := newEnv(t)
			e.prov.setCapacity(1)
			hold := e.submit("name: hold\nrun: exec sleep 600\n")
			e.waitState(hold.ID, jobs.Running)
			f := &freesDuringTry{gangs: e.prov, e: e, first: "high", hold: hold.ID, tail: tail}
			e.stop()
			e.provider = f
			e.start()
			low := e.submit("name: low\njob: {priority: 100}\nrun: exec sleep 600\n")
			e.waitFor(low.ID, 10*time.Second, "found no capacity", func(j jobs.Job) bool {
				return j.State == jobs.Pending && strings.Contains(j.Reason, "no capacity")
			})
			// Every pass from here tries high, then low.
			high := e.submit("name: high\njob: {priority: 900}\nrun: exec sleep 600\n")
			e.waitState(high.ID, jobs.Running)
			if cur, _ := e.m.Get(low.ID); cur.State != jobs.Pending {
				t.Errorf("low is %s: it took the capacity high was passed over for", cur.State)
			}
		})
	}
}

// Cancel works in every state: waiting, running, and ended (an error).
func TestCancel(t *testing.T) {
	e := newEnv(t)
	e.prov.setCapacity(1)
	run := e.submit("run: exec sleep 600\n")
	e.waitState(run.ID, jobs.Running)
	wait := e.submit("run: exec sleep 600\n")
	e.waitFor(wait.ID, 10*time.Second, "waited", func(j jobs.Job) bool { return j.Attempt > 0 && j.State == jobs.Pending })
	// A pending job is tried again and again: caught between tries it is CANCELLED at once,
	// caught during one (its launch under way) CANCELLING until the launch stops.
	if j, err := e.m.Cancel(wait.ID); err != nil || (j.State != jobs.Cancelled && j.State != jobs.Cancelling) {
		t.Errorf("cancel a pending job: %s %v", j.State, err)
	}
	e.waitState(wait.ID, jobs.Cancelled)
	if _, err := e.m.Cancel(run.ID); err != nil {
		t.Fatal(err)
	}
	e.waitState(run.ID, jobs.Cancelled)
	if left := e.running(run.ID); len(left) != 0 {
		t.Errorf("cancelled job still runs %v", left)
	}
	if _, err := e.m.Cancel(run.ID); !errors.Is(err, jobs.ErrEnded) {
		t.Errorf("cancel an ended job: %v", err)
	}
	if _, err := e.m.Cancel(999); !errors.Is(err, jobs.ErrNotFound) {
		t.Errorf("cancel an unknown job: %v", err)
	}
}

// A controller that stops (kill -9 leaves the same state) while a job runs: the next one
// adopts the running gang, which runs once and finishes.
func TestRestartAdoptsRunningGang(t *testing.T) {
	e := newEnv(t)
	marker := filepath.Join(t.TempDir(), "go")
	j := e.submit(fmt.Sprintf(`num_nodes: 2
run: |
  echo start >> "$FERRY_CHECKPOINT_DIR/starts-$SKYPILOT_NODE_RANK"
  while [ ! -f %s ]; do sleep 0.05; done
  cat "$FERRY_CHECKPOINT_DIR/starts-$SKYPILOT_NODE_RANK" | wc -l
`, marker))
	e.waitState(j.ID, jobs.Running)
	time.Sleep(200 * time.Millisecond)
	e.stop() // the controller goes; its nodes stay
	if got := len(e.running(j.ID)); got != 2 {
		t.Fatalf("%d nodes running while no controller is: want 2", got)
	}
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the nodes finish while no controller watches
	e.start()
	done := e.waitState(j.ID, jobs.Succeeded)
	if done.Attempt != 1 {
		t.Errorf("relaunched after the restart: attempt %d", done.Attempt)
	}
	for rank := range 2 {
		if out := strings.TrimSpace(e.logOf(j.ID, rank)); out != "1" {
			t.Errorf("node %d started %s times, want 1", rank, out)
		}
	}
}

// A controller killed in the middle of a launch left half a gang: the next one stops it and
// launches the whole gang again; the half gang's node never runs beside the new one.
func TestRestartMidLaunchRelaunches(t *testing.T) {
	e := newEnv(t)
	e.stop()
	task, err := configs.Parse("job.yaml", []byte("num_nodes: 2\nrun: exec sleep 600\n"), configs.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	// What the dead controller left: the job STARTING at attempt 1, and rank 0 of it.
	now := time.Now()
	id, err := e.store.CreateJob(jobs.Job{Name: "half", Task: task, State: jobs.Starting, Attempt: 1, SubmittedAt: now, StateSince: now, Priority: 500})
	if err != nil {
		t.Fatal(err)
	}
	spec := launcher.Spec{Name: "half-orphan", Run: "exec sleep 600", Job: &launcher.JobSpec{},
		Labels: map[string]string{launcher.LabelOwner: "true", launcher.LabelJob: strconv.FormatInt(id, 10), launcher.LabelAttempt: "1", launcher.LabelNodeRank: "0"}}
	orphan, err := e.prov.Launch(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	e.start()
	j := e.waitFor(id, 30*time.Second, "relaunched", func(j jobs.Job) bool { return j.State == jobs.Running && j.Attempt == 2 })
	for _, in := range e.running(id) {
		if in.ID == orphan.ID || in.Labels[launcher.LabelAttempt] != "2" {
			t.Errorf("node %s of attempt %s runs beside the new gang", in.ID, in.Labels[launcher.LabelAttempt])
		}
	}
	if len(j.Nodes) != 2 {
		t.Errorf("nodes %v", j.Nodes)
	}
}

// A node warned of its preemption takes its peers down with it (their rendezvous breaks): their
// failure is the preemption's, recovered without counting against max_restarts_on_errors.
func TestFailureBesideAWarnedNodeRecovers(t *testing.T) {
	e := newEnv(t)
	trigger := filepath.Join(t.TempDir(), "go")
	j := e.submit(fmt.Sprintf("num_nodes: 2\nrun: |\n  if [ $SKYPILOT_NODE_RANK = 0 ] && [ ! -f %s.done ]; then\n    while [ ! -f %s ]; do sleep 0.05; done; touch %s.done; exit 1\n  fi\n  [ $SKYPILOT_NODE_RANK = 0 ] || exec sleep 600\n", trigger, trigger, trigger))
	run := e.waitState(j.ID, jobs.Running)
	if !e.m.Notice(launcher.Notice{InstanceID: run.Nodes[1].InstanceID, At: time.Now().Add(2 * time.Minute)}) {
		t.Fatal("the notice was not taken for a job's node")
	}
	if e.m.Notice(launcher.Notice{InstanceID: "local-someone-else", At: time.Now()}) {
		t.Error("a notice for no job's node was taken")
	}
	if err := os.WriteFile(trigger, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	rec := e.waitFor(j.ID, 30*time.Second, "recovered", func(j jobs.Job) bool { return j.Attempt == 2 && j.State == jobs.Running })
	if rec.Recoveries != 1 || rec.RestartsOnErrors != 0 || !strings.Contains(rec.History[0].Reason, "warned of its preemption") {
		t.Errorf("recoveries %d restarts %d history %+v", rec.Recoveries, rec.RestartsOnErrors, rec.History)
	}
}

// goneLogs is a provider whose nodes' logs are gone (a pod deleted as its job ended) while the
// job may still list them.
type goneLogs struct{ *gangs }

func (goneLogs) LogPath(id string) (string, error) {
	return "", fmt.Errorf("%w: no local log for %s", launcher.ErrNotFound, id)
}

func (goneLogs) StreamLogs(_ context.Context, id string, _ launcher.LogOptions, _ io.Writer) error {
	return fmt.Errorf("%w: pod %s not found", launcher.ErrNotFound, id)
}

// TestLogsOfAGoneNodeComeFromItsArchive: `jobs logs --node N` for a node the job still lists
// but whose log its infra no longer has (the pod deleted right as the job ended) prints the log
// archived before the node was stopped, not "pod not found".
func TestLogsOfAGoneNodeComeFromItsArchive(t *testing.T) {
	e := newEnv(t)
	e.provider = goneLogs{e.prov}
	e.stop()
	e.start()
	j := e.submit("name: gone\nrun: exec sleep 600\n")
	j = e.waitState(j.ID, jobs.Running)
	archive := e.m.LogFile(j.ID, j.Attempt, 0)
	if err := os.MkdirAll(filepath.Dir(archive), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(archive, []byte("the node's last words\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := e.logOf(j.ID, 0); got != "the node's last words\n" {
		t.Errorf("logs of a gone node: %q, want its archive", got)
	}
}

// TestArchiveKeepsWhatANodePrintsAfterSIGTERM: a cancelled node's checkpoint message, printed
// after its SIGTERM, is in the log `jobs logs` shows once the job has ended (before, the log
// was archived before the node was stopped).
func TestArchiveKeepsWhatANodePrintsAfterSIGTERM(t *testing.T) {
	e := newEnv(t)
	j := e.submit(`name: lastwords
run: |
  trap 'echo "checkpoint saved at step 7"; exit 0' TERM
  echo started
  while true; do sleep 0.05; done
`)
	e.waitFor(j.ID, 10*time.Second, "printed its first line", func(j jobs.Job) bool {
		return j.State == jobs.Running && strings.Contains(e.logOf(j.ID, 0), "started")
	})
	if _, err := e.m.Cancel(j.ID); err != nil {
		t.Fatal(err)
	}
	e.waitState(j.ID, jobs.Cancelled)
	if got := e.logOf(j.ID, 0); !strings.Contains(got, "checkpoint saved at step 7") {
		t.Errorf("the ended job's log %q lacks what the node printed after SIGTERM", got)
	}
}

// polledLogs serves a node's log as a VM's console does: read again every two seconds, never
// pushed, with no file Ferry may follow.
type polledLogs struct{ *gangs }

func (polledLogs) LogPath(id string) (string, error) {
	return "", fmt.Errorf("%w: no local log for %s", launcher.ErrNotFound, id)
}

func (p polledLogs) StreamLogs(ctx context.Context, id string, opts launcher.LogOptions, w io.Writer) error {
	path, err := p.gangs.LogPath(id)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	opts.NotifyOpened()
	for {
		if _, err := io.Copy(w, f); err != nil || !opts.Follow {
			return err
		}
		insts, err := p.List(ctx, map[string]string{})
		if err != nil {
			return err
		}
		running := slices.ContainsFunc(insts, func(in launcher.Instance) bool { return in.ID == id && in.State == launcher.StateRunning })
		if !running {
			_, err := io.Copy(w, f)
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(2 * time.Second):
		}
	}
}

// TestFollowedPolledLogKeepsTheLastLines: following node 0 of a job on an infra whose log is
// polled (a VM's console), what the node printed last, after the stream's last poll, still
// reaches the follower (`jobs launch` streaming), from the node's archive.
func TestFollowedPolledLogKeepsTheLastLines(t *testing.T) {
	e := newEnv(t)
	e.provider = polledLogs{e.prov}
	e.stop()
	e.start()
	j := e.submit("name: polled\nrun: |\n  echo first\n  sleep 0.3\n  echo last words\n")
	var out strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.m.Logs(ctx, strconv.FormatInt(j.ID, 10), 0, true, &out); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); !strings.Contains(got, "first") || !strings.Contains(got, "last words") || strings.Count(got, "first") != 1 {
		t.Errorf("followed log %q: want first and last words, each once", got)
	}
}

// droppingLogs is an infra that drops a node's output with the node (a deleted pod, a deleted
// GCE VM) and is slow to begin serving it (a busy API server): a log not yet open when its
// node is terminated is gone.
type droppingLogs struct {
	polledLogs
	mu      sync.Mutex
	dropped map[string]bool
}

func (d *droppingLogs) StreamLogs(ctx context.Context, id string, opts launcher.LogOptions, w io.Writer) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(300 * time.Millisecond):
	}
	d.mu.Lock()
	gone := d.dropped[id]
	d.mu.Unlock()
	if gone {
		return fmt.Errorf("%w: pod %s not found", launcher.ErrNotFound, id)
	}
	return d.polledLogs.StreamLogs(ctx, id, opts, w)
}

func (d *droppingLogs) Terminate(ctx context.Context, id string) error {
	d.mu.Lock()
	d.dropped[id] = true
	d.mu.Unlock()
	return d.polledLogs.Terminate(ctx, id)
}

// TestArchiveOpensTheLogBeforeTheNodeGoes: a job that ended by itself on an infra that drops
// a node's output with the node, and is slow to serve it, still shows its whole log: the
// archive opens the log before the node is terminated (a CI run lost a Kubernetes job's log
// when its pods were deleted 48 ms after it succeeded, before the log's GET reached the API
// server).
func TestArchiveOpensTheLogBeforeTheNodeGoes(t *testing.T) {
	e := newEnv(t)
	e.provider = &droppingLogs{polledLogs: polledLogs{e.prov}, dropped: map[string]bool{}}
	e.stop()
	e.start()
	j := e.submit("name: dropped\nrun: echo training done\n")
	e.waitState(j.ID, jobs.Succeeded)
	if got := e.logOf(j.ID, 0); got != "training done\n" {
		t.Errorf("the ended job's log is %q: want what its node printed", got)
	}
}
