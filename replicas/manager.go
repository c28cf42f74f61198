package replicas

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
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

	mu sync.Mutex
	// loaded is true once records were read from the store.
	loaded bool
	// desired is the target count; -1 until SetDesired or the first pass fixes it.
	desired  int
	replicas map[int]*replica
	// instances is the latest List result, kept current with our own launches and
	// terminations so that probe-triggered passes need not list again.
	instances []launcher.Instance
	observed  bool
	// eventSeq orders launch completions against List calls.
	eventSeq uint64
	gone     map[string]time.Time
	// stopping are the instances whose Terminate is under way: a List may still show them,
	// and a pass must neither terminate one again nor adopt it as a replica of its own.
	stopping map[string]bool
	// notices are the instances an infra warned will be reclaimed (spot interruption
	// notices), with when; their replicas serve on but are replaced now.
	notices map[string]time.Time
	// versions by number, target the version new replicas launch as, rollout the latest
	// rollout (nil if none).
	versions map[int]Version
	target   int
	rollout  *Rollout
	// failures and lastFail are the launch backoff, per kind (spot true, on-demand false).
	failures map[bool]int
	lastFail map[bool]time.Time
	shutdown bool
	workCtx  context.Context
	workers  sync.WaitGroup
	launches sync.WaitGroup

	ready atomic.Pointer[readySet]
	// publishing turns on at Start's first publication: until then changes are not sent, so
	// that a restarted controller's first set reflects probes, not only stored statuses.
	publishing atomic.Bool
	pubMu      sync.Mutex
	published  uint64
}

// replica is the manager's state for one replica.
type replica struct {
	rec         Record
	probe       probeState
	launching   bool
	terminating bool
	// launched is the instance our Launch returned, and launchSeq when; a List begun before
	// then may not show it yet.
	launched  *launcher.Instance
	launchSeq uint64
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

// readySet is an immutable published READY set.
type readySet struct {
	version   uint64
	endpoints []Endpoint
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
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = DefaultProbeInterval
	}
	if cfg.ReconcileInterval <= 0 {
		cfg.ReconcileInterval = DefaultReconcileInterval
	}
	if cfg.FailureThreshold <= 0 {
		cfg.FailureThreshold = DefaultFailureThreshold
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
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
	m.ready.Store(&readySet{})
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
	defer func() {
		cancel()
		m.workers.Wait()
	}()
	m.mu.Lock()
	m.workCtx = workCtx
	m.mu.Unlock()

	m.safeReconcile(workCtx)
	m.awaitFirstProbes(workCtx)
	m.publish(true)

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
	m.mu.Lock()
	var hit *replica
	for _, r := range m.replicas {
		if r.rec.InstanceID == instance && live(r.rec.Status) {
			hit = r
			break
		}
	}
	_, known := m.notices[instance]
	if hit == nil || known {
		m.mu.Unlock()
		return hit != nil
	}
	m.notices[instance] = at
	m.recordPreemptionLocked(hit)
	m.log.Warn("spot interruption notice: replacing the replica before its instance is reclaimed",
		zap.Int("replica", hit.rec.ID), zap.String("instance", instance), zap.Time("reclaimed_at", at))
	m.mu.Unlock()
	m.kickLoop()
	return true
}

// SetDesired sets how many replicas should run. Until it is first called the manager keeps
// the replicas it finds (at least min_replicas), so a restart changes nothing.
func (m *Manager) SetDesired(n int) {
	n = max(n, 0)
	m.mu.Lock()
	changed := m.desired != n
	m.desired = n
	m.mu.Unlock()
	if changed {
		m.log.Info("replica target set", zap.Int("target", n))
		m.kickLoop()
	}
}

// Replicas returns a snapshot of every replica the service has, including recently failed
// ones, ordered by id, for `serve status`.
func (m *Manager) Replicas() []Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.loadLocked(); err != nil {
		m.log.Warn("load replica records", zap.Error(err))
	}
	out := make([]Record, 0, len(m.replicas))
	for _, id := range sortedKeys(m.replicas) {
		out = append(out, m.replicas[id].rec)
	}
	return out
}

