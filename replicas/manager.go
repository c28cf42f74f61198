package replicas

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/policy"
)

// Config configures a Manager for one service.
type Config struct {
	Service string
	// Version is the version new replicas are launched with.
	Version int
	// Task is what replicas run; Task.Service must be set.
	Task     *configs.Task
	Provider launcher.Provider
	Store    Store
	// OnReady receives the whole READY set each time it changes, and once after Start has
	// adopted and probed existing replicas. Calls never overlap; the slice is the callee's.
	// It should return quickly: probe results wait for it.
	OnReady func([]Endpoint)
	Logger  *zap.Logger
	// ProbeInterval is the time between readiness probes of a replica; default 10s (SkyServe).
	ProbeInterval time.Duration
	// ReconcileInterval is the time between full passes that list instances; default 1s.
	ReconcileInterval time.Duration
	// FailureThreshold is how long probes of a replica that was READY may fail before it is
	// FAILED_PROBING and replaced; default 180s (SkyServe). Until then it is NOT_READY and
	// receives no traffic.
	FailureThreshold time.Duration
	// Now is the clock decisions use (initial delay, failure threshold, backoff); nil is
	// time.Now.
	Now func() time.Time
	// HTTPClient sends probes; nil is a client without keep-alives or proxy.
	HTTPClient *http.Client
	// Busy, when set, reports how many requests still use the replica at addr (the proxy's
	// count, including streams that outlive the replica's removal from the READY set). A
	// scaled-down replica is terminated only once it reports none, or after DrainTimeout.
	// Nil terminates at once.
	Busy func(addr string) int64
	// DrainTimeout bounds how long a scaled-down replica drains; default DefaultDrainTimeout.
	DrainTimeout time.Duration
	// WindowLead is how long before its reservation's end a replica is replaced (window.go);
	// default launcher.DefaultWindowLead.
	WindowLead time.Duration
	// InfraRank orders infras by preference for scale-down (see planInput.InfraRank); nil
	// treats every infra alike.
	InfraRank map[string]int
	// Versions are the service's other versions still known (older ones an update may keep or
	// roll back to); Version and Task are the current one.
	Versions []Version
	// Rollout is the service's latest rollout (nil if none); a restarted controller resumes it.
	// When set, Version must be its Target().
	Rollout *Rollout
	// InitialTarget, when set, is the target saved before a restart; otherwise the manager
	// keeps what it finds until SetDesired.
	InitialTarget *int
	// ObserveReconcile, when set, receives how long each reconcile pass took (the List, the
	// pass, publishing), for the controller's reconcile-duration histogram.
	ObserveReconcile func(time.Duration)
}

// Defaults for Config.
const (
	DefaultProbeInterval     = 10 * time.Second
	DefaultReconcileInterval = time.Second
	DefaultFailureThreshold  = 180 * time.Second
	// DefaultDrainTimeout is how long a replica leaving on scale-down may finish its streams.
	// SkyServe drains 120 s; long generations at a few tokens per second take longer, and a
	// draining replica costs only its own time, so Ferry waits longer.
	DefaultDrainTimeout = 5 * time.Minute
)

const (
	// listTimeout bounds one List call of a pass.
	listTimeout = 30 * time.Second
	// maxConcurrentLaunches bounds Launch calls in flight per service.
	maxConcurrentLaunches = 8
	// keepFailed terminal records stay for `serve status`.
	keepFailed = 10
	// goneTTL is how long an instance we terminated is ignored if a List still reports it
	// (a List begun before the Terminate, or a cloud API catching up).
	goneTTL = 10 * time.Minute
	// firstProbesWait bounds how long Start waits for the first probes of adopted replicas
	// before it publishes, so a restarted controller publishes real readiness, not nothing.
	firstProbesWait = time.Second
)

