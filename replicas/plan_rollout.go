package replicas

import (
	"fmt"
	"time"

	"github.com/ferryserve/ferry/configs"
)

// The last say of a plan on the rollout: whether it switches traffic, succeeds or fails.

// judgeRollout gives an IN_PROGRESS rollout its verdict, and ends a FAILED one (without
// rollback) that came good after all, once capacity came back.
func (p *pass) judgeRollout(w rolloutWeight) {
	in := p.in
	switch {
	case in.Desired < 0 || in.Rollout == nil:
	case in.Rollout.Active():
		p.out.Rollout = judgeRollout(in, p.rolloutFailure, w.switched, w.healthy, w.oldLeft, w.progressAt)
	case in.Rollout.State == RolloutFailed && w.oldLeft == 0 && w.healthy >= in.Desired:
		p.out.Rollout = &rolloutChange{End: RolloutSucceeded, Reason: fmt.Sprintf("%d of %d replicas of version %d healthy", w.healthy, in.Desired, in.Target)}
	}
}

// versionFailure reports whether a replica that ends in status s failed through its own
// version (its program or image), as opposed to capacity or a preemption.
func versionFailure(s Status) bool {
	switch s {
	case StatusFailed, StatusFailedInitialDelay, StatusFailedProbing:
		return true
	}
	return false
}

// judgeRollout says whether an IN_PROGRESS rollout switches, succeeds or fails now.
func judgeRollout(in planInput, failure string, switched bool, healthy, oldLeft int, progressAt time.Time) *rolloutChange {
	r := in.Rollout
	var ch rolloutChange
	changed := false
	if !progressAt.IsZero() {
		ch.ProgressAt, changed = progressAt, true
	}
	deadline := time.Duration(r.Policy.ProgressDeadlineSeconds) * time.Second
	last := r.ProgressAt
	if last.IsZero() {
		last = r.StartedAt
	}
	if !progressAt.IsZero() {
		last = progressAt
	}
	if failure == "" && deadline > 0 && in.Now.Sub(last) >= deadline && healthy < in.Desired {
		failure = fmt.Sprintf("no new replica became healthy within the progress deadline (%v)", deadline)
	}
	switch {
	case failure != "":
		ch.End, ch.Reason = RolloutFailed, failure
		if r.FromServed && r.Policy.AutoRollback {
			ch.End = RolloutRolledBack
		}
		return &ch
	case switched && !r.Switched:
		ch.Switched, changed = true, true
	}
	if oldLeft == 0 && healthy >= in.Desired && (r.Mode != configs.UpdateBlueGreen || switched) {
		ch.End, ch.Reason = RolloutSucceeded, fmt.Sprintf("%d of %d replicas of version %d healthy", healthy, in.Desired, r.To)
		return &ch
	}
	if !changed {
		return nil
	}
	return &ch
}