// Ready returns the current READY set, ordered by replica id.
func (m *Manager) Ready() []Endpoint {
	return slices.Clone(m.ready.Load().endpoints)
}

// Shutdown takes the service down: every replica becomes SHUTTING_DOWN, the empty READY set is
// published, every instance of the service is terminated (launches under way are waited for
// first) and the records are deleted. It works whether or not Start runs, and calling it again
// finishes what an interrupted call left.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.mu.Lock()
	if err := m.loadLocked(); err != nil {
		m.mu.Unlock()
		return fmt.Errorf("replicas: shutdown %s: %w", m.cfg.Service, err)
	}
	if !m.shutdown {
		m.log.Info("shutting down service")
	}
	m.shutdown = true
	now := m.cfg.Now()
	for _, id := range sortedKeys(m.replicas) {
		r := m.replicas[id]
		m.stopProberLocked(r)
		if r.rec.Status != StatusShuttingDown {
			m.transitionLocked(now, r, StatusShuttingDown, "service shutting down", nil)
		}
	}
	m.setReadyLocked()
	m.mu.Unlock()
	m.publish(true)

	launched := make(chan struct{})
	go func() {
		m.launches.Wait()
		close(launched)
	}()
	select {
	case <-launched:
	case <-ctx.Done():
		return fmt.Errorf("replicas: shutdown %s: waiting for launches: %w", m.cfg.Service, ctx.Err())
	}

	insts, err := m.cfg.Provider.List(ctx, m.selector)
	if err != nil {
		return fmt.Errorf("replicas: shutdown %s: list instances: %w", m.cfg.Service, err)
	}
	errs := make([]error, len(insts))
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxConcurrentLaunches)
	for i, inst := range insts {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := m.cfg.Provider.Terminate(ctx, inst.ID); err != nil {
				errs[i] = fmt.Errorf("terminate %s: %w", inst.ID, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("replicas: shutdown %s: %w", m.cfg.Service, err)
	}

	recs, err := m.cfg.Store.ListReplicas(m.cfg.Service)
	if err != nil {
		return fmt.Errorf("replicas: shutdown %s: %w", m.cfg.Service, err)
	}
	for _, rec := range recs {
		if err := m.cfg.Store.DeleteReplica(m.cfg.Service, rec.ID); err != nil {
			errs = append(errs, err)
		}
	}
	m.mu.Lock()
	for _, r := range m.replicas {
		m.stopProberLocked(r)
	}
	m.replicas = map[int]*replica{}
	m.instances = nil
	m.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("replicas: shutdown %s: delete records: %w", m.cfg.Service, err)
	}
	m.log.Info("service shut down", zap.Int("instances_terminated", len(insts)))
	return nil
}

// safeReconcile runs one full pass; a panic in it is logged and the loop goes on.
func (m *Manager) safeReconcile(ctx context.Context) {
	defer m.recoverPanic("reconcile")
	m.reconcile(ctx)
}

// reconcile lists the service's instances and runs a pass against them.
func (m *Manager) reconcile(ctx context.Context) {
	m.mu.Lock()
	if m.shutdown {
		m.mu.Unlock()
		return
	}
	if err := m.loadLocked(); err != nil {
		m.mu.Unlock()
		m.log.Warn("load replica records; will retry", zap.Error(err))
		return
	}
	seq := m.eventSeq
	m.mu.Unlock()

	listCtx, cancel := context.WithTimeout(ctx, listTimeout)
	insts, err := m.cfg.Provider.List(listCtx, m.selector)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("list instances; will retry", zap.Error(err))
		}
		return
	}

	m.mu.Lock()
	defer func() {
		m.mu.Unlock()
		m.publish(false)
	}()
	m.observeLocked(insts, seq)
	m.passLocked()
}

