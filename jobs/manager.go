package jobs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// Provider is what the manager needs of the provisioner it shares with services: launch a
// gang where the optimizer says (failing over as for replicas), list a job's nodes, stop them.
// The optional capabilities it uses, found by type assertion: launcher.JobCleaner,
// launcher.LogSource, launcher.LogStreamer, and Preempted(launcher.Instance) (block a zone).
type Provider interface {
	LaunchGang(ctx context.Context, spec launcher.Spec, n int) ([]launcher.Instance, error)
	List(ctx context.Context, selector map[string]string) ([]launcher.Instance, error)
	Terminate(ctx context.Context, id string) error
}

// Store keeps jobs across controller restarts; internal/store implements it.
type Store interface {
	// CreateJob saves a new job and returns its id (1, 2, …, never reused).
	CreateJob(j Job) (int64, error)
	SaveJob(j Job) error
	ListJobs() ([]Job, error)
}

// Config configures a Manager.
type Config struct {
	Provider Provider
	Store    Store
	// Dir holds what the manager keeps per job: each ended gang's logs, under Dir/<id>/.
	Dir    string
	Logger *zap.Logger
	// WatchInterval paces the look at a running gang's nodes; default 2s.
	WatchInterval time.Duration
	// RetryInterval paces launch attempts of jobs waiting for capacity; default 15s. A job
	// ending or being cancelled tries the queue at once.
	RetryInterval time.Duration
	// LaunchHold is the longest the queue waits for one launch before it tries the next job
	// (the launch goes on); default 2s, so that a fast launch keeps priority order and a slow
	// or hung infra holds only its own job (queue.go).
	LaunchHold time.Duration
	// CheckpointMount is where a job's checkpoint claim appears in containers; default
	// DefaultCheckpointMount.
	CheckpointMount string
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Defaults for Config.
const (
	DefaultWatchInterval   = 2 * time.Second
	DefaultRetryInterval   = 15 * time.Second
	DefaultLaunchHold      = 2 * time.Second
	DefaultCheckpointMount = "/ferry/checkpoint"
	// terminateTimeout bounds stopping one node (its grace included).
	terminateTimeout = 3 * time.Minute
)

// Errors callers act on.
var (
	ErrNotFound = errors.New("no such job")
	ErrEnded    = errors.New("job has ended")
	ErrInvalid  = errors.New("invalid job request")
)

// Manager runs every job of a controller. It is safe for concurrent use.
type Manager struct {
	cfg Config
	log *zap.Logger

	// saveMu serialises a change and its write, so that the store sees a job's states in the
	// order they happened; readers take only mu and never wait for the disk.
	saveMu sync.Mutex
	mu     sync.Mutex
	jobs   map[int64]*Job
	// active holds the cancel of the goroutine that owns a job's nodes right now: its
	// launch or its watch. Cancel uses it to cut a launch or a watch short.
	active map[int64]*owner
	// changed is closed (and replaced) on every change, for Wait.
	changed chan struct{}

	poke chan struct{}
	wg   sync.WaitGroup
	ctx  context.Context
}

// New checks cfg and returns a Manager; Start runs it.
func New(cfg Config) (*Manager, error) {
	if cfg.Provider == nil || cfg.Store == nil {
		return nil, errors.New("jobs: Provider and Store are required")
	}
	if cfg.Dir == "" {
		return nil, errors.New("jobs: Dir is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.WatchInterval <= 0 {
		cfg.WatchInterval = DefaultWatchInterval
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = DefaultRetryInterval
	}
	if cfg.LaunchHold <= 0 {
		cfg.LaunchHold = DefaultLaunchHold
	}
	if cfg.CheckpointMount == "" {
		cfg.CheckpointMount = DefaultCheckpointMount
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Manager{
		cfg: cfg, log: cfg.Logger.Named("jobs"),
		jobs: map[int64]*Job{}, active: map[int64]*owner{},
		changed: make(chan struct{}), poke: make(chan struct{}, 1),
	}, nil
}

// Start loads the stored jobs, adopts what their nodes are doing (adopt.go) and runs the queue
// until ctx ends. It returns once the jobs are loaded; Wait for the goroutines with Stop.
func (m *Manager) Start(ctx context.Context) error {
	stored, err := m.cfg.Store.ListJobs()
	if err != nil {
		return fmt.Errorf("jobs: load: %w", err)
	}
	m.ctx = ctx
	m.mu.Lock()
	for i := range stored {
		j := stored[i]
		m.jobs[j.ID] = &j
	}
	m.mu.Unlock()
	for _, j := range stored {
		if !j.State.Terminal() || len(j.Nodes) > 0 {
			m.adopt(ctx, j.ID)
		}
	}
	m.spawn("queue", func() { m.runQueue(ctx) })
	return nil
}

// Stop waits for the manager's goroutines once Start's ctx has ended. Nodes keep running: a
// later controller adopts them.
func (m *Manager) Stop() { m.wg.Wait() }

// spawn runs f in a goroutine that Stop waits for, logging a panic instead of crashing the
// controller.
func (m *Manager) spawn(what string, f func()) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer func() {
			if r := recover(); r != nil {
				m.log.Error("jobs goroutine panicked", zap.String("what", what), zap.Any("panic", r),
					zap.String("stack", string(debug.Stack())))
			}
		}()
		f()
	}()
}

// Submit queues a job for task (which must have no service section) and returns it PENDING.
func (m *Manager) Submit(task *configs.Task) (Job, error) {
	if task == nil || task.Service != nil {
		return Job{}, fmt.Errorf("%w: a task with a service section is a service, not a job", ErrInvalid)
	}
	spec := task.Job
	if spec == nil {
		d := configs.DefaultJob()
		spec = &d
	}
	now := m.cfg.Now()
	j := Job{Name: task.Name, Task: task, State: Pending, Reason: "waiting for its turn in the queue",
		Priority: spec.Priority, Preemptible: spec.Preemptible, SubmittedAt: now, StateSince: now}
	if j.Name == "" {
		j.Name = "job"
	}
	m.saveMu.Lock()
	id, err := m.cfg.Store.CreateJob(j)
	if err == nil {
		j.ID = id
		// SkyPilot's managed form, stable across recoveries.
		j.TaskID = fmt.Sprintf("sky-managed-%s-%06d_%s_%d", now.UTC().Format("2006-01-02-15-04-05"), now.Nanosecond()/1000, j.Name, id)
		err = m.cfg.Store.SaveJob(j)
	}
	if err != nil {
		m.saveMu.Unlock()
		return Job{}, fmt.Errorf("jobs: save: %w", err)
	}
	m.mu.Lock()
	m.jobs[id] = &j
	out := j.clone()
	m.broadcastLocked()
	m.mu.Unlock()
	m.saveMu.Unlock()
	m.log.Info("job submitted", zap.Int64("job", id), zap.String("name", j.Name), zap.Int("nodes", task.NumNodes),
		zap.Int("priority", j.Priority))
	m.Poke()
	return out, nil
}

// Poke makes the queue try to launch waiting jobs now, e.g. because capacity was freed.
func (m *Manager) Poke() {
	select {
	case m.poke <- struct{}{}:
	default:
	}
}

// Get returns one job.
func (m *Manager) Get(id int64) (Job, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	j, ok := m.jobs[id]
	if !ok {
		return Job{}, fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	return j.clone(), nil
}

// Find resolves a job by id ("3") or name (the latest job of that name).
func (m *Manager) Find(ref string) (Job, error) {
	if id, err := strconv.ParseInt(ref, 10, 64); err == nil {
		return m.Get(id)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var best *Job
	for _, j := range m.jobs {
		if j.Name == ref && (best == nil || j.ID > best.ID) {
			best = j
		}
	}
	if best == nil {
		return Job{}, fmt.Errorf("%w: %q", ErrNotFound, ref)
	}
	return best.clone(), nil
}

// List returns every job, newest first.
func (m *Manager) List() []Job {
	m.mu.Lock()
	out := make([]Job, 0, len(m.jobs))
	for _, j := range m.jobs {
		out = append(out, j.clone())
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b Job) int { return int(b.ID - a.ID) })
	return out
}

// Wait returns a channel closed at the next change of any job, for long polls.
func (m *Manager) Wait() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

func (m *Manager) broadcastLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// update applies fn to job id and saves the result. fn returns false to change nothing.
func (m *Manager) update(id int64, fn func(j *Job) bool) (Job, bool) {
	m.saveMu.Lock()
	defer m.saveMu.Unlock()
	m.mu.Lock()
	j, ok := m.jobs[id]
	if !ok || !fn(j) {
		m.mu.Unlock()
		return Job{}, false
	}
	out := j.clone()
	m.broadcastLocked()
	m.mu.Unlock()
	if err := m.cfg.Store.SaveJob(out); err != nil {
		// Memory is ahead of the disk until the next save; a restart then replays from the
		// older state, which adoption handles like any crash.
		m.log.Error("save job", zap.Int64("job", id), zap.Error(err))
	}
	return out, true
}

// transition moves job id to state s with reason, and logs it.
func (m *Manager) transition(id int64, s State, reason string, also func(j *Job)) (Job, bool) {
	j, ok := m.update(id, func(j *Job) bool {
		if j.State.Terminal() && s != j.State {
			return false
		}
		j.setState(s, reason, m.cfg.Now())
		if also != nil {
			also(j)
		}
		return true
	})
	if ok {
		m.log.Info("job state", zap.Int64("job", id), zap.String("state", string(s)), zap.String("reason", reason))
	}
	return j, ok
}

// Cancel stops a job in any state that is not over: a waiting job is CANCELLED at once; one
// with nodes goes CANCELLING while they stop (with the job's grace), then CANCELLED.
func (m *Manager) Cancel(id int64) (Job, error) {
	var hadNodes, queued bool
	var stop context.CancelFunc
	j, ok := m.update(id, func(j *Job) bool { // runs under m.mu
		if j.State.Terminal() || j.State == Cancelling {
			return false
		}
		if o := m.active[id]; o != nil {
			stop = o.cancel
		}
		hadNodes = len(j.Nodes) > 0 || stop != nil
		queued = j.InQueue
		if hadNodes {
			j.setState(Cancelling, "cancelled by the user; stopping its nodes", m.cfg.Now())
		} else {
			j.setState(Cancelled, "cancelled by the user before it ran", m.cfg.Now())
		}
		return true
	})
	if !ok {
		cur, err := m.Get(id)
		if err != nil {
			return Job{}, err
		}
		if cur.State == Cancelling {
			return cur, nil
		}
		return cur, fmt.Errorf("%w: job %d is %s", ErrEnded, id, cur.State)
	}
	m.log.Info("job cancelled", zap.Int64("job", id), zap.String("state", string(j.State)))
	if stop != nil {
		stop() // the launch or the watch sees CANCELLING and stops the nodes
	} else if hadNodes || queued {
		// Also a request held in a cloud's queue: release withdraws it (CleanupJob).
		m.spawn("cancel", func() { m.release(m.ctx, id, Cancelled, "cancelled by the user") })
	}
	return j, nil
}

// owner is the goroutine that owns a job's nodes: its launch, then its watch.
type owner struct{ cancel context.CancelFunc }

// Notice records an infra's warning that it will take an instance back (a spot interruption
// warning). The node's program hears it from the node itself (the boot script's SIGTERM on
// clouds, the pod's deletion grace on Kubernetes); the manager uses it to tell the failure of
// the other nodes, whose peer is going, from a failing program. It reports whether the
// instance is a job's node.
func (m *Manager) Notice(n launcher.Notice) bool {
	var id int64
	m.mu.Lock()
	for _, j := range m.jobs {
		for _, node := range j.Nodes {
			if node.InstanceID == n.InstanceID {
				id = j.ID
			}
		}
	}
	m.mu.Unlock()
	if id == 0 {
		return false
	}
	m.update(id, func(j *Job) bool {
		for i := range j.Nodes {
			if j.Nodes[i].InstanceID == n.InstanceID && (j.Nodes[i].ReclaimAt.IsZero() || n.At.Before(j.Nodes[i].ReclaimAt)) {
				j.Nodes[i].ReclaimAt = n.At
				return true
			}
		}
		return false
	})
	m.log.Warn("preemption warning for a job's node", zap.Int64("job", id), zap.String("instance", n.InstanceID), zap.Time("at", n.At))
	return true
}

// own marks that a goroutine owns job id's nodes and returns its context and the func that
// gives them up (idempotent, and a no-op once another owner took over); ok is false when
// another goroutine already owns them.
func (m *Manager) own(parent context.Context, id int64) (context.Context, func(), bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, busy := m.active[id]; busy {
		return nil, nil, false
	}
	ctx, cancel := context.WithCancel(parent)
	o := &owner{cancel: cancel}
	m.active[id] = o
	return ctx, func() {
		cancel()
		m.mu.Lock()
		if m.active[id] == o {
			delete(m.active, id)
		}
		m.mu.Unlock()
	}, true
}

// release stops every node of job id (all attempts), archives their logs, then records the
// job in state final (already set, or set now) with no nodes. It is how every gang ends.
func (m *Manager) release(ctx context.Context, id int64, final State, reason string) {
	j, err := m.Get(id)
	if err != nil {
		return
	}
	m.stopNodes(ctx, j)
	if final.Terminal() || j.State == Cancelling {
		// The nodes are gone; what outlives them (the checkpoint claim) goes before the job
		// reads as ended.
		if c, ok := m.cfg.Provider.(launcher.JobCleaner); ok {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), terminateTimeout)
			if err := c.CleanupJob(cctx, strconv.FormatInt(id, 10)); err != nil {
				m.log.Warn("release job storage", zap.Int64("job", id), zap.Error(err))
			}
			cancel()
		}
	}
	m.update(id, func(j *Job) bool {
		j.account(m.cfg.Now())
		j.Nodes = nil
		if j.State == Cancelling {
			// Cancelled while its gang was ending for another reason: the cancel wins.
			final, reason = Cancelled, "cancelled by the user"
		}
		if j.State != final {
			j.setState(final, reason, m.cfg.Now())
		}
		return true
	})
	m.Poke() // capacity was freed
}

