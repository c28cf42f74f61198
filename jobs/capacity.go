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

// Queued and reserved capacity (configs.Capacity). A job waiting for capacity stays PENDING
// (RECOVERING when relaunching) with why and since when, for as long as it takes: a launch that
// found none, or one that the cloud holds in its queue or for a reservation's window
// (launcher.ErrQueued), is tried again every RetryInterval. A queued launch keeps its attempt
// number, so the provider's next LaunchGang call carries the same name and labels and finds
// the request it made instead of queueing again. Only capacity.max_wait (mode queued or
// reserved) ends the wait: the job is then FAILED_NO_RESOURCE and its request withdrawn.
//
// capacity.max_run_duration bounds each gang from the moment its nodes started, and a
// reservation's end (launcher.Instance.WindowEnd) bounds a gang in it, less the job's grace:
// then every node gets SIGTERM and the job's grace_period_seconds to checkpoint (the
// provider's Terminate, as for a cancel), and the job ends FAILED, saying which limit it hit. FAILED,
// not SUCCEEDED: the program did not finish by itself (as a Kubernetes Job past its
// activeDeadlineSeconds fails, and SkyPilot has no timeout state); nor is it recovered, since
// the limit is the user's and would be hit again. Resubmit to go on from a checkpoint kept
// outside the job (its checkpoint directory is released with it, as with every ended job).

// waitStart is when job j's current wait for capacity began: its first failed try, or the
// cloud's own time for a queued request when that is the first we hear.
func waitStart(j Job, err error, now time.Time) time.Time {
	if !j.WaitingSince.IsZero() {
		return j.WaitingSince
	}
	if q, ok := launcher.AsQueued(err); ok && !q.Since.IsZero() && q.Since.Before(now) {
		return q.Since
	}
	return now
}

// waitReason is the reason a waiting job shows: since when, and the queue's own words.
func waitReason(err error, since time.Time) string {
	why := err.Error()
	if q, ok := launcher.AsQueued(err); ok {
		why = "queued: " + q.Reason
	}
	return fmt.Sprintf("%ssince %s: %s", waitingForCapacity, since.UTC().Format(time.RFC3339), why)
}

// waitedTooLong ends job j's wait as FAILED_NO_RESOURCE once it has lasted capacity.max_wait,
// reporting whether it did.
func (m *Manager) waitedTooLong(j Job, err error) bool {
	cp := j.Task.Resources.Capacity
	if !cp.Queued() || cp.MaxWait <= 0 {
		return false
	}
	now := m.cfg.Now()
	since := waitStart(j, err, now)
	if now.Sub(since) < cp.MaxWait {
		return false
	}
	reason := fmt.Sprintf("waited its max_wait of %s for capacity (since %s): %v", configs.FormatDuration(cp.MaxWait),
		since.UTC().Format(time.RFC3339), err)
	m.transition(j.ID, FailedNoResource, reason, func(cur *Job) { cur.WaitingSince, cur.InQueue = since, false })
	return true
}

// Run limits: RunLimit's values.
const (
	limitMaxRun      = "max_run_duration"
	limitReservation = "reservation"
)

// started moves job j to RUNNING with reason: the wait is over, and the run limit starts.
// A gang in a reservation is stopped its grace before the reservation ends, so that it
// checkpoints before the cloud takes the nodes.
func (m *Manager) started(j *Job, reason string) {
	now := m.cfg.Now()
	j.WaitingSince, j.InQueue, j.RunUntil, j.RunLimit = time.Time{}, false, time.Time{}, ""
	if cp := j.Task.Resources.Capacity; cp != nil && cp.MaxRunDuration > 0 {
		j.RunUntil, j.RunLimit = now.Add(cp.MaxRunDuration), limitMaxRun
	}
	grace := time.Duration(graceOf(*j)) * time.Second
	for _, n := range j.Nodes {
		if end := n.WindowEnd.Add(-grace); !n.WindowEnd.IsZero() && (j.RunUntil.IsZero() || end.Before(j.RunUntil)) {
			j.RunUntil, j.RunLimit = end, limitReservation
		}
	}
	j.setState(Running, reason, now)
}

func graceOf(j Job) int {
	if j.Task.Job != nil {
		return j.Task.Job.GracePeriodSeconds
	}
	return configs.DefaultJob().GracePeriodSeconds
}

// withdrawQueued asks the infras to drop job id's queued requests that its running gang does
// not use (it started elsewhere), so that no capacity arrives later for nobody.
func (m *Manager) withdrawQueued(ctx context.Context, j Job) {
	w, ok := m.cfg.Provider.(launcher.QueueWithdrawer)
	if !ok {
		return
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StopTimeout)
	defer cancel()
	if err := w.WithdrawQueued(wctx, strconv.FormatInt(j.ID, 10), j.Attempt); err != nil {
		m.log.Warn("withdraw queued requests", zap.Int64("job", j.ID), zap.Error(err))
	}
}

// timeUp stops job j's gang at its run limit: the verdict first (with the nodes recorded, so
// that a controller killed now stops them on restart), then the nodes, with the job's grace.
func (m *Manager) timeUp(ctx context.Context, j Job) {
	grace := graceOf(j)
	var reason string
	if j.RunLimit == limitReservation {
		reason = fmt.Sprintf("its reservation ends at %s: stopped with SIGTERM and %ds to checkpoint before it does",
			j.RunUntil.Add(time.Duration(grace)*time.Second).UTC().Format(time.RFC3339), grace)
	} else {
		var limit time.Duration
		if cp := j.Task.Resources.Capacity; cp != nil {
			limit = cp.MaxRunDuration
		}
		reason = fmt.Sprintf("reached its max_run_duration of %s (nodes started %s): stopped with SIGTERM and %ds to checkpoint",
			configs.FormatDuration(limit), j.RunUntil.Add(-limit).UTC().Format(time.RFC3339), grace)
	}
	m.transition(j.ID, Failed, reason, nil)
	m.log.Info("job reached its run limit", zap.Int64("job", j.ID), zap.String("limit", j.RunLimit), zap.Time("at", j.RunUntil))
	m.release(ctx, j.ID, Failed, reason)
}

// deadline is a channel that fires at job id's run limit (nil when it has none).
func (m *Manager) deadline(id int64) (<-chan time.Time, func()) {
	j, err := m.Get(id)
	if err != nil || j.RunUntil.IsZero() {
		return nil, func() {}
	}
	t := time.NewTimer(max(0, j.RunUntil.Sub(m.cfg.Now())))
	return t.C, func() { t.Stop() }
}