// observeLocked takes a List result begun at seq as the current observation, minus instances
// we terminated since, plus instances our launches made since.
func (m *Manager) observeLocked(insts []launcher.Instance, seq uint64) {
	now := time.Now()
	for id, at := range m.gone {
		if now.Sub(at) > goneTTL {
			delete(m.gone, id)
		}
	}
	seen := map[string]bool{}
	observed := make([]launcher.Instance, 0, len(insts))
	for _, inst := range insts {
		if _, ok := m.gone[inst.ID]; ok || m.stopping[inst.ID] {
			continue
		}
		seen[inst.ID] = true
		observed = append(observed, inst)
	}
	for _, r := range m.replicas {
		if r.launched != nil && r.launchSeq > seq && !seen[r.launched.ID] {
			observed = append(observed, *r.launched)
		}
	}
	m.instances = observed
	m.observed = true
	// A notice is kept while the instance is listed: it may be reclaimed late, or a List may
	// begin before the notice and still show it running.
	for id, at := range m.notices {
		if !seen[id] && now.Sub(at) > goneTTL {
			delete(m.notices, id)
		}
	}
}

// passLocked decides on the latest observation and acts on it.
func (m *Manager) passLocked() {
	if m.shutdown || !m.observed || !m.loaded || m.workCtx == nil || m.workCtx.Err() != nil {
		return
	}
	now := m.cfg.Now()
	in := planInput{
		Now:                 now,
		Service:             m.cfg.Service,
		Desired:             m.desired,
		InitialDelay:        m.initialDelay(),
		FailureThreshold:    m.cfg.FailureThreshold,
		ConsecutiveFailures: m.failures[false],
		LastFailure:         m.lastFail[false],
		SpotFailures:        m.failures[true],
		SpotLastFailure:     m.lastFail[true],
		KeepFailed:          keepFailed,
		Instances:           m.instances,
		Drain:               m.cfg.Busy != nil,
		InfraRank:           m.cfg.InfraRank,
		Mix:                 m.mixLocked(),
	}
	for _, id := range sortedKeys(m.replicas) {
		r := m.replicas[id]
		switch {
		case r.rec.Status != StatusReady:
			r.healthySince = time.Time{}
		case r.healthySince.IsZero() && r.probe.OK:
			r.healthySince = now
		}
		_, noticed := m.notices[r.rec.InstanceID]
		in.Replicas = append(in.Replicas, replicaView{Record: r.rec, Probe: r.probe, Launching: r.launching,
			Terminating: r.terminating, Draining: m.drainingLocked(now, r), HealthySince: r.healthySince,
			Noticed: noticed && r.rec.InstanceID != ""})
	}
	m.versionInputLocked(&in)
	acts := plan(in)
	// A rollout decision (switch traffic, succeed, roll back) is saved before anything acts
	// on it; then the pass is planned again under it. Each verdict ends or latches a state,
	// so this settles within a few rounds.
	for range 4 {
		if acts.Rollout == nil || !m.rolloutChangedLocked(now, acts.Rollout) {
			break
		}
		m.versionInputLocked(&in)
		acts = plan(in)
	}
	m.applyLocked(now, acts)
	if m.desired < 0 {
		// First pass after a (re)start with no target yet: keep what runs.
		m.desired = max(m.taskLocked(m.target).Service.ReplicaPolicy.MinReplicas, m.liveLocked())
		m.log.Info("replica target taken from running replicas", zap.Int("target", m.desired))
		m.kickLoop()
	}
	m.setReadyLocked()
}

