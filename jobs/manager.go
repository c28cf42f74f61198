package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
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
	// StopTimeout bounds each step of stopping a job's nodes (listing them, terminating them
	// with their grace, releasing the job's storage): what has not stopped by then is left to
	// the provisioner, and the job ends anyway; default 3m. A stop that meets an infra fault
	// ends sooner: see stopTail.
	StopTimeout time.Duration
	// CheckpointMount is where a job's checkpoint claim appears in containers; default
	// DefaultCheckpointMount.
	CheckpointMount string
	// GrowInterval paces an elastic job's asks for its missing nodes while it runs below
	// num_nodes (elastic.go); default four RetryIntervals. GrowProbeTimeout bounds one ask;
	// default DefaultGrowProbeTimeout.
	GrowInterval     time.Duration
	GrowProbeTimeout time.Duration
	// PreemptionCooldown is how long a job preempted for a higher-priority one is safe from
	// another preemption (preempt.go); default DefaultPreemptionCooldown.
	PreemptionCooldown time.Duration
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Defaults for Config.
const (
	DefaultWatchInterval   = 2 * time.Second
	DefaultRetryInterval   = 15 * time.Second
	DefaultLaunchHold      = 2 * time.Second
	DefaultStopTimeout     = 3 * time.Minute
	DefaultCheckpointMount = "/ferry/checkpoint"
	// DefaultGrowProbeTimeout covers a pod's provision timeout and a VM's launch.
	DefaultGrowProbeTimeout = 5 * time.Minute
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
	// freed counts stops of nodes that ended, stopping those under way: capacity a stop frees
	// shows to LaunchGang as soon as the node is gone, before Terminate returns, so the queue
	// waits for stops under way before it passes a job over for another (queue.go).
	freed    atomic.Uint64
	stopping atomic.Int64
	// archiving maps each log file being archived (LogFile) to a channel closed once it is
	// complete, so that a read of the archive waits for the copy rather than show part of it.
	archiving sync.Map
	wg        sync.WaitGroup
	ctx       context.Context
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
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = DefaultStopTimeout
	}
	launcher.SetDefault(&cfg.PreemptionCooldown, DefaultPreemptionCooldown)
	if cfg.CheckpointMount == "" {
		cfg.CheckpointMount = DefaultCheckpointMount
	}
	if cfg.GrowInterval <= 0 {
		cfg.GrowInterval = growWait(cfg.RetryInterval)
	}
	if cfg.GrowProbeTimeout <= 0 {
		cfg.GrowProbeTimeout = DefaultGrowProbeTimeout
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
	if task == nil {
		return Job{}, fmt.Errorf("%w: no task", ErrInvalid)
	}
	return m.SubmitPipeline(&configs.Pipeline{Name: task.Name, Tasks: []*configs.Task{task}})
}

