package replicas

import (
	"errors"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/policy"
)

// followOwned takes a new endpoint from the replica's instance; the prober restarts on it.
func (m *Manager) followOwned(inst launcher.Instance) {
	id, err := strconv.Atoi(inst.Labels[launcher.LabelReplicaID])
	r := m.replicas[id]
	if err != nil || r == nil || r.rec.InstanceID != inst.ID {
		return
	}
	m.log.Info("replica endpoint", zap.Int("replica", id), zap.String("from", r.rec.Endpoint), zap.String("to", inst.Endpoint))
	was := r.rec.Endpoint
	followInstance(&r.rec, &inst)
	m.stopProberOwned(r)
	// Probes of the old address say nothing of the new one: serve it only once it answers.
	r.probe = probeState{}
	if was != "" && r.rec.Status == StatusReady {
		// NOT_READY, not STARTING: the initial delay counts from launch, long past.
		m.transitionOwned(m.cfg.Now(), r, StatusNotReady, "endpoint changed to "+inst.Endpoint, nil)
		return
	}
	m.saveOwned(r)
}

// transitionOwned moves r to status to, saves and logs it.
func (m *Manager) transitionOwned(now time.Time, r *replica, to Status, reason string, inst *launcher.Instance) {
	from := r.rec.Status
	r.rec.Status, r.rec.Reason = to, reason
	if inst != nil {
		followInstance(&r.rec, inst)
	}
	kind := r.rec.Spot && m.mixOwned().UseSpot // a service without spot is one pool
	// Only the version being launched backs its launches off: the failures of a version
	// rolled back from say nothing of the one restored.
	current := m.launchedAsOwned(r.rec.Version) == m.launchedAsOwned(m.target)
	moving := r.spreadFrom != ""
	if to == StatusReady || to.Terminal() || to == StatusShuttingDown {
		r.spreadFrom = "" // counted as any replica from now on
	}
	switch {
	case !current, moving && to != StatusReady:
		// A spread move that never served says nothing about the service's launches.
	case to == StatusReady:
		if r.rec.ReadyAt.IsZero() {
			r.rec.ReadyAt = now
		}
		m.failures[kind] = 0
		m.everReady.Store(true)
	case to == StatusFailedProvision, to.Terminal() && to != StatusPreempted && r.rec.ReadyAt.IsZero():
		// Replicas that never served: a broken program or image, or no capacity; back off
		// relaunching that kind.
		m.failures[kind]++
		m.lastFail[kind] = now
	}
	if !probeable(to) {
		m.stopProberOwned(r)
	}
	m.saveOwned(r)
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

// The state's owner (loop.go) never waits for a store write or a provider call: a slow disk
// would stall every input of the service. A status change updates the record in memory and
// queues its write (saveOwned); a launch or
// termination is queued behind the writes that must precede it (startOwned); so are rollout
// writes (rollout.go) and publications of the READY set (publish.go). The queue is one ordered
// executor: whoever finds it idle runs it to the end (flush), and whoever queued something
// waits until it ran (do, loop.go). So a record is on disk before the launch or termination
// that follows from it starts, rollout writes never swap, and OnReady calls never overlap,
// without a lock of their own.
//
// Order is kept only where it means something. Writes of different replicas' records touch
// different objects, so a run of them goes to the store at once (writeRecords): a pass that
// launches ten replicas waits for about one write, not ten in a row, which on a busy API server
// is the difference between a fraction of a second and several. A record written twice in a run
// is written once, as it is last: what is on disk afterwards is the same. Effects that only need
// what was queued before them on disk (a start, a publication, do's wake-up) wait for the run
// they fall in to be written and then run in their order: starting or publishing later than
// that never breaks an order, and publishNow sends the newest set. Everything else (a rollout or
// losses write, a verdict) waits for all before it and runs alone.

// effect is one queued store write, start of a provider call, or publication. Effects run
// outside the run loop; one that needs the state posts a step (own, step), never do.
type effect struct {
	run  func()
	kind effectKind
	// record is the replica id whose record a recordWrite writes or deletes.
	record int
}

type effectKind int

const (
	// runsAlone: after every effect queued before it, before any queued after it.
	runsAlone effectKind = iota
	// recordWrite: a write or delete of one replica's record, run beside other records' writes.
	recordWrite
	// runsAfter: needs only the effects queued before it done; may run later than that.
	runsAfter
)

// queueOwned queues fn as an effect that runs alone, after every effect queued before it.
func (m *Manager) queueOwned(fn func()) {
	m.effects = append(m.effects, effect{run: fn, kind: runsAlone})
}

// queueAfterOwned queues fn to run once every effect queued before it is done.
func (m *Manager) queueAfterOwned(fn func()) {
	m.effects = append(m.effects, effect{run: fn, kind: runsAfter})
}

// saveOwned queues a write of r's record as it is now.
func (m *Manager) saveOwned(r *replica) {
	rec := r.rec
	m.effects = append(m.effects, effect{kind: recordWrite, record: rec.ID, run: func() {
		if err := m.cfg.Store.SaveReplica(rec); err != nil {
			m.log.Error("save replica record", zap.Int("replica", rec.ID), zap.Error(err))
		}
	}})
}

// startOwned queues work to start in its own goroutine once the writes queued before it are
// done. The caller has counted it in m.workers (and m.launches) in the same step, so that Start
// and Shutdown wait for it.
func (m *Manager) startOwned(work func()) {
	m.queueAfterOwned(func() { go work() })
}

// flush runs the queued effects unless another caller runs them already; it returns once the
// queue is empty or in the other caller's hands. It takes each batch from the owner of the
// state and runs it outside, so the run loop never waits for a store or a provider.
func (m *Manager) flush() {
	claimed := false
	m.own(func() {
		claimed = !m.flushing
		m.flushing = true
	})
	for claimed {
		var batch []effect
		m.own(func() {
			batch, m.effects = m.effects, nil
			m.flushing = len(batch) > 0
		})
		if len(batch) == 0 {
			return
		}
		m.runBatch(batch)
	}
}

// runBatch runs a batch of effects: each run of record writes at once, one write per record,
// the effects that run after among them once the run is written, the rest alone and in order.
func (m *Manager) runBatch(batch []effect) {
	var (
		writes []effect
		after  []effect
		inRun  = map[int]int{} // record → its index in writes
	)
	settle := func() {
		m.writeRecords(writes)
		for _, e := range after {
			m.runEffect(e.run)
		}
		writes, after = writes[:0], after[:0]
		clear(inRun)
	}
	for _, e := range batch {
		switch e.kind {
		case runsAfter:
			after = append(after, e)
		case recordWrite:
			if i, ok := inRun[e.record]; ok {
				writes[i] = e // the later write of the record stands for both
				continue
			}
			inRun[e.record] = len(writes)
			writes = append(writes, e)
		default:
			settle()
			m.runEffect(e.run)
		}
	}
	settle()
}

// maxRecordWrites bounds the record writes one service has in flight at once.
const maxRecordWrites = 16

// writeRecords runs record writes of different replicas concurrently and returns when all are
// done.
func (m *Manager) writeRecords(writes []effect) {
	if len(writes) == 1 {
		m.runEffect(writes[0].run)
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxRecordWrites)
	for _, e := range writes {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			m.runEffect(e.run)
		})
	}
	wg.Wait()
}