// drainingLocked reports whether a scaled-down replica still serves requests it took while it
// was READY, within the drain timeout.
func (m *Manager) drainingLocked(now time.Time, r *replica) bool {
	if m.cfg.Busy == nil || r.rec.Status != StatusShuttingDown || r.rec.Endpoint == "" {
		return false
	}
	if r.drainingSince.IsZero() {
		r.drainingSince = now
	}
	if now.Sub(r.drainingSince) >= m.cfg.DrainTimeout {
		m.log.Warn("drain timed out; terminating with requests in flight", zap.Int("replica", r.rec.ID),
			zap.Duration("drain_timeout", m.cfg.DrainTimeout))
		return false
	}
	return m.cfg.Busy(r.rec.Endpoint) > 0
}

func (m *Manager) initialDelay() time.Duration {
	if s := m.taskLocked(m.target).Service.ReadinessProbe.InitialDelaySeconds; s > 0 {
		return time.Duration(s) * time.Second
	}
	return DefaultInitialDelay
}

// applyLocked carries out a plan. Each status change is saved before its action starts.
func (m *Manager) applyLocked(now time.Time, acts actions) {
	for _, rec := range acts.Adopt {
		r := &replica{rec: rec}
		m.replicas[rec.ID] = r
		m.save(r)
		m.log.Info("adopted replica", zap.Int("replica", rec.ID), zap.String("instance", rec.InstanceID),
			zap.String("status", string(rec.Status)), zap.String("reason", rec.Reason))
	}
	for _, tr := range acts.Transitions {
		if r := m.replicas[tr.ID]; r != nil {
			if tr.To == StatusPreempted {
				m.recordPreemptionLocked(r)
			}
			m.transitionLocked(now, r, tr.To, tr.Reason, tr.Instance)
		}
	}
	for _, inst := range acts.Follow {
		m.followLocked(inst)
	}
	for _, id := range acts.Relabel {
		if r := m.replicas[id]; r != nil && r.rec.Version != m.target {
			m.log.Info("replica relabelled", zap.Int("replica", id), zap.Int("from_version", r.rec.Version), zap.Int("to_version", m.target))
			r.rec.Version = m.target
			m.save(r)
		}
	}
	for _, t := range acts.Terminate {
		m.terminateLocked(t)
	}
	for _, id := range acts.Forget {
		m.forgetLocked(id)
	}
	if !acts.LaunchDeferredUntil.IsZero() {
		m.log.Debug("launch deferred after repeated failures", zap.Time("until", acts.LaunchDeferredUntil),
			zap.Int("failures", m.failures[false]), zap.Int("spot_failures", m.failures[true]))
	}
	for range acts.Launch {
		m.launchLocked(now, false)
	}
	for range acts.LaunchSpot {
		m.launchLocked(now, true)
	}
	for _, r := range m.replicas {
		if probeable(r.rec.Status) && r.rec.Endpoint != "" {
			m.ensureProberLocked(r, 0)
		}
	}
}

// followLocked takes a new endpoint from the replica's instance; the prober restarts on it.
func (m *Manager) followLocked(inst launcher.Instance) {
	id, err := strconv.Atoi(inst.Labels[launcher.LabelReplicaID])
	r := m.replicas[id]
	if err != nil || r == nil || r.rec.InstanceID != inst.ID {
		return
	}
	m.log.Info("replica endpoint", zap.Int("replica", id), zap.String("from", r.rec.Endpoint), zap.String("to", inst.Endpoint))
	was := r.rec.Endpoint
	followInstance(&r.rec, &inst)
	m.stopProberLocked(r)
	// Probes of the old address say nothing of the new one: serve it only once it answers.
	r.probe = probeState{}
	if was != "" && r.rec.Status == StatusReady {
		// NOT_READY, not STARTING: the initial delay counts from launch, long past.
		m.transitionLocked(m.cfg.Now(), r, StatusNotReady, "endpoint changed to "+inst.Endpoint, nil)
		return
	}
	m.save(r)
}