// Manager runs the replicas of one service: it launches and terminates instances to match the
// target count, probes them, moves them through SkyServe's states, replaces failed ones and
// publishes the READY set. It is safe for concurrent use.
type Manager struct {
	cfg      Config
	log      *zap.Logger
	selector map[string]string

	started atomic.Bool
	kick    chan struct{}
	sem     chan struct{} // bounds concurrent launches

	// loaded is true once records were read from the store (load).
	loaded atomic.Bool

	// turn is held by whoever owns the state: the run loop while it runs, else one caller for
	// one step; steps are posted to the run loop (loop.go).
	turn  chan struct{}
	steps chan func()

	// The state, owned as above. effects are the store writes, provider calls and
	// publications queued by steps, run in order by the executor (records.go); flushing is set
	// while a caller runs them.
	effects  []effect
	flushing bool
	// spareIDs are replica ids reserved in the store for launches (reserveIDs).
	spareIDs []int
	// everReady is set once any replica was READY: a service that served and has no replica
	// now is NO_REPLICA, not starting up, and a rollout from it has a version to go back to.
	// Atomic: ServiceStatus, a reader, sets it too.
	everReady atomic.Bool
	// desired is the target count; -1 until SetDesired or the first pass fixes it.
	desired  int
	replicas map[int]*replica
	// instances is the latest List result, kept current with our own launches and
	// terminations so that probe-triggered passes need not list again.
	instances []launcher.Instance
	observed  bool
	// gaps are the parts of the infras the last List could not read (Unknown).
	gaps []launcher.Gap
	// eventSeq orders launch completions against List calls.
	eventSeq uint64
	gone     map[string]time.Time
	// stopping are the instances whose Terminate is under way: a List may still show them,
	// and a pass must neither terminate one again nor adopt it as a replica of its own.
	stopping map[string]bool
	// notices are the instances an infra warned will be reclaimed (spot interruption
	// notices), with when; their replicas serve on but are replaced now.
	notices map[string]time.Time
	// losses are the service's spot losses (losses.go), saved with it; replaced on a loss,
	// never changed in place (snapshots share them).
	losses policy.Losses
	// spotSpare is the spare spot replicas of the last pass (planInput.Spare), for the log
	// and the snapshot.
	spotSpare int
	// windowEnds are instances whose reservation ends later than the lead: noticed once
	// within it (window.go).
	windowEnds map[string]time.Time
	// versions by number, target the version new replicas launch as, rollout the latest
	// rollout (nil if none).
	versions map[int]Version
	target   int
	rollout  *Rollout
	// failures and lastFail are the launch backoff, per kind (spot true, on-demand false).
	failures map[bool]int
	lastFail map[bool]time.Time
	// spreadAfter holds spread moves back after one found no zone (planInput.SpreadAfter).
	spreadAfter time.Time
	shutdown    bool
	workCtx     context.Context
	// launchCtx is workCtx for launches, which Shutdown cancels (cancelLaunches): a teardown
	// does not wait out a launch hung on an infra that does not answer.
	launchCtx      context.Context
	cancelLaunches context.CancelFunc
	workers        sync.WaitGroup
	launches       sync.WaitGroup

	// snap is what readers see (snapshot.go).
	snap  atomic.Pointer[snapshot]
	ready atomic.Pointer[readySet]
	// publishing turns on at Start's first publication: until then changes are not sent, so
	// that a restarted controller's first set reflects probes, not only stored statuses.
	publishing atomic.Bool
	// published is the version of the set OnReady got last; only the executor reads and
	// writes it.
	published uint64
	// publishQueued (state) is the version of the set the last queued publication was for.
	publishQueued uint64
}

// replica is the manager's state for one replica.
type replica struct {
	rec         Record
	probe       probeState
	launching   bool
	terminating bool
	// spreadFrom is the zone a spread move's replica moves out of, until it is READY or ends
	// (in memory: a restarted controller counts it as any replica, and scale-down may take it).
	spreadFrom string
	// launched are the instances our launch returned (a gang's nodes, head first), and
	// launchSeq and launchedAt when; a List begun before then may not show them yet, nor
	// one begun soon after, from a cache that trails the launch (listed: one showed them).
	launched   []launcher.Instance
	launchSeq  uint64
	launchedAt time.Time
	listed     bool
	// drainingSince is when a scale-down took the replica out of the READY set (in memory
	// only: a restarted controller drains again, bounded by the same timeout).
	drainingSince time.Time
	// healthySince is when the current run of READY began (in memory: a restarted controller
	// counts min_healthy_seconds again).
	healthySince time.Time
	// stopProbe cancels the prober; probeGen tells a current prober's results from a
	// stopped one's.
	stopProbe context.CancelFunc
	probeGen  uint64
}

// hasNode reports whether instance id is the replica's, or a node of its gang.
func (r *replica) hasNode(id string) bool {
	return id != "" && (r.rec.InstanceID == id || slices.Contains(r.rec.Nodes, id))
}