// SubmitPipeline queues a pipeline's tasks as one job, which runs them in order (pipeline.go).
func (m *Manager) SubmitPipeline(p *configs.Pipeline) (Job, error) {
	if p == nil || len(p.Tasks) == 0 {
		return Job{}, fmt.Errorf("%w: no task", ErrInvalid)
	}
	for i, t := range p.Tasks {
		if t == nil || t.Service != nil {
			return Job{}, fmt.Errorf("%w: task %d has a service section: a service, not a job", ErrInvalid, i+1)
		}
	}
	now := m.cfg.Now()
	j := Job{Name: p.Name, Task: p.Tasks[0], State: Pending, Reason: "waiting for its turn in the queue", SubmittedAt: now, StateSince: now}
	if len(p.Tasks) > 1 {
		j.Pipeline = slices.Clone(p.Tasks)
	}
	j.toTask(0)
	if j.Name == "" {
		j.Name = "job"
	}
	task := j.Task
	m.saveMu.Lock()
	id, err := m.cfg.Store.CreateJob(j)
	if err == nil {
		j.ID = id
		j.TaskID = taskID(j)
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
		if j.State == Cancelling && !s.Terminal() {
			// The cancel wins: a launch or watch that ends at the same moment and would put the
			// job back in the queue leaves it to end CANCELLED.
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
// job in state final (already set, or set now) with no nodes. It is how every gang ends. What
// could not be stopped because its infra did not answer is left to the provisioner, recorded
// in Job.LeftBehind and said in the job's reason: the job ends anyway, within a few
// StopTimeouts whatever its infras do.
func (m *Manager) release(ctx context.Context, id int64, final State, reason string) {
	j, err := m.Get(id)
	if err != nil {
		return
	}
	left := m.stopNodes(ctx, j)
	if final.Terminal() || j.State == Cancelling {
		// The nodes are gone; what outlives them (the checkpoint claim) goes before the job
		// reads as ended.
		m.cleanupJob(ctx, id)
	}
	m.update(id, func(j *Job) bool {
		j.account(m.cfg.Now())
		j.Nodes = nil
		j.LeftBehind = mergeLeftovers(j.LeftBehind, left)
		if j.State == Cancelling {
			// Cancelled while its gang was ending for another reason: the cancel wins.
			final, reason = Cancelled, "cancelled by the user"
		}
		if j.State != final {
			j.setState(final, withLeftNote(reason, left), m.cfg.Now())
		} else {
			j.Reason = withLeftNote(j.Reason, left)
		}
		return true
	})
	m.Poke() // capacity was freed
}

// cleanupJob releases what outlives job id's nodes (its checkpoint claim, a request held in a
// cloud's queue). An infra that does not answer is logged, not fatal, and waited for at most
// StopTimeout: the claim is the provider's to release once it can.
func (m *Manager) cleanupJob(ctx context.Context, id int64) {
	c, ok := m.cfg.Provider.(launcher.JobCleaner)
	if !ok {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StopTimeout)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.CleanupJob(cctx, strconv.FormatInt(id, 10)) }()
	select {
	case err := <-errc:
		if err != nil {
			m.log.Warn("release job storage", zap.Int64("job", id), zap.Error(err))
		}
	case <-cctx.Done():
		m.log.Warn("release job storage: no answer in time; the job ends without waiting", zap.Int64("job", id),
			zap.Duration("waited", m.cfg.StopTimeout))
	}
}

// stopNodes archives the logs of, then terminates, every instance labelled with the job (the
// record's nodes and any leftover of another attempt), on the infras its nodes run on. It
// outlives ctx: nodes must not be left running because a request went away. What it cannot
// reach — a recorded node in a gap of the listing, a Terminate that left its node behind or
// failed as an infra, one that did not return within StopTimeout, and, per infra that could
// not be listed, any other node of the job launched before now — is handed to the provider
// (launcher.LeftoverKeeper) and returned.
func (m *Manager) stopNodes(ctx context.Context, j Job) []launcher.Leftover {
	defer m.freeing()()
	ctx = context.WithoutCancel(ctx)
	lctx, cancel := context.WithTimeout(ctx, min(m.cfg.StopTimeout, time.Minute))
	var insts []launcher.Instance
	var err error
	if len(j.History) > 0 {
		// An earlier gang ran elsewhere, and a node of it may have outlived its stop: look
		// everywhere (an infra that does not answer is a gap like any other).
		insts, err = m.cfg.Provider.List(lctx, map[string]string{launcher.LabelJob: strconv.FormatInt(j.ID, 10)})
	} else {
		insts, err = m.listJob(lctx, j)
	}
	cancel()
	insts, gaps := listGaps(j, insts, err)
	if len(gaps) > 0 {
		m.log.Warn("job nodes to stop cannot all be listed; what cannot is left to stop when its infra answers",
			zap.Int64("job", j.ID), zap.String("where", gapsWhere(gaps)), zap.Error(gapErr(gaps)))
	}
	// Seconds truncated: some infras keep creation times so, and a node launched right after
	// must never count as older.
	now := m.cfg.Now().Truncate(time.Second)
	owner := fmt.Sprintf("job %d", j.ID)
	var left []launcher.Leftover
	for _, n := range j.Nodes {
		if slices.ContainsFunc(insts, func(in launcher.Instance) bool { return in.ID == n.InstanceID }) {
			continue
		}
		if g, ok := covers(gaps, n.Infra, n.Region, n.Zone); ok {
			left = append(left, launcher.Leftover{Infra: n.Infra, InstanceID: n.InstanceID, Reason: g.String()})
		}
	}
	for _, g := range gaps {
		if g.Infra == "" || slices.ContainsFunc(left, func(l launcher.Leftover) bool { return l.InstanceID == "" && l.Infra == g.Infra }) {
			continue
		}
		if !slices.Contains(jobInfras(j), g.Infra) && !mayHoldUnrecorded(j) {
			continue // nothing of the job was there
		}
		left = append(left, launcher.Leftover{Infra: g.Infra, Selector: map[string]string{launcher.LabelJob: strconv.FormatInt(j.ID, 10)},
			Before: now, Reason: g.String()})
	}
	left = append(left, m.terminateAll(ctx, j, insts)...)
	keeper, _ := m.cfg.Provider.(launcher.LeftoverKeeper)
	for i := range left {
		l := &left[i]
		l.Owner = owner
		if l.Since.IsZero() {
			l.Since = now
		}
		if l.Key == "" {
			l.Key = launcher.LeftoverKey(*l)
		}
		if keeper == nil {
			m.log.Error("job node left on an infra that did not answer, and nothing will stop it: stop it by hand",
				zap.Int64("job", j.ID), zap.String("infra", l.Infra), zap.String("what", l.Describe()), zap.String("reason", l.Reason))
			continue
		}
		if err := keeper.LeaveBehind(*l); err != nil {
			m.log.Error("record a job node left behind", zap.Int64("job", j.ID), zap.String("what", l.Describe()), zap.Error(err))
		}
	}
	return left
}

// mayHoldUnrecorded reports whether job j may have nodes it has not recorded anywhere: a
// launch in flight or cut short (STARTING, or cancelled meanwhile), or a request held in a
// cloud's queue that may have been granted.
func mayHoldUnrecorded(j Job) bool {
	return len(j.Nodes) == 0 && (j.InQueue || j.State == Starting || j.State == Cancelling)
}

// terminateAll archives the logs of and terminates insts, each in its own goroutine, waiting
// for them at most StopTimeout: an instance whose Terminate left it behind, failed as an
// infra, or did not return in time is returned as a leftover.
func (m *Manager) terminateAll(ctx context.Context, j Job, insts []launcher.Instance) []launcher.Leftover {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.StopTimeout)
	defer cancel()
	type stopped struct {
		in  launcher.Instance
		err error
	}
	results := make(chan stopped, len(insts))
	for _, in := range insts {
		// Not spawned: a Terminate that ignores its deadline must not hold the job, nor Stop.
		go func() {
			defer func() {
				if r := recover(); r != nil {
					results <- stopped{in, fmt.Errorf("terminate panicked: %v", r)}
				}
			}()
			results <- stopped{in, m.stopNode(ctx, j, in)}
		}()
	}
	var left []launcher.Leftover
	pending := map[string]launcher.Instance{}
	for _, in := range insts {
		pending[in.ID] = in
	}
	for len(pending) > 0 {
		select {
		case r := <-results:
			delete(pending, r.in.ID)
			if l, ok := launcher.LeftBehind(r.err); ok {
				l.Infra, l.InstanceID = cmp.Or(l.Infra, r.in.Infra), cmp.Or(l.InstanceID, r.in.ID)
				l.Reason = cmp.Or(l.Reason, r.err.Error())
				left = append(left, l)
			} else if r.err != nil && (launcher.IsInfraFault(r.err) || errors.Is(r.err, context.DeadlineExceeded)) {
				left = append(left, launcher.Leftover{Infra: r.in.Infra, InstanceID: r.in.ID, Reason: r.err.Error()})
			} else if r.err != nil {
				m.log.Warn("stop job node", zap.Int64("job", j.ID), zap.String("instance", r.in.ID), zap.Error(r.err))
			}
		case <-ctx.Done():
			for _, in := range slices.SortedFunc(maps.Values(pending), func(a, b launcher.Instance) int { return cmp.Compare(a.ID, b.ID) }) {
				left = append(left, launcher.Leftover{Infra: in.Infra, InstanceID: in.ID,
					Reason: fmt.Sprintf("%v: did not stop within %v", launcher.ErrUnavailable, m.cfg.StopTimeout)})
			}
			return left
		}
	}
	return left
}

// freeing counts a stop under way until the call it returns; the count of stops that ended
// is bumped before the stop stops counting, so that a queue that saw none under way sees it.
func (m *Manager) freeing() (done func()) {
	m.stopping.Add(1)
	return func() {
		m.freed.Add(1)
		m.stopping.Add(-1)
	}
}

// LogFile is where an ended node's output is kept: Dir/<id>/attempt-<a>-node-<rank>.log.
func (m *Manager) LogFile(id int64, attempt, rank int) string {
	return filepath.Join(m.cfg.Dir, strconv.FormatInt(id, 10), fmt.Sprintf("attempt-%d-node-%d.log", attempt, rank))
}

// stopNode terminates a node of job j and archives its output to LogFile, with what it printed
// after SIGTERM (a checkpoint's last words): the archive is opened before the node is stopped,
// because some infras drop the output with the node (a deleted pod's log, a terminated VM's
// console), and read on after it stopped (stopTail). A local log is held open (a descriptor
// outlives the file's move); another infra's is followed from before Terminate until the
// stream ends, as the node's program exits.
func (m *Manager) stopNode(ctx context.Context, j Job, in launcher.Instance) error {
	defer m.freeing()()
	finish := m.archiveLog(ctx, j.ID, in)
	err := m.cfg.Provider.Terminate(ctx, in.ID)
	finish(stopTail(j, err))
	return err
}

// stopLogSlack is how long past a stopped node's grace its output is waited for: a followed
// console is read every few seconds, and its last read must come after the program's end.
const stopLogSlack = 15 * time.Second

// stopTail is how long a stop waits, after the node's Terminate returned err, for the end of
// its output. Not at all when Terminate did not stop it: the node runs on until its infra
// answers (the janitor's, or an error to log), and waiting for its end would wait for that.
// Otherwise the node's grace and stopLogSlack: its program has ended by then, and a stream that
// has not is held up by its infra, whose reads the stop does not wait out (archiveLog).
func stopTail(j Job, err error) time.Duration {
	if err != nil {
		return 0
	}
	return time.Duration(graceOf(j))*time.Second + stopLogSlack
}

// archiveLog starts archiving in's output and returns the call that completes it, which waits
// for the output's end at most tail (and within ctx), and not once a read of the output failed
// for its infra's reasons (launcher.LogOptions.Stalled): what was read is kept.
func (m *Manager) archiveLog(ctx context.Context, id int64, in launcher.Instance) (finish func(tail time.Duration)) {
	attempt, _ := strconv.Atoi(in.Labels[launcher.LabelAttempt])
	rank, _ := strconv.Atoi(in.Labels[launcher.LabelNodeRank])
	dst := m.LogFile(id, attempt, rank)
	warn := func(err error) {
		m.log.Debug("archive job log", zap.Int64("job", id), zap.String("instance", in.ID), zap.Error(err))
	}
	noop := func(time.Duration) {}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		m.log.Warn("archive job log", zap.Error(err))
		return noop
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		m.log.Warn("archive job log", zap.Error(err))
		return noop
	}
	complete := make(chan struct{})
	m.archiving.Store(dst, complete)
	closeArchive := func() {
		f.Close()
		m.archiving.CompareAndDelete(dst, complete)
		close(complete)
	}
	if ls, ok := m.cfg.Provider.(launcher.LogSource); ok {
		if path, err := ls.LogPath(in.ID); err == nil {
			src, err := os.Open(path)
			if err != nil {
				warn(err)
				closeArchive()
				return noop
			}
			return func(time.Duration) {
				if _, err := io.Copy(f, src); err != nil {
					warn(err)
				}
				src.Close()
				closeArchive()
			}
		}
	}
	ls, ok := m.cfg.Provider.(launcher.LogStreamer)
	if !ok {
		closeArchive()
		return noop
	}
	return m.followLog(ctx, ls, id, in, f, closeArchive, warn)
}