// transitionLocked moves r to status to, saves and logs it.
func (m *Manager) transitionLocked(now time.Time, r *replica, to Status, reason string, inst *launcher.Instance) {
	from := r.rec.Status
	r.rec.Status, r.rec.Reason = to, reason
	if inst != nil {
		followInstance(&r.rec, inst)
	}
	kind := r.rec.Spot && m.mixLocked().UseSpot // a service without spot is one pool
	// Only the version being launched backs its launches off: the failures of a version
	// rolled back from say nothing of the one restored.
	current := m.launchedAsLocked(r.rec.Version) == m.launchedAsLocked(m.target)
	switch {
	case !current:
	case to == StatusReady:
		if r.rec.ReadyAt.IsZero() {
			r.rec.ReadyAt = now
		}
		m.failures[kind] = 0
	case to == StatusFailedProvision, to.Terminal() && to != StatusPreempted && r.rec.ReadyAt.IsZero():
		// Replicas that never served: a broken program or image, or no capacity; back off
		// relaunching that kind.
		m.failures[kind]++
		m.lastFail[kind] = now
	}
	if !probeable(to) {
		m.stopProberLocked(r)
	}
	m.save(r)
	fields := []zap.Field{zap.Int("replica", r.rec.ID), zap.String("from", string(from)),
		zap.String("to", string(to)), zap.String("instance", r.rec.InstanceID)}
	if reason != "" {
		fields = append(fields, zap.String("reason", reason))
	}
	if to.Terminal() {
		m.log.Warn("replica status", fields...)
	} else {
		m.log.Info("replica status", fields...)
	}
}

func (m *Manager) save(r *replica) {
	if err := m.cfg.Store.SaveReplica(r.rec); err != nil {
		m.log.Error("save replica record", zap.Int("replica", r.rec.ID), zap.Error(err))
	}
}

// forgetLocked deletes a record for good.
func (m *Manager) forgetLocked(id int) {
	r := m.replicas[id]
	if r == nil {
		return
	}
	m.stopProberLocked(r)
	delete(m.replicas, id)
	if err := m.cfg.Store.DeleteReplica(m.cfg.Service, id); err != nil {
		m.log.Error("delete replica record", zap.Int("replica", id), zap.Error(err))
	}
	m.log.Debug("forgot replica", zap.Int("replica", id), zap.String("status", string(r.rec.Status)))
}

// mixLocked is how the target version's task splits replicas between spot and on-demand.
func (m *Manager) mixLocked() policy.MixSpec {
	task := m.taskLocked(m.target)
	return MixFor(task.Resources, task.Service.ReplicaPolicy)
}

// liveLocked counts replicas that count toward the target.
func (m *Manager) liveLocked() int {
	n := 0
	for _, r := range m.replicas {
		if live(r.rec.Status) {
			n++
		}
	}
	return n
}

// loadLocked reads the service's records from the store once.
func (m *Manager) loadLocked() error {
	if m.loaded {
		return nil
	}
	recs, err := m.cfg.Store.ListReplicas(m.cfg.Service)
	if err != nil {
		return err
	}
	for _, rec := range recs {
		m.replicas[rec.ID] = &replica{rec: rec}
	}
	m.loaded = true
	return nil
}

// launchLocked records a new PROVISIONING replica and starts its Launch in the background.
func (m *Manager) launchLocked(now time.Time, spot bool) {
	task := m.taskLocked(m.target)
	id, err := m.nextIDLocked()
	if err != nil {
		m.log.Error("allocate replica id", zap.Error(err))
		return
	}
	r := &replica{
		rec: Record{
			Service:    m.cfg.Service,
			ID:         id,
			Version:    m.target,
			Status:     StatusProvisioning,
			Spot:       spot,
			Resources:  describeResources(withSpot(task.Resources, spot)),
			LaunchedAt: now,
		},
		launching: true,
	}
	m.replicas[id] = r
	m.save(r)
	m.log.Info("replica status", zap.Int("replica", id), zap.String("to", string(StatusProvisioning)))
	spec := replicaSpec(m.cfg.Service, m.target, task, id, spot)
	if spot && task.Service.ReplicaPolicy.SpotPlacer == configs.SpotPlacerDynamicFallback {
		spec.Spread = m.spotByZoneLocked()
	}
	ctx := m.workCtx
	m.workers.Add(1)
	m.launches.Add(1)
	go func() {
		defer m.workers.Done()
		defer m.launches.Done()
		m.runLaunch(ctx, r, spec)
	}()
}