// New checks cfg, applies defaults and returns a Manager that does nothing until Start.
func New(cfg Config) (*Manager, error) {
	var errs []error
	if cfg.Service == "" {
		errs = append(errs, errors.New("missing Service"))
	}
	if cfg.Task == nil || cfg.Task.Service == nil {
		errs = append(errs, errors.New("missing Task with a service section"))
	}
	if cfg.Provider == nil {
		errs = append(errs, errors.New("missing Provider"))
	}
	if cfg.Store == nil {
		errs = append(errs, errors.New("missing Store"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("replicas: %w", err)
	}
	launcher.SetDefault(&cfg.ProbeInterval, DefaultProbeInterval)
	launcher.SetDefault(&cfg.ReconcileInterval, DefaultReconcileInterval)
	launcher.SetDefault(&cfg.FailureThreshold, DefaultFailureThreshold)
	launcher.SetDefault(&cfg.DrainTimeout, DefaultDrainTimeout)
	launcher.SetDefault(&cfg.WindowLead, launcher.DefaultWindowLead)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = newProbeClient()
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	m := &Manager{
		cfg:      cfg,
		log:      cfg.Logger.With(zap.String("service", cfg.Service)),
		selector: serviceSelector(cfg.Service),
		kick:     make(chan struct{}, 1),
		turn:     make(chan struct{}, 1),
		steps:    make(chan func()),
		sem:      make(chan struct{}, maxConcurrentLaunches),
		desired:  -1,
		replicas: map[int]*replica{},
		gone:     map[string]time.Time{},
		stopping: map[string]bool{},
		notices:  map[string]time.Time{},
		failures: map[bool]int{},
		lastFail: map[bool]time.Time{},
		versions: map[int]Version{},
		target:   cfg.Version,
	}
	for _, v := range cfg.Versions {
		m.versions[v.Number] = v
	}
	m.versions[cfg.Version] = Version{Number: cfg.Version, Task: cfg.Task, LaunchedAs: launchedAsOr(m.versions[cfg.Version], cfg.Version)}
	if cfg.Rollout != nil {
		r := *cfg.Rollout
		m.rollout = &r
	}
	if cfg.InitialTarget != nil {
		m.desired = max(*cfg.InitialTarget, 0)
	}
	m.turn <- struct{}{}
	m.ready.Store(&readySet{})
	m.snap.Store(m.snapshotOwned()) // no other goroutine has m yet
	return m, nil
}

// Start adopts the service's existing instances, probes them, publishes the READY set, then
// reconciles until ctx ends. It returns once its workers stopped. It does not terminate
// instances when ctx ends: a controller restart must find them running.
func (m *Manager) Start(ctx context.Context) error {
	if !m.started.CompareAndSwap(false, true) {
		return errors.New("replicas: manager already started")
	}
	workCtx, cancel := context.WithCancel(ctx)
	looped := make(chan struct{})
	go func() {
		defer close(looped)
		m.run(workCtx)
	}()
	defer func() {
		cancel()
		m.workers.Wait() // their last steps run in their own goroutines once the loop ended
		<-looped
	}()
	launchCtx, cancelLaunches := context.WithCancel(workCtx)
	m.own(func() {
		m.workCtx = workCtx
		m.launchCtx, m.cancelLaunches = launchCtx, cancelLaunches
	})

	m.safeReconcile(workCtx)
	m.awaitFirstProbes(workCtx)
	m.do(func() { m.publishOwned(true) })

	tick := time.NewTicker(m.cfg.ReconcileInterval)
	defer tick.Stop()
	for {
		select {
		case <-workCtx.Done():
			return nil
		case <-tick.C:
		case <-m.kick:
		}
		m.safeReconcile(workCtx)
	}
}

// Resync runs a reconcile pass (with a fresh List) now rather than at the next interval: the
// infra said something changed, e.g. a spot preemption notice.
func (m *Manager) Resync() { m.kickLoop() }

// Notice takes an infra's warning that instance will be reclaimed at (EC2's two-minute spot
// interruption notice, GCP's preemption). If one of this service's live replicas runs on it,
// the replica keeps serving until the instance goes, but stops counting toward the target, so
// its replacement (and the on-demand fallback) starts now instead of a cold start after the
// loss; its zone is avoided for spot launches from now on. It reports whether the instance was
// this service's; other instances are ignored.
func (m *Manager) Notice(instance string, at time.Time) bool {
	if m.deferNotice(instance, at) { // a reservation's end, known ahead: window.go
		return true
	}
	var ours, fresh bool
	// do: the loss a notice is (losses.go) is on disk when Notice returns.
	m.do(func() { ours, fresh = m.noticeOwned(instance, at) })
	if fresh {
		m.kickLoop()
	}
	return ours
}

// noticeOwned records a notice for a live replica's instance, and reports whether the
// instance is one, and whether the notice is new.
func (m *Manager) noticeOwned(instance string, at time.Time) (ours, fresh bool) {
	var hit *replica
	for _, r := range m.replicas {
		if r.hasNode(instance) && live(r.rec.Status) {
			hit = r
			break
		}
	}
	if _, known := m.notices[instance]; hit == nil || known {
		return hit != nil, false
	}
	again := m.noticedOwned(hit) // another node of the same replica: one loss
	m.notices[instance] = at
	m.recordPreemptionOwned(hit)
	if hit.rec.Spot && !again {
		m.lostOwned(m.cfg.Now(), hit)
	}
	m.log.Warn("spot interruption notice: replacing the replica before its instance is reclaimed",
		zap.Int("replica", hit.rec.ID), zap.String("instance", instance), zap.Time("reclaimed_at", at))
	return true, true
}

// SetDesired sets how many replicas should run. Until it is first called the manager keeps
// the replicas it finds (at least min_replicas), so a restart changes nothing.
func (m *Manager) SetDesired(n int) {
	n = max(n, 0)
	var changed bool
	m.step(func() {
		changed = m.desired != n
		m.desired = n
	})
	if changed {
		m.log.Info("replica target set", zap.Int("target", n))
		m.kickLoop()
	}
}

// Replicas returns a snapshot of every replica the service has, including recently failed
// ones, ordered by id, for `serve status`.
func (m *Manager) Replicas() []Record {
	if err := m.load(); err != nil {
		m.log.Warn("load replica records", zap.Error(err))
	}
	return append([]Record{}, m.snap.Load().records...)
}

// Ready returns the current READY set, ordered by replica id.
func (m *Manager) Ready() []Endpoint {
	return slices.Clone(m.ready.Load().endpoints)
}

// markShuttingDown is Shutdown's first step: every replica SHUTTING_DOWN and its prober
// stopped, none READY, launches in flight cut, the records written before anything is
// terminated, and the proxies told.
func (m *Manager) markShuttingDown() {
	// do: the SHUTTING_DOWN records are on disk, and the proxies told, before anything is
	// terminated.
	m.do(m.markShuttingDownOwned)
}

func (m *Manager) markShuttingDownOwned() {
	if !m.shutdown {
		m.log.Info("shutting down service")
	}
	m.shutdown = true
	now := m.cfg.Now()
	for _, id := range sortedKeys(m.replicas) {
		r := m.replicas[id]
		m.stopProberOwned(r)
		if r.rec.Status != StatusShuttingDown {
			m.transitionOwned(now, r, StatusShuttingDown, "service shutting down", nil)
		}
	}
	m.setReadyOwned()
	if m.cancelLaunches != nil {
		m.cancelLaunches() // what a cut launch made anyway is found later, or left behind
	}
	m.publishOwned(true)
}

// forgetAll is Shutdown's last step, once every instance is terminated or left behind: the
// service's replica records are deleted and the manager holds none.
func (m *Manager) forgetAll() error {
	stored, err := m.cfg.Store.ListReplicas(m.cfg.Service)
	if err != nil {
		return err
	}
	var errs []error
	for _, rec := range stored {
		if err := m.cfg.Store.DeleteReplica(m.cfg.Service, rec.ID); err != nil {
			errs = append(errs, err)
		}
	}
	m.step(func() { // it queues no effect: nothing to wait for
		for _, r := range m.replicas {
			m.stopProberOwned(r)
		}
		m.replicas = map[int]*replica{}
		m.instances = nil
	})
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete records: %w", err)
	}
	return nil
}

// Shutdown takes the service down: every replica becomes SHUTTING_DOWN, the empty READY set is
// published, every instance of the service is terminated (launches under way are waited for
// first) and the records are deleted. It works whether or not Start runs, and calling it again
// finishes what an interrupted call left.
//
// An infra that does not answer does not hold the rest up: what could not be stopped there —
// the instances its records name, and whatever else of the service the infra may hold, launched
// before now — is handed to the provider's janitor (launcher.LeftoverKeeper), which stops it
// once the infra answers again, and returned so the caller can say exactly what is left.
func (m *Manager) Shutdown(ctx context.Context) ([]launcher.Leftover, error) {
	fail := func(err error) ([]launcher.Leftover, error) {
		return nil, fmt.Errorf("replicas: shutdown %s: %w", m.cfg.Service, err)
	}
	if err := m.load(); err != nil {
		return fail(err)
	}
	m.markShuttingDown()

	launched := make(chan struct{})
	go func() {
		m.launches.Wait()
		close(launched)
	}()
	select {
	case <-launched:
	case <-ctx.Done():
		return fail(fmt.Errorf("waiting for launches: %w", ctx.Err()))
	}

	// The cut-off of what is left unlisted: every launch has returned, so whatever it made is
	// older (seconds truncated, as some infras keep creation times: an instance of a service
	// re-created under the same name right away is never counted).
	before := m.cfg.Now().Truncate(time.Second)
	recs := m.Replicas() // every step that changed them republished them
	insts, err := m.cfg.Provider.List(ctx, m.selector)
	gaps, partial := launcher.Partial(err)
	if !partial {
		return fail(fmt.Errorf("list instances: %w", err))
	}
	left, err := m.terminateAll(ctx, insts)
	if err != nil {
		return fail(err)
	}
	unlisted, err := m.leaveUnlisted(before, gaps, recs)
	if err != nil {
		return fail(err)
	}
	left = append(left, unlisted...)

	if err := m.forgetAll(); err != nil {
		return fail(err)
	}
	m.log.Info("service shut down", zap.Int("instances_terminated", len(insts)-len(left)+len(unlisted)), zap.Int("left_behind", len(left)))
	return left, nil
}

// terminateAll terminates insts at once (bounded), returning what the provider left to its
// janitor and failing on anything else.
func (m *Manager) terminateAll(ctx context.Context, insts []launcher.Instance) ([]launcher.Leftover, error) {
	errs := make([]error, len(insts))
	lefts := make([]*launcher.Leftover, len(insts))
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxConcurrentLaunches)
	for i, inst := range insts {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			err := m.cfg.Provider.Terminate(ctx, inst.ID)
			if l, ok := launcher.LeftBehind(err); ok {
				lefts[i] = &l
				return
			}
			if err != nil {
				errs[i] = fmt.Errorf("terminate %s: %w", inst.ID, err)
			}
		})
	}
	wg.Wait()
	var left []launcher.Leftover
	keeper, _ := m.cfg.Provider.(launcher.LeftoverKeeper)
	for _, l := range lefts {
		if l == nil {
			continue
		}
		// The provider kept it without knowing whose it was: say so, for `ferry check`.
		l.Owner = "service " + m.cfg.Service
		if keeper != nil {
			if err := keeper.LeaveBehind(*l); err != nil {
				m.log.Warn("record what is left", zap.String("instance", l.InstanceID), zap.Error(err))
			}
		}
		left = append(left, *l)
	}
	return left, errors.Join(errs...)
}

