package jobs_test

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/launcher"
)

// queue is the env's real local provider behind a cloud's queue: until open, every launch is
// held (launcher.ErrQueued) as a ProvisioningRequest not yet Provisioned would be.
type queue struct {
	*gangs
	since time.Time
	mu    sync.Mutex
	open  bool
	// names and attempts are what each launch asked for; withdrawn and cleaned what the
	// manager released.
	names, attempts []string
	withdrawn       []string
	cleaned         []string
}

func (q *queue) LaunchGang(ctx context.Context, spec launcher.Spec, n int) ([]launcher.Instance, error) {
	q.mu.Lock()
	q.names = append(q.names, spec.Name)
	q.attempts = append(q.attempts, spec.Labels[launcher.LabelAttempt])
	open := q.open
	q.mu.Unlock()
	if !open {
		return nil, fmt.Errorf("kubernetes/gke: %w", launcher.Queued(q.since, "ProvisioningRequest %s is not Provisioned yet", spec.Name))
	}
	return q.gangs.LaunchGang(ctx, spec, n)
}

func (q *queue) WithdrawQueued(_ context.Context, job string, attempt int) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.withdrawn = append(q.withdrawn, fmt.Sprintf("%s/%d", job, attempt))
	return nil
}

func (q *queue) CleanupJob(ctx context.Context, job string) error {
	q.mu.Lock()
	q.cleaned = append(q.cleaned, job)
	q.mu.Unlock()
	return q.gangs.CleanupJob(ctx, job)
}

func (q *queue) calls() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.names)
}

// withQueue restarts the env's manager over a queue in front of its provider.
func withQueue(e *env, since time.Time) *queue { return withQueueLogged(e, since, nil) }

// withQueueLogged is withQueue with the manager logging to log.
func withQueueLogged(e *env, since time.Time, log *zap.Logger) *queue {
	q := &queue{gangs: e.prov, since: since}
	e.stop()
	m, err := jobs.New(jobs.Config{Provider: q, Store: e.store, Dir: filepath.Join(e.home, "jobs"), Logger: log,
		WatchInterval: 50 * time.Millisecond, RetryInterval: 100 * time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Start(ctx); err != nil {
		e.t.Fatal(err)
	}
	e.m, e.stop = m, func() { cancel(); m.Stop() }
	return q
}

// A queued gang waits PENDING, saying why and since when, through many tries that all ask
// for the same request; it starts all at once when the queue provisions it.
func TestQueuedJobWaitsPendingThenStarts(t *testing.T) {
	e := newEnv(t)
	since := time.Now().Add(-time.Minute).Truncate(time.Second)
	q := withQueue(e, since)
	j := e.submit("num_nodes: 2\nresources:\n  capacity: {mode: queued, max_wait: 1h}\nrun: exec sleep 600\n")
	e.waitFor(j.ID, 20*time.Second, "was tried three times", func(jobs.Job) bool { return q.calls() >= 3 })
	w, _ := e.m.Get(j.ID)
	if w.State != jobs.Pending || !w.InQueue || !w.WaitingSince.Equal(since) {
		t.Fatalf("waiting job: %s in_queue=%v since %v, want PENDING in the queue since %v", w.State, w.InQueue, w.WaitingSince, since)
	}
	for _, want := range []string{"since " + since.UTC().Format(time.RFC3339), "queued: ProvisioningRequest", "not Provisioned yet"} {
		if !strings.Contains(w.Reason, want) {
			t.Errorf("reason %q lacks %q", w.Reason, want)
		}
	}
	q.mu.Lock()
	for i := range q.names {
		if q.names[i] != q.names[0] || q.attempts[i] != "1" {
			t.Errorf("try %d asked for %s attempt %s; every try must ask for the first's (%s, 1)", i, q.names[i], q.attempts[i], q.names[0])
		}
	}
	q.open = true
	q.mu.Unlock()

	r := e.waitState(j.ID, jobs.Running)
	if len(r.Nodes) != 2 || r.Attempt != 1 || !r.WaitingSince.IsZero() || r.InQueue || !r.RunUntil.IsZero() {
		t.Fatalf("running job %+v, want 2 nodes of attempt 1, no wait left, no run limit", r)
	}
	e.waitFor(j.ID, 10*time.Second, "withdrew unused requests", func(jobs.Job) bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.withdrawn) == 1 && q.withdrawn[0] == fmt.Sprintf("%d/1", j.ID)
	})
	if _, err := e.m.Cancel(j.ID); err != nil {
		t.Fatal(err)
	}
	e.waitState(j.ID, jobs.Cancelled)
}

