package jobs

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
)

// adopt takes over job id after a controller restart, from the state it was saved in and what
// its nodes are doing now: a RUNNING gang is watched again (its nodes kept running while no
// controller did), a half-launched one is stopped and relaunched, one being stopped is
// stopped. Nodes of any other attempt are stopped: no job runs twice.
//
// An infra that does not answer decides nothing: a RUNNING gang on it is watched (the watch
// waits until its nodes are seen), one being stopped leaves what it cannot reach to the
// provisioner, and a launch the restart cut short is adopted or relaunched only once the
// nodes it may have made can be listed (adoptLater) — a gang hidden in a gap is neither
// relaunched beside itself nor failed.
func (m *Manager) adopt(ctx context.Context, id int64) {
	j, err := m.Get(id)
	if err != nil {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	insts, err := m.listJob(lctx, j)
	cancel()
	insts, gaps := listGaps(j, insts, err)
	if len(gaps) > 0 {
		m.log.Warn("list job nodes on restart", zap.Int64("job", id), zap.String("where", gapsWhere(gaps)), zap.Error(gapErr(gaps)))
	}
	if hidden := launchHidden(j, insts, gaps); len(hidden) > 0 {
		m.adoptLater(ctx, j, hidden)
		return
	}
	m.adoptAs(ctx, j, insts)
}

// currentGang splits insts into job j's current attempt's and whether any other attempt's is
// among them.
func currentGang(j Job, insts []launcher.Instance) (current []launcher.Instance, stray bool) {
	for _, in := range insts {
		if in.Labels[launcher.LabelAttempt] == strconv.Itoa(j.Attempt) {
			current = append(current, in)
		} else {
			stray = true
		}
	}
	return current, stray
}

// launchHidden returns the gaps that may hide nodes of a launch the restart cut short, nil
// when there is none or it is seen whole: with some of its nodes found, the gaps over where
// they run (a gang runs in one location); with none found, every gap.
func launchHidden(j Job, insts []launcher.Instance, gaps []launcher.Gap) []launcher.Gap {
	if len(gaps) == 0 || !(j.State == Starting || (j.State == Recovering && len(j.Nodes) == 0)) {
		return nil
	}
	current, _ := currentGang(j, insts)
	switch {
	case len(current) >= gangSize(j):
		return nil // the whole gang is seen
	case len(current) > 0:
		if g, ok := covers(gaps, current[0].Infra, current[0].Region, current[0].Zone); ok {
			return []launcher.Gap{g}
		}
		return nil
	case j.State == Starting:
		return gaps
	}
	// RECOVERING with no node of its attempt seen waits in the queue, as it did before the
	// restart; its earlier gang's nodes in a gap were left to the provisioner when stopped.
	return nil
}

// adoptLater holds a launch the restart cut short, whose nodes may be hidden in hidden, until
// they can be listed, then adopts it from its saved state; the job is owned meanwhile, so the
// queue does not relaunch it and a cancel stops whatever is found.
func (m *Manager) adoptLater(ctx context.Context, j Job, hidden []launcher.Gap) {
	octx, done, ok := m.own(ctx, j.ID)
	if !ok {
		return
	}
	where, since := gapsWhere(hidden), m.cfg.Now()
	m.log.Warn("a launch cut short by the restart is decided once its nodes can be listed", zap.Int64("job", j.ID),
		zap.String("where", where), zap.Error(gapErr(hidden)))
	m.update(j.ID, func(cur *Job) bool {
		cur.Reason = fmt.Sprintf("the controller restarted during its launch; nodes on %s not answering since %s, so whether its gang runs is decided once they answer: %v",
			where, since.UTC().Format(time.RFC3339), gapErr(hidden))
		return true
	})
	m.spawn("adopt", func() {
		defer done()
		t := time.NewTicker(m.cfg.WatchInterval)
		defer t.Stop()
		for {
			select {
			case <-octx.Done():
				if cur, err := m.Get(j.ID); err == nil && cur.State == Cancelling {
					m.release(context.WithoutCancel(octx), j.ID, Cancelled, "cancelled by the user")
				}
				return
			case <-t.C:
			}
			lctx, cancel := context.WithTimeout(octx, time.Minute)
			insts, err := m.listJob(lctx, j)
			cancel()
			if octx.Err() != nil {
				continue
			}
			insts, gaps := listGaps(j, insts, err)
			if len(launchHidden(j, insts, gaps)) > 0 {
				continue
			}
			m.log.Info("the nodes of a launch cut short by the restart can be listed again", zap.Int64("job", j.ID),
				zap.Duration("after", m.cfg.Now().Sub(since)))
			done() // adoptAs hands the gang to a watch, or the job to the queue
			m.adoptAs(ctx, j, insts)
			return
		}
	})
}

// adoptAs adopts job j, as it was saved, from insts: its instances as listed, good outside
// the gaps that do not matter to it (adopt).
func (m *Manager) adoptAs(ctx context.Context, j Job, insts []launcher.Instance) {
	id := j.ID
	n := gangSize(j)
	current, stray := currentGang(j, insts)
	log := m.log.With(zap.Int64("job", id), zap.String("state", string(j.State)), zap.Int("attempt", j.Attempt))
	// unchanged guards each change below: a cancel that came meanwhile wins, and whatever was
	// found is then stopped by the job's own release.
	unchanged := func(cur *Job) bool { return cur.State == j.State && cur.Attempt == j.Attempt }
	raced := func() {
		log.Info("the job changed while it was adopted; stopping what was found")
		m.spawn("release", func() {
			if cur, err := m.Get(id); err == nil {
				m.release(ctx, id, cur.State, cur.Reason)
			}
		})
	}
	switch {
	case j.State == Cancelling:
		log.Info("finishing a cancel begun before the restart")
		m.spawn("cancel", func() { m.release(ctx, id, Cancelled, "cancelled by the user") })
	case j.State.Terminal() || ((j.State == Recovering || j.State == Pending) && len(j.Nodes) > 0):
		// The verdict was saved; stopping its nodes was not finished (PENDING: a pipeline's
		// task succeeded and the next one waits, pipeline.go).
		log.Info("stopping the nodes of an ended gang")
		m.spawn("release", func() { m.release(ctx, id, j.State, j.Reason) })
	case j.State == Starting || (j.State == Recovering && len(current) > 0):
		if len(current) == n {
			log.Info("adopting a gang launched before the restart", zap.Int("nodes", n))
			if _, ok := m.update(id, func(cur *Job) bool {
				if !unchanged(cur) {
					return false
				}
				cur.Nodes = nodesOf(current)
				cur.CostSince = m.cfg.Now()
				m.started(cur, "adopted after a controller restart")
				return true
			}); !ok {
				raced()
				return
			}
			m.stopStrays(ctx, id, j.Attempt)
			m.startWatch(id)
			return
		}
		// Half a gang: stop it and launch again.
		back := Pending
		if j.Recoveries+j.RestartsOnErrors > 0 {
			back = Recovering
		}
		log.Info("relaunching a gang whose launch the restart cut short", zap.Int("found", len(current)))
		if _, ok := m.update(id, func(cur *Job) bool {
			if !unchanged(cur) {
				return false
			}
			cur.setState(back, "relaunching: the controller restarted during its launch", m.cfg.Now())
			cur.Nodes = nodesOf(current)
			return true
		}); !ok {
			raced()
			return
		}
		m.spawn("release", func() { m.release(ctx, id, back, "relaunching after a controller restart") })
	case j.State == Running:
		log.Info("watching a gang that ran through the restart", zap.Int("found", len(current)))
		if stray {
			m.stopStrays(ctx, id, j.Attempt)
		}
		m.startWatch(id)
	default: // PENDING, RECOVERING without nodes: the queue takes them
		if stray {
			m.stopStrays(ctx, id, j.Attempt)
		}
	}
}

// stopStrays terminates the job's nodes of attempts other than attempt.
func (m *Manager) stopStrays(ctx context.Context, id int64, attempt int) {
	j, err := m.Get(id)
	if err != nil {
		return
	}
	m.spawn("strays", func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StopTimeout)
		defer cancel()
		// Outside the gaps of a partial listing; what a gap hides is stopped with the job.
		insts, err := m.listJob(ctx, j)
		insts, _ = listGaps(j, insts, err)
		for _, in := range insts {
			if in.Labels[launcher.LabelAttempt] != strconv.Itoa(attempt) {
				m.log.Info("stopping a node of an earlier attempt", zap.Int64("job", j.ID), zap.String("instance", in.ID))
				_ = m.stopNode(ctx, j, in)
			}
		}
	})
}