// awaitArchive waits, within ctx, until the archive at path is complete if it is being written.
func (m *Manager) awaitArchive(ctx context.Context, path string) {
	if c, ok := m.archiving.Load(path); ok {
		select {
		case <-c.(chan struct{}):
		case <-ctx.Done():
		}
	}
}

// followLog streams in's output to f from now on (the part of archiveLog for infras that serve
// it through their API) and returns the call that ends the stream, as archiveLog says; closeF
// closes f once the stream has ended.
func (m *Manager) followLog(ctx context.Context, ls launcher.LogStreamer, id int64, in launcher.Instance, f *os.File,
	closeF func(), warn func(error)) (finish func(tail time.Duration)) {
	sctx, cut := context.WithCancel(ctx)
	done, opened, stalled := make(chan struct{}), make(chan struct{}), make(chan struct{})
	stall := sync.OnceFunc(func() { close(stalled) })
	go func() {
		defer close(done)
		opts := launcher.LogOptions{Tail: -1, Follow: true, Opened: sync.OnceFunc(func() { close(opened) }),
			Stalled: func(error) { stall() }}
		if err := ls.StreamLogs(sctx, in.ID, opts, f); err != nil {
			warn(err)
		}
	}()
	// Stop the node only once its log is open (or cannot be): a pod deleted before the API
	// server began serving its log takes all of it along. A quarter of the stop's bound at
	// most, so that a log read that hangs leaves Terminate its time.
	wait := time.NewTimer(m.cfg.StopTimeout / 4)
	defer wait.Stop()
	select {
	case <-opened:
	case <-done:
	case <-wait.C:
	case <-ctx.Done():
	}
	return func(tail time.Duration) {
		bound := time.NewTimer(tail)
		defer bound.Stop()
		select {
		case <-done: // the program exited and its stream ended
		case <-stalled: // its infra fails the reads: it cannot say when the output ends
			m.log.Info("job node's output not read to its end: its infra fails the reads", zap.Int64("job", id), zap.String("instance", in.ID))
		case <-bound.C:
		case <-ctx.Done(): // the stop's bound: keep what was read
		}
		cut()
		go func() { <-done; closeF() }()
	}
}
