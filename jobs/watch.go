package jobs

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// startWatch runs the watch of job id's gang in a goroutine that owns its nodes.
func (m *Manager) startWatch(id int64) {
	ctx, done, ok := m.own(m.ctx, id)
	if !ok {
		return
	}
	m.spawn("watch", func() {
		defer m.Poke() // after done: the queue may relaunch the job only once it is let go
		defer done()
		defer func() {
			// A panic here would leave the job RUNNING with nobody watching: say so.
			if r := recover(); r != nil {
				m.transition(id, FailedController, fmt.Sprintf("the controller failed watching it: %v", r), nil)
				m.release(context.WithoutCancel(ctx), id, FailedController, "")
				panic(r)
			}
		}()
		m.watch(ctx, id)
	})
}

// watch looks at the gang every WatchInterval until it ends, it is cancelled, or ctx ends.
func (m *Manager) watch(ctx context.Context, id int64) {
	t := time.NewTicker(m.cfg.WatchInterval)
	defer t.Stop()
	limit, stopLimit := m.deadline(id) // capacity.go
	defer stopLimit()
	var w watchState
	for {
		select {
		case <-ctx.Done():
			if cur, err := m.Get(id); err == nil && cur.State == Cancelling {
				m.release(context.WithoutCancel(ctx), id, Cancelled, "cancelled by the user")
			}
			return
		case <-t.C:
		case <-limit:
		}
		if m.look(ctx, id, &w) {
			return
		}
	}
}

// watchState is what a watch remembers between looks.
type watchState struct {
	// failedAt is when a failure was first seen on a gang with spot nodes still up.
	failedAt time.Time
	// unknownSince is when a gap first hid a node of the gang (zero while every node is seen),
	// and hiddenWhere names the gaps the job's reason last reported: the reason and the log
	// change when what is hidden changes, not at every look.
	unknownSince time.Time
	hiddenWhere  string
	// seenReason is the job's reason before its nodes were hidden, given back when they are
	// seen again; unknownReason is the one the watch set meanwhile.
	seenReason, unknownReason string
	// grewAt is when an elastic job last asked for its missing nodes (elastic.go).
	grewAt time.Time
}

// spotSettle is how long a failure on a gang whose spot nodes are still up waits for a
// preemption warning before it is judged the program's: a peer being reclaimed breaks the
// rendezvous before its own warning reaches the controller (the clouds' notice polls are 5 s
// on AWS, 10 s on GCP).
const spotSettle = 15 * time.Second

// look lists the job's nodes once and acts on what they say; true when the gang has ended.
func (m *Manager) look(ctx context.Context, id int64, w *watchState) bool {
	j, err := m.Get(id)
	if err != nil {
		return true
	}
	switch j.State {
	case Running:
	case Cancelling:
		// Cancelled as its launch handed the gang to this watch: the cancel reached the launch,
		// and the watch owns the nodes now.
		m.release(context.WithoutCancel(ctx), id, Cancelled, "cancelled by the user")
		return true
	default:
		return true
	}
	if !j.RunUntil.IsZero() && !m.cfg.Now().Before(j.RunUntil) {
		m.timeUp(ctx, j)
		return true
	}
	if j.PreemptFor != "" {
		m.end(ctx, j, preempted(j)) // preempt.go
		return true
	}
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	insts, err := m.listJob(lctx, j)
	cancel()
	if ctx.Err() != nil {
		return false // cancelled: the watch's caller decides
	}
	insts, gaps := listGaps(j, insts, err)
	if hidden := hiddenNodes(j, gaps); len(hidden) > 0 {
		// Judging a gang on a list that could not see its nodes would relaunch a healthy one,
		// or fail a finished one: it is unknown until its infra answers.
		m.unknown(j, w, hidden)
		return false
	}
	m.seen(j, w)
	a := assess(insts, j.Attempt, gangSize(j))
	if a.verdict == stillRunning {
		return m.maybeGrow(ctx, j, w) // elastic.go
	}
	if a.verdict == programFailed {
		blameWarnedNode(&a, j, insts)
	}
	if a.verdict == programFailed && spotUp(j, insts) {
		if w.failedAt.IsZero() {
			w.failedAt = m.cfg.Now()
		}
		if m.cfg.Now().Sub(w.failedAt) < spotSettle {
			return false
		}
	}
	m.end(ctx, j, a)
	return true
}