// spotByZoneLocked maps live spot replicas' instances to their zones, for SpotHedge.
func (m *Manager) spotByZoneLocked() map[string]string {
	out := map[string]string{}
	for _, r := range m.replicas {
		if r.rec.Spot && live(r.rec.Status) && r.rec.Infra != "" && r.rec.InstanceID != "" {
			out[r.rec.InstanceID] = launcher.ZoneKey(r.rec.Infra, "", r.rec.Zone)
		}
	}
	return out
}

// recordPreemptionLocked tells the provider where a replica was preempted.
func (m *Manager) recordPreemptionLocked(r *replica) {
	rec, ok := m.cfg.Provider.(PreemptionRecorder)
	if !ok {
		return
	}
	for _, inst := range m.instances {
		if inst.ID == r.rec.InstanceID {
			rec.Preempted(inst)
			return
		}
	}
}

// PreemptionRecorder is an optional Provider capability: told where a spot replica was
// preempted, it avoids that zone for the next spot launches (the provisioner's SpotHedge).
type PreemptionRecorder interface {
	Preempted(inst launcher.Instance)
}

// nextIDLocked asks the store for an id no replica here holds (the store is the authority,
// but a lost store must not hand out the id of an adopted replica).
func (m *Manager) nextIDLocked() (int, error) {
	for range 1000 {
		id, err := m.cfg.Store.NextReplicaID(m.cfg.Service)
		if err != nil {
			return 0, err
		}
		if _, taken := m.replicas[id]; !taken {
			return id, nil
		}
	}
	return 0, errors.New("store keeps returning replica ids already in use")
}

