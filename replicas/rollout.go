package replicas

import (
	"errors"
	"reflect"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
)

// A rollout moves a service from one version of its task to the next (`ferry serve update`).
// It is level-triggered like the rest of reconciliation: each pass counts the replicas of the
// new version and of older ones and decides how many of each to keep and to launch, so a
// controller killed at any point resumes from what it finds. The rollout's own state (which
// versions, whether blue-green traffic switched, how it ended) is saved before any replica
// acts on it.

// RolloutState is where a rollout stands.
type RolloutState string

// Rollout states.
const (
	RolloutInProgress RolloutState = "IN_PROGRESS"
	RolloutSucceeded  RolloutState = "SUCCEEDED"
	// RolloutRolledBack: the new version failed and the previous one serves again.
	RolloutRolledBack RolloutState = "ROLLED_BACK"
	// RolloutFailed: the new version failed and there was nothing to roll back to (the
	// previous version never served, or auto_rollback is off); the new version stays the
	// target and keeps being retried with backoff.
	RolloutFailed RolloutState = "FAILED"
)

// Version is one version of a service's task.
type Version struct {
	Number int
	Task   *configs.Task
	// LaunchedAs is the version whose instances this one reuses: itself, or an earlier version
	// whose task differs only in the `service:` section, so its replicas were relabelled, not
	// relaunched. Instance labels keep the version they were launched as.
	LaunchedAs int
}