// max_wait ends the wait, never before: FAILED_NO_RESOURCE, with the request withdrawn. A job
// cancelled while queued withdraws its request too.
func TestQueuedJobFailsAfterMaxWait(t *testing.T) {
	e := newEnv(t)
	q := withQueue(e, time.Now())
	j := e.submit("resources:\n  capacity: {mode: queued, max_wait: 1s}\nrun: exec sleep 600\n")
	f := e.waitState(j.ID, jobs.FailedNoResource)
	if !strings.Contains(f.Reason, "waited its max_wait of 1s") || !strings.Contains(f.Reason, "not Provisioned yet") {
		t.Errorf("reason %q", f.Reason)
	}
	if f.EndedAt.Sub(f.WaitingSince) < time.Second {
		t.Errorf("failed %v after it began waiting, before its max_wait of 1s", f.EndedAt.Sub(f.WaitingSince))
	}
	cancelled := e.submit("resources:\n  capacity: {mode: queued}\nrun: exec sleep 600\n")
	e.waitFor(cancelled.ID, 10*time.Second, "queued", func(j jobs.Job) bool { return j.InQueue })
	if _, err := e.m.Cancel(cancelled.ID); err != nil {
		t.Fatal(err)
	}
	e.waitFor(cancelled.ID, 10*time.Second, "withdrawn", func(jobs.Job) bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return strings.Join(q.cleaned, ",") == fmt.Sprintf("%d,%d", j.ID, cancelled.ID)
	})
}

// A cancel that comes as a launch ends (its try saved as waiting, the launch not yet given up
// the job) is not lost: the job ends CANCELLED and its queued request is withdrawn. The
// manager's own log line marks that moment, so the cancel is made from a hook on it.
func TestCancelAsALaunchEndsIsNotLost(t *testing.T) {
	e := newEnv(t)
	var (
		id   atomic.Int64
		m    atomic.Pointer[jobs.Manager]
		once sync.Once
	)
	cancelOnWait := zap.Hooks(func(en zapcore.Entry) error {
		if en.Message == "job waits for capacity" && id.Load() != 0 {
			once.Do(func() {
				if _, err := m.Load().Cancel(id.Load()); err != nil {
					t.Errorf("cancel: %v", err)
				}
			})
		}
		return nil
	})
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel)
	log := zap.New(core, cancelOnWait)
	q := withQueueLogged(e, time.Now(), log)
	m.Store(e.m)
	j := e.submit("resources:\n  capacity: {mode: queued}\nrun: exec sleep 600\n")
	id.Store(j.ID)
	e.waitState(j.ID, jobs.Cancelled)
	e.waitFor(j.ID, 10*time.Second, "withdrawn", func(jobs.Job) bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return strings.Join(q.cleaned, ",") == fmt.Sprint(j.ID)
	})
}

// At max_run_duration every node gets SIGTERM and the job's grace to checkpoint; the job
// ends FAILED, saying so.
func TestMaxRunDurationStopsWithGrace(t *testing.T) {
	e := newEnv(t)
	out := t.TempDir()
	j := e.submit(fmt.Sprintf(`num_nodes: 2
resources:
  capacity: {max_run_duration: 3s}
job: {grace_period_seconds: 20}
envs: {OUT: %s}
run: |
  trap 'sleep 0.3; echo saved > "$OUT/node-$SKYPILOT_NODE_RANK"; exit 0' TERM
  while true; do sleep 0.05; done
`, out))
	r := e.waitState(j.ID, jobs.Running)
	if r.RunUntil.Sub(r.StateSince) != 3*time.Second {
		t.Errorf("run_until %v is not 3s after the nodes started (%v)", r.RunUntil, r.StateSince)
	}
	f := e.waitState(j.ID, jobs.Failed)
	if !strings.Contains(f.Reason, "reached its max_run_duration of 3s") || !strings.Contains(f.Reason, "SIGTERM and 20s to checkpoint") {
		t.Errorf("reason %q", f.Reason)
	}
	if f.EndedAt.Before(r.RunUntil) {
		t.Errorf("ended %v, before its limit %v", f.EndedAt, r.RunUntil)
	}
	for rank := range 2 {
		if got := read(t, filepath.Join(out, fmt.Sprintf("node-%d", rank))); got != "saved\n" {
			t.Errorf("node %d wrote %q in its grace, want saved", rank, got)
		}
	}
}

