package jobs

import (
	"context"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
)

// adopt takes over job id after a controller restart, from the state it was saved in and what
// its nodes are doing now: a RUNNING gang is watched again (its nodes kept running while no
// controller did), a half-launched one is stopped and relaunched, one being stopped is
// stopped. Nodes of any other attempt are stopped: no job runs twice.
func (m *Manager) adopt(ctx context.Context, id int64) {
	j, err := m.Get(id)
	if err != nil {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	insts, err := m.cfg.Provider.List(lctx, map[string]string{launcher.LabelJob: strconv.FormatInt(id, 10)})
	cancel()
	if err != nil {
		// Without a view of the nodes nothing is safe to decide; the watch or the queue will
		// look again.
		m.log.Warn("list job nodes on restart", zap.Int64("job", id), zap.Error(err))
	}
	n := max(j.Task.NumNodes, 1)
	var current []launcher.Instance
	stray := false
	for _, in := range insts {
		if in.Labels[launcher.LabelAttempt] == strconv.Itoa(j.Attempt) {
			current = append(current, in)
		} else {
			stray = true
		}
	}
	log := m.log.With(zap.Int64("job", id), zap.String("state", string(j.State)), zap.Int("attempt", j.Attempt))
	switch {
	case j.State == Cancelling:
		log.Info("finishing a cancel begun before the restart")
		m.spawn("cancel", func() { m.release(ctx, id, Cancelled, "cancelled by the user") })
	case j.State.Terminal() || (j.State == Recovering && len(j.Nodes) > 0):
		// The verdict was saved; stopping its nodes was not finished.
		log.Info("stopping the nodes of an ended gang")
		m.spawn("release", func() { m.release(ctx, id, j.State, j.Reason) })
	case j.State == Starting || (j.State == Recovering && len(current) > 0):
		if err == nil && len(current) == n {
			log.Info("adopting a gang launched before the restart", zap.Int("nodes", n))
			m.update(id, func(cur *Job) bool {
				cur.Nodes = nodesOf(current)
				cur.CostSince = m.cfg.Now()
				m.started(cur, "adopted after a controller restart")
				return true
			})
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
		m.update(id, func(cur *Job) bool {
			cur.setState(back, "relaunching: the controller restarted during its launch", m.cfg.Now())
			cur.Nodes = nodesOf(current)
			return true
		})
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
		insts, err := m.cfg.Provider.List(ctx, map[string]string{launcher.LabelJob: strconv.FormatInt(id, 10)})
		if err != nil {
			return
		}
		for _, in := range insts {
			if in.Labels[launcher.LabelAttempt] != strconv.Itoa(attempt) {
				m.log.Info("stopping a node of an earlier attempt", zap.Int64("job", j.ID), zap.String("instance", in.ID))
				m.archiveLog(ctx, id, in)
				_ = m.cfg.Provider.Terminate(ctx, in.ID)
			}
		}
	})
}