// Rollout is the latest update of a service, as saved and as `serve status` shows it.
type Rollout struct {
	From int    `json:"from"`
	To   int    `json:"to"`
	Mode string `json:"mode"`
	// Policy is the knobs, from the new version's service.update (mode possibly overridden).
	Policy configs.Update `json:"policy"`
	State  RolloutState   `json:"state"`
	// Switched is set once blue-green traffic moved to the new version.
	Switched bool `json:"switched,omitempty"`
	// FromServed says whether the previous version ever had a READY replica: only then is
	// there a good version to roll back to.
	FromServed bool      `json:"from_served"`
	StartedAt  time.Time `json:"started_at"`
	// ProgressAt is the start or the last time a new replica became healthy; the progress
	// deadline counts from it.
	ProgressAt time.Time `json:"progress_at"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// Reason says why the rollout ended as it did (or what it waits for).
	Reason string `json:"reason,omitempty"`

	// Live counts, filled for status output only.
	NewHealthy int `json:"new_healthy"`
	NewReady   int `json:"new_ready"`
	OldLive    int `json:"old_live"`
	Desired    int `json:"desired"`
}

// Active reports whether the rollout is still in progress.
func (r *Rollout) Active() bool { return r != nil && r.State == RolloutInProgress }

// Target is the version new replicas launch with under this rollout.
func (r *Rollout) Target() int {
	if r.State == RolloutRolledBack {
		return r.From
	}
	return r.To
}

// maxParallel is how many new replicas may be starting at once for a target of desired.
func maxParallel(u configs.Update, desired int) int {
	if u.MaxParallel > 0 {
		return u.MaxParallel
	}
	return max(1, (desired+3)/4)
}

// RolloutStore persists rollouts; the controller's store implements it. SaveRollout also
// records the service's current version (r.Target()), in one transaction; StartUpdate records
// a new version and the rollout to it, in one transaction.
type RolloutStore interface {
	SaveRollout(service string, r Rollout) error
	StartUpdate(service string, v Version, r Rollout) error
}

func launchedAsOr(v Version, number int) int {
	if v.LaunchedAs != 0 {
		return v.LaunchedAs
	}
	return number
}

// serving picks, among READY records, those that get traffic: every version during a rolling
// update; during blue-green, the old versions until the switch and the new one after it
// (either side when the other has none READY, rather than no replica at all).
func serving(r *Rollout, target int, launchedAs func(int) int, ready []Record) []Record {
	if r == nil || r.Mode != configs.UpdateBlueGreen || !(r.State == RolloutInProgress || r.State == RolloutFailed) {
		return ready
	}
	var cur, old []Record
	for _, rec := range ready {
		if launchedAs(rec.Version) == launchedAs(target) {
			cur = append(cur, rec)
		} else {
			old = append(old, rec)
		}
	}
	if (r.Switched && len(cur) > 0) || len(old) == 0 {
		return cur
	}
	return old
}

// startRollout starts rolling the service out to version v under rollout r, both saved. From
// here new replicas launch as r.Target() and each pass follows r.
func (m *Manager) startRollout(v Version, r Rollout) {
	v.LaunchedAs = launchedAsOr(v, v.Number)
	m.step(func() { // StartUpdate calls it in the executor: not do
		m.versions[v.Number] = v
		m.rollout = &r
		m.target = r.Target()
	})
	m.log.Info("rollout started", zap.Int("from", r.From), zap.Int("to", r.To), zap.String("mode", r.Mode),
		zap.Bool("relaunch", v.LaunchedAs == v.Number))
	m.kickLoop()
}

// Rollout returns the latest rollout with its live counts, or nil if the service never had one.
func (m *Manager) Rollout() *Rollout {
	s := m.snap.Load()
	if s.rollout == nil {
		return nil
	}
	r := *s.rollout
	r.Desired = s.desired
	minHealthy := time.Duration(r.Policy.MinHealthySeconds) * time.Second
	now := m.cfg.Now()
	for i, rec := range s.records {
		switch {
		case !live(rec.Status):
		case s.launchedAsOf(rec.Version) != s.launchedAsOf(s.target):
			r.OldLive++
		case rec.Status == StatusReady:
			r.NewReady++
			if since := s.healthySince[i]; !since.IsZero() && now.Sub(since) >= minHealthy {
				r.NewHealthy++
			}
		}
	}
	return &r
}

// TargetVersion returns the version new replicas launch as.
func (m *Manager) TargetVersion() int {
	return m.snap.Load().target
}

// taskOwned is version v's task; a version this manager does not know (an instance adopted
// from a lost store) is treated as the current one.
func (m *Manager) taskOwned(v int) *configs.Task {
	if ver, ok := m.versions[v]; ok && ver.Task != nil {
		return ver.Task
	}
	return m.versions[m.target].Task
}

func (m *Manager) launchedAsOwned(v int) int {
	if ver, ok := m.versions[v]; ok {
		return launchedAsOr(ver, v)
	}
	return v
}

// versionInputOwned fills the version and rollout fields of a pass's input.
func (m *Manager) versionInputOwned(in *planInput) {
	in.Target = m.target
	in.LaunchedAs = make(map[int]int, len(m.versions))
	for n, v := range m.versions {
		in.LaunchedAs[n] = launchedAsOr(v, n)
	}
	in.Rollout = nil
	in.SwitchAt = 0
	if m.rollout != nil {
		r := *m.rollout
		in.Rollout = &r
		// Blue-green moves traffic once the new version can carry the whole target, at least
		// min_replicas. SkyServe switches at min_replicas, which drops capacity whenever the
		// target is above it.
		in.SwitchAt = max(in.Desired, m.taskOwned(r.To).Service.ReplicaPolicy.MinReplicas)
	}
}

// verdictOwned is the rollout after a plan's verdict on it, and whether that changed it.
func (m *Manager) verdictOwned(now time.Time, ch *rolloutChange) (Rollout, bool) {
	r := *m.rollout
	if !ch.ProgressAt.IsZero() && ch.ProgressAt.After(r.ProgressAt) {
		r.ProgressAt = ch.ProgressAt
	}
	if ch.Switched {
		r.Switched = true
	}
	if ch.End != "" {
		r.State, r.Reason, r.FinishedAt = ch.End, ch.Reason, now
	}
	return r, r != *m.rollout
}

// commitVerdict saves next, the verdict ch on the rollout prev, and makes it the manager's,
// unless an update replaced prev meanwhile (then the pass plans again under the new one). It
// reports false when the save failed: acting on a decision that is not on disk could be undone
// by a restart halfway, so the pass acts without it and the next one tries again. It runs in
// the executor, as StartUpdate's write does, so a verdict on a rollout an update just replaced
// never overwrites it on disk.
func (m *Manager) commitVerdict(prev *Rollout, next Rollout, ch *rolloutChange) bool {
	var replaced bool
	m.own(func() { replaced = m.rollout != prev })
	if replaced {
		return true
	}
	if rs, ok := m.cfg.Store.(RolloutStore); ok {
		if err := rs.SaveRollout(m.cfg.Service, next); err != nil {
			m.log.Error("save rollout; will retry", zap.Error(err))
			return false
		}
	}
	m.step(func() { m.adoptVerdictOwned(prev, next, ch) }) // in the executor: not do
	return true
}

// adoptVerdictOwned makes next, the saved verdict ch on prev, the manager's rollout.
func (m *Manager) adoptVerdictOwned(prev *Rollout, next Rollout, ch *rolloutChange) {
	m.rollout = &next
	m.target = next.Target()
	switch {
	case ch.Switched && !prev.Switched:
		m.log.Info("rollout switched traffic", zap.Int("to", next.To))
	case ch.End == RolloutSucceeded:
		m.log.Info("rollout succeeded", zap.Int("version", next.To), zap.String("reason", next.Reason))
	case ch.End != "":
		m.log.Warn("rollout failed", zap.Int("from", next.From), zap.Int("to", next.To), zap.String("state", string(next.State)),
			zap.String("reason", next.Reason))
	}
	// A rollback starts the old version's launches afresh.
	if ch.End == RolloutRolledBack {
		m.failures = map[bool]int{}
		m.lastFail = map[bool]time.Time{}
	}
}

// StartUpdate rolls the service out to a new version of its task (`serve update`): it numbers
// the version, decides whether the running replicas can serve it as they are (only service:
// changed: they are relabelled, not relaunched) and which version a failure rolls back to,
// saves both in one write (RolloutStore.StartUpdate), and from then on launches the new
// version. mode (rolling or blue_green) overrides task.Service.Update.Mode. It returns once the
// rollout is on disk, not when it finishes.
func (m *Manager) StartUpdate(task *configs.Task, mode string, now time.Time) (Version, Rollout, error) {
	rs, ok := m.cfg.Store.(RolloutStore)
	if !ok {
		return Version{}, Rollout{}, errors.New("replicas: the store keeps no rollouts")
	}
	// Decided and written in the executor, behind any verdict queued before, so that the
	// rollout it starts from is the one on disk.
	var (
		v   Version
		r   Rollout
		err = errors.New("replicas: the update panicked") // unless the effect runs to its end
	)
	m.do(func() {
		m.queueOwned(func() {
			m.own(func() { v, r = m.nextRolloutOwned(task, mode, now) })
			if err = rs.StartUpdate(m.cfg.Service, v, r); err == nil {
				m.startRollout(v, r)
			}
		})
	})
	if err != nil {
		return Version{}, Rollout{}, err
	}
	return v, r, nil
}

// nextRolloutOwned decides the version and the rollout an update to task starts.
func (m *Manager) nextRolloutOwned(task *configs.Task, mode string, now time.Time) (Version, Rollout) {
	cur := m.target
	next := cur + 1
	for n := range m.versions {
		next = max(next, n+1)
	}
	v := Version{Number: next, Task: task, LaunchedAs: next}
	if onlyServiceChanged(m.taskOwned(cur), task) {
		// Same program, resources and replica port as the version running now: its replicas
		// are this version already.
		v.LaunchedAs = m.launchedAsOwned(cur)
	}
	from, fromServed := m.stableVersionOwned(cur)
	policy := task.Service.Update
	policy.Mode = mode
	r := Rollout{From: from, To: next, Mode: mode, Policy: policy, State: RolloutInProgress,
		FromServed: fromServed, StartedAt: now, ProgressAt: now}
	return v, r
}

// stableVersionOwned is the version a new rollout would roll back to, and whether it ever
// served: the last version that served, not merely the current target (which may be a failed
// one).
func (m *Manager) stableVersionOwned(cur int) (int, bool) {
	prev := m.rollout
	switch {
	case prev == nil:
		served := m.everReady.Load()
		for _, r := range m.replicas {
			if r.rec.Version == cur && !r.rec.ReadyAt.IsZero() {
				served = true
			}
		}
		return cur, served
	case prev.State == RolloutSucceeded:
		return prev.To, true
	default: // rolled back, failed or superseded mid-way: the rollout's own good version
		return prev.From, prev.FromServed
	}
}

// onlyServiceChanged reports whether b differs from a only in its service section, and not in
// the port replicas serve on: then a's replicas can serve as b's.
func onlyServiceChanged(a, b *configs.Task) bool {
	if a == nil || b == nil || a.Service == nil || b.Service == nil || a.Service.Port != b.Service.Port {
		return false
	}
	ac, bc := *a, *b
	ac.Service, bc.Service = nil, nil
	ac.Name, bc.Name = "", ""
	ac.Source, bc.Source = "", ""
	return reflect.DeepEqual(ac, bc)
}

// Resumed is what a restarted controller resumes a service as, from what the store kept.
type Resumed struct {
	// Version is the version new replicas launch as, and Task its task.
	Version int
	Task    *configs.Task
	// Others are the service's other versions (Config.Versions).
	Others []Version
	// Disagreed is set when the rollout's target was not the version the service row said: a
	// controller stopped between saving the two. The rollout wins.
	Disagreed bool
}

// Resume picks the version a restored service runs: the latest rollout's target when there is
// one, whatever the service row (version, task) says, else the row's.
func Resume(version int, task *configs.Task, versions []Version, rollout *Rollout) Resumed {
	r := Resumed{Version: version, Task: task}
	if rollout != nil && rollout.Target() != version {
		r.Version, r.Disagreed = rollout.Target(), true
	}
	for _, v := range versions {
		switch {
		case v.Number != r.Version:
			r.Others = append(r.Others, v)
		case rollout != nil:
			r.Task = v.Task
		}
	}
	return r
}