// stopNodes archives the logs of, then terminates, every instance labelled with the job
// (the record's nodes and any leftover of another attempt). It outlives ctx: nodes must not
// be left running because a request went away.
func (m *Manager) stopNodes(ctx context.Context, j Job) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), terminateTimeout)
	defer cancel()
	insts, err := m.cfg.Provider.List(ctx, map[string]string{launcher.LabelJob: strconv.FormatInt(j.ID, 10)})
	if err != nil {
		m.log.Warn("list job nodes to stop; stopping the recorded ones", zap.Int64("job", j.ID), zap.Error(err))
		for _, n := range j.Nodes {
			insts = append(insts, launcher.Instance{ID: n.InstanceID,
				Labels: map[string]string{launcher.LabelNodeRank: strconv.Itoa(n.Rank), launcher.LabelAttempt: strconv.Itoa(j.Attempt)}})
		}
	}
	var wg sync.WaitGroup
	for _, in := range insts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.archiveLog(ctx, j.ID, in)
			if err := m.cfg.Provider.Terminate(ctx, in.ID); err != nil {
				m.log.Warn("stop job node", zap.Int64("job", j.ID), zap.String("instance", in.ID), zap.Error(err))
			}
		}()
	}
	wg.Wait()
}

// LogFile is where an ended node's output is kept: Dir/<id>/attempt-<a>-node-<rank>.log.
func (m *Manager) LogFile(id int64, attempt, rank int) string {
	return filepath.Join(m.cfg.Dir, strconv.FormatInt(id, 10), fmt.Sprintf("attempt-%d-node-%d.log", attempt, rank))
}

// archiveLog copies a node's output to LogFile before the node is terminated, because some
// infras drop it with the node (a deleted pod's log, a terminated VM's console).
func (m *Manager) archiveLog(ctx context.Context, id int64, in launcher.Instance) {
	attempt, _ := strconv.Atoi(in.Labels[launcher.LabelAttempt])
	rank, _ := strconv.Atoi(in.Labels[launcher.LabelNodeRank])
	dst := m.LogFile(id, attempt, rank)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		m.log.Warn("archive job log", zap.Error(err))
		return
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		m.log.Warn("archive job log", zap.Error(err))
		return
	}
	defer f.Close()
	if err := copyNodeLog(ctx, m.cfg.Provider, in.ID, f); err != nil {
		m.log.Debug("archive job log", zap.Int64("job", id), zap.String("instance", in.ID), zap.Error(err))
	}
}