// inWindow is the env's provider launching into a reservation that ends at end, as the
// provisioner reports an instance placed there.
type inWindow struct {
	*gangs
	end time.Time
}

func (w *inWindow) LaunchGang(ctx context.Context, spec launcher.Spec, n int) ([]launcher.Instance, error) {
	insts, err := w.gangs.LaunchGang(ctx, spec, n)
	for i := range insts {
		insts[i].WindowEnd = w.end
	}
	return insts, err
}

// A gang in a reservation is stopped its grace before the reservation ends, cleanly: SIGTERM,
// the grace to checkpoint, FAILED saying the reservation ended. A max_run_duration beyond the
// window does not postpone it.
func TestJobStopsBeforeItsReservationEnds(t *testing.T) {
	e := newEnv(t)
	// Far enough ahead that a loaded machine sees the job RUNNING before end less its grace.
	end := time.Now().Add(8 * time.Second).Truncate(time.Second)
	w := &inWindow{gangs: e.prov, end: end}
	e.stop()
	m, err := jobs.New(jobs.Config{Provider: w, Store: e.store, Dir: filepath.Join(e.home, "jobs"),
		WatchInterval: 50 * time.Millisecond, RetryInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	e.m, e.stop = m, func() { cancel(); m.Stop() }

	out := t.TempDir()
	j := e.submit(fmt.Sprintf(`resources:
  capacity: {max_run_duration: 1h}
job: {grace_period_seconds: 2}
envs: {OUT: %s}
run: |
  trap 'echo saved > "$OUT/ckpt"; exit 0' TERM
  while true; do sleep 0.05; done
`, out))
	r := e.waitState(j.ID, jobs.Running)
	if !r.RunUntil.Equal(end.Add(-2*time.Second)) || r.RunLimit != "reservation" || !r.Nodes[0].WindowEnd.Equal(end) {
		t.Fatalf("run until %v (%s), node window %v; want the reservation's end %v less the 2s grace", r.RunUntil, r.RunLimit, r.Nodes[0].WindowEnd, end)
	}
	f := e.waitState(j.ID, jobs.Failed)
	if want := "its reservation ends at " + end.UTC().Format(time.RFC3339); !strings.Contains(f.Reason, want) {
		t.Errorf("reason %q lacks %q", f.Reason, want)
	}
	if got := read(t, filepath.Join(out, "ckpt")); got != "saved\n" {
		t.Errorf("the program wrote %q in its grace, want saved", got)
	}
}

// A controller restarted while a job waits in a cloud's queue asks for the same request: the
// wait, its start and the attempt survive.
func TestQueuedJobSurvivesRestart(t *testing.T) {
	e := newEnv(t)
	since := time.Now().Add(-time.Hour).Truncate(time.Second)
	q := withQueue(e, since)
	j := e.submit("resources:\n  capacity: {mode: queued}\nrun: exec sleep 600\n")
	e.waitFor(j.ID, 10*time.Second, "queued", func(j jobs.Job) bool { return j.InQueue })
	q.mu.Lock()
	first := q.names[0]
	q.mu.Unlock()

	q2 := withQueue(e, since.Add(time.Minute)) // a new controller process, same store
	e.waitFor(j.ID, 10*time.Second, "asked again after the restart", func(jobs.Job) bool { return q2.calls() >= 2 })
	w, _ := e.m.Get(j.ID)
	q2.mu.Lock()
	defer q2.mu.Unlock()
	if q2.names[0] != first || q2.attempts[0] != "1" || w.Attempt != 1 || !w.WaitingSince.Equal(since) || w.State != jobs.Pending {
		t.Fatalf("after the restart: asked for %s attempt %s (want %s, 1); job attempt %d, waiting since %v (want %v), %s",
			q2.names[0], q2.attempts[0], first, w.Attempt, w.WaitingSince, since, w.State)
	}
}