// unknown records that gaps hide nodes of job j's gang: the job stays RUNNING and its reason
// says which infras do not answer and since when — once per change of what is hidden, not at
// every look.
func (m *Manager) unknown(j Job, w *watchState, hidden []launcher.Gap) {
	where := gapsWhere(hidden)
	if where == w.hiddenWhere {
		return
	}
	if w.unknownSince.IsZero() {
		w.unknownSince, w.seenReason = m.cfg.Now(), j.Reason
	}
	w.hiddenWhere = where
	reason := fmt.Sprintf("nodes on %s not answering since %s; the gang is judged once they answer again: %v",
		where, w.unknownSince.UTC().Format(time.RFC3339), gapErr(hidden))
	w.unknownReason = reason
	m.update(j.ID, func(cur *Job) bool {
		if cur.State != Running {
			return false
		}
		cur.Reason = reason
		return true
	})
	m.log.Warn("job's nodes cannot be listed; the gang is not judged until they can", zap.Int64("job", j.ID),
		zap.String("where", where), zap.Time("since", w.unknownSince), zap.Error(gapErr(hidden)))
}

// seen records that every node of job j's gang is seen again, giving the job back its reason.
func (m *Manager) seen(j Job, w *watchState) {
	if w.unknownSince.IsZero() {
		return
	}
	m.log.Info("job's nodes answer again", zap.Int64("job", j.ID), zap.String("where", w.hiddenWhere),
		zap.Duration("after", m.cfg.Now().Sub(w.unknownSince)))
	reason, mine := w.seenReason, w.unknownReason
	m.update(j.ID, func(cur *Job) bool {
		if cur.State != Running || cur.Reason != mine {
			return false
		}
		cur.Reason = reason
		return true
	})
	w.unknownSince, w.hiddenWhere, w.seenReason, w.unknownReason = time.Time{}, "", "", ""
}

// spotUp reports whether a spot node of the gang is still running.
func spotUp(j Job, insts []launcher.Instance) bool {
	for _, in := range insts {
		if in.Spot && in.State == launcher.StateRunning && in.Labels[launcher.LabelAttempt] == strconv.Itoa(j.Attempt) {
			return true
		}
	}
	return false
}

// blameWarnedNode turns a failure into a lost node when a node of the gang was warned of its
// preemption: the others fail because their peer is going (a broken rendezvous), not because
// of the program. SkyPilot checks the cluster the same way before counting a failure
// (sky/jobs/controller.py).
func blameWarnedNode(a *assessment, j Job, insts []launcher.Instance) {
	for _, n := range j.Nodes {
		if n.ReclaimAt.IsZero() {
			continue
		}
		a.verdict = nodeLost
		a.reason = fmt.Sprintf("node %d was warned of its preemption (reclaimed at %s); %s", n.Rank, n.ReclaimAt.UTC().Format(time.RFC3339), a.reason)
		a.lost = &launcher.Instance{ID: n.InstanceID, Infra: n.Infra, Region: n.Region, Zone: n.Zone}
		for i := range insts {
			if insts[i].ID == n.InstanceID {
				a.lost = &insts[i]
			}
		}
		return
	}
}

// end acts on a gang that has ended: the verdict is saved first (with the nodes still
// recorded, so that a controller killed now stops them on restart), then the nodes are
// stopped, then the job goes on: a terminal state, or back to the queue to relaunch.
func (m *Manager) end(ctx context.Context, j Job, a assessment) {
	rec := configs.DefaultJob().Recovery
	if j.Task.Job != nil {
		rec = j.Task.Job.Recovery
	}
	nx := decide(a, rec, j.RestartsOnErrors)
	nx.reason = j.taskPrefix() + nx.reason
	next := nx.state == Succeeded && j.nextTask() // pipeline.go
	if next {
		nx.state = Pending
		nx.reason = fmt.Sprintf("%s; task %d/%d waits for its turn", nx.reason, j.TaskIndex+2, len(j.Pipeline))
	}
	now := m.cfg.Now()
	m.transition(j.ID, nx.state, nx.reason, func(cur *Job) {
		cur.ExitCodes = a.exitCodes
		if cur.PreemptFor != "" {
			cur.PreemptFor, cur.PreemptedAt = "", now
		}
		if next {
			cur.toTask(cur.TaskIndex + 1)
		}
		if !nx.relaunch {
			return
		}
		if nx.onError {
			cur.RestartsOnErrors++
		} else {
			cur.Recoveries++
		}
		cur.History = append(cur.History, Recovery{At: now, Reason: nx.reason, From: cur.Where(), OnError: nx.onError})
	})
	// EAGER_NEXT_REGION: keep the relaunch away from where the node was lost. FAILOVER tries
	// the same place first, as SkyPilot's does.
	if a.verdict == nodeLost && rec.Strategy == configs.RecoveryEagerNextRegion && a.lost != nil && a.lost.Infra != "" {
		if p, ok := m.cfg.Provider.(interface{ Preempted(launcher.Instance) }); ok {
			p.Preempted(*a.lost)
		}
	}
	m.release(ctx, j.ID, nx.state, nx.reason)
}