// leaveUnlisted hands the janitor what a shutdown could not list: in each gap, the instances
// the records name there (every node of a gang) and any other instance of the service launched
// before now. A zone that does not exist holds nothing.
func (m *Manager) leaveUnlisted(now time.Time, gaps []launcher.Gap, recs []Record) ([]launcher.Leftover, error) {
	var out []launcher.Leftover
	infras := map[string]launcher.Gap{}
	for _, g := range gaps {
		if !errors.Is(g.Err, launcher.ErrNotFound) {
			infras[g.Infra] = g
		}
	}
	if len(infras) == 0 {
		return nil, nil
	}
	keeper, ok := m.cfg.Provider.(launcher.LeftoverKeeper)
	if !ok {
		return nil, fmt.Errorf("list instances: %w", launcher.PartialList(gaps))
	}
	owner := "service " + m.cfg.Service
	for _, rec := range recs {
		g, in := m.inGaps(gaps, rec)
		if !in || rec.InstanceID == "" || errors.Is(g.Err, launcher.ErrNotFound) {
			continue
		}
		// The head, and the other nodes of its gang: one location, one gap.
		for _, id := range append([]string{rec.InstanceID}, rec.Nodes...) {
			if !slices.ContainsFunc(out, func(l launcher.Leftover) bool { return l.InstanceID == id }) {
				out = append(out, launcher.Leftover{Infra: rec.Infra, InstanceID: id, Owner: owner, Reason: g.Err.Error(), Since: now})
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(infras)) {
		out = append(out, launcher.Leftover{Infra: name, Selector: maps.Clone(m.selector), Before: now, Owner: owner,
			Reason: infras[name].Err.Error(), Since: now})
	}
	for i := range out {
		out[i].Key = launcher.LeftoverKey(out[i])
		if err := keeper.LeaveBehind(out[i]); err != nil {
			return nil, fmt.Errorf("record what is left on %s: %w", out[i].Infra, err)
		}
	}
	return out, nil
}

func (m *Manager) recoverPanic(what string) {
	if p := recover(); p != nil {
		m.log.Error("recovered panic", zap.String("in", what), zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
	}
}