// runEffect runs one effect; a panic is logged, so the queue never stays claimed.
func (m *Manager) runEffect(run func()) {
	defer m.recoverPanic("effect")
	run()
}

// forgetOwned deletes a record for good.
func (m *Manager) forgetOwned(id int) {
	r := m.replicas[id]
	if r == nil {
		return
	}
	m.stopProberOwned(r)
	delete(m.replicas, id)
	m.effects = append(m.effects, effect{kind: recordWrite, record: id, run: func() {
		if err := m.cfg.Store.DeleteReplica(m.cfg.Service, id); err != nil {
			m.log.Error("delete replica record", zap.Int("replica", id), zap.Error(err))
		}
	}})
	m.log.Debug("forgot replica", zap.Int("replica", id), zap.String("status", string(r.rec.Status)))
}

// mixOwned is how the target version's task splits replicas between spot and on-demand.
func (m *Manager) mixOwned() policy.MixSpec {
	task := m.taskOwned(m.target)
	return MixFor(task.Resources, task.Service.ReplicaPolicy)
}

// liveOwned counts replicas that count toward the target.
func (m *Manager) liveOwned() int {
	n := 0
	for _, r := range m.replicas {
		if live(r.rec.Status) {
			n++
		}
	}
	return n
}

// load reads the service's records and spot losses from the store, once, outside the run
// loop.
func (m *Manager) load() error {
	if m.loaded.Load() {
		return nil
	}
	recs, err := m.cfg.Store.ListReplicas(m.cfg.Service)
	if err != nil {
		return err
	}
	losses, err := m.loadLosses()
	if err != nil {
		// The losses only advise the plan: a value that cannot be read (corrupt, or written by
		// a newer controller) starts the history afresh rather than stopping the service.
		m.log.Warn("read spot losses; starting with none", zap.Error(err))
		losses = policy.Losses{}
	}
	m.step(func() {
		if m.loaded.Load() {
			return
		}
		// No loss is recorded before the load: a loss needs a replica, and records come first.
		m.losses = losses
		for _, rec := range recs {
			if _, ok := m.replicas[rec.ID]; !ok {
				m.replicas[rec.ID] = &replica{rec: rec}
			}
			if rec.Status == StatusReady {
				m.everReady.Store(true)
			}
		}
		m.loaded.Store(true)
	})
	return nil
}

// reserveIDs asks the store, outside the run loop, for n replica ids beyond those reserved
// already, all missing ones in one write (a pass that launches ten replicas waits for one
// write, not ten); launches take them (nextIDOwned). The store is the authority, but a lost
// store must not hand out the id of an adopted replica: such ids are skipped.
func (m *Manager) reserveIDs(n int) error {
	for range 1000 {
		var missing int
		m.own(func() { missing = n - len(m.spareIDs) })
		if missing <= 0 {
			return nil
		}
		first, err := m.cfg.Store.NextReplicaIDs(m.cfg.Service, missing)
		if err != nil {
			return err
		}
		m.own(func() {
			for id := first; id < first+missing; id++ {
				if _, taken := m.replicas[id]; !taken {
					m.spareIDs = append(m.spareIDs, id)
				}
			}
		})
	}
	return errors.New("store keeps returning replica ids already in use")
}

// nextIDOwned takes a reserved id that no replica holds.
func (m *Manager) nextIDOwned() (int, bool) {
	for len(m.spareIDs) > 0 {
		id := m.spareIDs[0]
		m.spareIDs = m.spareIDs[1:]
		if _, taken := m.replicas[id]; !taken {
			return id, true
		}
	}
	return 0, false
}