// runLaunch calls the provider outside the lock and records the outcome.
func (m *Manager) runLaunch(ctx context.Context, r *replica, spec launcher.Spec) {
	var (
		inst launcher.Instance
		err  error
	)
	select {
	case m.sem <- struct{}{}:
		inst, err = m.safeLaunch(ctx, spec)
		<-m.sem
	case <-ctx.Done():
		err = ctx.Err()
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	r.launching = false
	now := m.cfg.Now()
	if err != nil {
		if ctx.Err() != nil {
			// The controller is stopping: leave PROVISIONING for the next one to resolve.
			return
		}
		if m.replicas[r.rec.ID] == r {
			m.transitionLocked(now, r, StatusFailedProvision, err.Error(), nil)
			m.kickLoop()
		}
		return
	}
	m.eventSeq++
	r.launched, r.launchSeq = &inst, m.eventSeq
	// A List that overlapped the launch may already hold this instance; a second copy would
	// read as a stray of its own replica and be terminated.
	if i := slices.IndexFunc(m.instances, func(o launcher.Instance) bool { return o.ID == inst.ID }); i >= 0 {
		m.instances[i] = inst
	} else {
		m.instances = append(m.instances, inst)
	}
	if m.shutdown || m.replicas[r.rec.ID] != r {
		// Shutdown lists and terminates every instance after launches finish.
		m.transitionLocked(now, r, StatusShuttingDown, "service shutting down", &inst)
		return
	}
	r.rec.LaunchedAt = now // the initial delay counts from here
	m.transitionLocked(now, r, StatusStarting, "", &inst)
	m.ensureProberLocked(r, firstProbeAfterLaunch)
}

// safeLaunch turns a panicking provider into a failed launch.
func (m *Manager) safeLaunch(ctx context.Context, spec launcher.Spec) (inst launcher.Instance, err error) {
	defer func() {
		if p := recover(); p != nil {
			m.log.Error("provider Launch panicked", zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
			err = fmt.Errorf("provider panicked: %v", p)
		}
	}()
	return m.cfg.Provider.Launch(ctx, spec)
}

// terminateLocked starts Terminate for one instance in the background.
func (m *Manager) terminateLocked(t termination) {
	r := m.replicas[t.ReplicaID]
	if r != nil {
		if r.terminating {
			return
		}
		r.terminating = true
	}
	if m.stopping[t.InstanceID] {
		return
	}
	m.stopping[t.InstanceID] = true
	m.instances = slices.DeleteFunc(m.instances, func(i launcher.Instance) bool { return i.ID == t.InstanceID })
	ctx := m.workCtx
	m.workers.Add(1)
	go func() {
		defer m.workers.Done()
		defer m.recoverPanic("terminate")
		err := m.cfg.Provider.Terminate(ctx, t.InstanceID)
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.stopping, t.InstanceID)
		if r != nil {
			r.terminating = false
		}
		if err != nil {
			m.log.Warn("terminate instance; will retry", zap.String("instance", t.InstanceID), zap.Error(err))
			return
		}
		m.gone[t.InstanceID] = time.Now()
		m.instances = slices.DeleteFunc(m.instances, func(i launcher.Instance) bool { return i.ID == t.InstanceID })
		m.log.Info("terminated instance", zap.Int("replica", t.ReplicaID), zap.String("instance", t.InstanceID))
		if t.Forget && r != nil && m.replicas[t.ReplicaID] == r {
			m.forgetLocked(t.ReplicaID)
		}
	}()
}

// kickLoop asks the loop for a full pass now.
func (m *Manager) kickLoop() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// setReadyLocked swaps in a new READY set if membership changed.
func (m *Manager) setReadyLocked() {
	var endpoints []Endpoint
	if !m.shutdown {
		var ready []Record
		for _, id := range sortedKeys(m.replicas) {
			if r := m.replicas[id]; r.rec.Status == StatusReady && r.rec.Endpoint != "" {
				ready = append(ready, r.rec)
			}
		}
		for _, rec := range serving(m.rollout, m.target, m.launchedAsLocked, ready) {
			acc := accelerator(m.taskLocked(rec.Version).Resources)
			endpoints = append(endpoints, Endpoint{ReplicaID: rec.ID, Version: rec.Version, Addr: rec.Endpoint, Accelerator: acc})
		}
	}
	cur := m.ready.Load()
	if slices.Equal(cur.endpoints, endpoints) {
		return
	}
	m.ready.Store(&readySet{version: cur.version + 1, endpoints: endpoints})
}

// publish hands the current READY set to OnReady if it changed since the last call, or always
// with force (Start's first publication, Shutdown).
// The lock makes calls sequential, and each call sends the newest set, so the last change
// is never lost.
func (m *Manager) publish(force bool) {
	m.pubMu.Lock()
	defer m.pubMu.Unlock()
	if force {
		m.publishing.Store(true)
	}
	set := m.ready.Load()
	if !m.publishing.Load() || (!force && set.version == m.published) {
		return
	}
	m.published = set.version
	m.log.Info("ready set", zap.Int("ready", len(set.endpoints)))
	if m.cfg.OnReady == nil {
		return
	}
	defer m.recoverPanic("OnReady")
	m.cfg.OnReady(slices.Clone(set.endpoints))
}

// awaitFirstProbes waits until every probed replica has a first result, or firstProbesWait.
func (m *Manager) awaitFirstProbes(ctx context.Context) {
	deadline := time.NewTimer(firstProbesWait)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if m.firstProbesDone() {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			return
		case <-tick.C:
		}
	}
}

func (m *Manager) firstProbesDone() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.replicas {
		if r.stopProbe != nil && r.probe.At.IsZero() {
			return false
		}
	}
	return true
}

func (m *Manager) recoverPanic(what string) {
	if p := recover(); p != nil {
		m.log.Error("recovered panic", zap.String("in", what), zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
	}
}
