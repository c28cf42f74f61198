package jobs

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// verdict is what a look at the current gang's instances concludes.
type verdict int

const (
	// stillRunning: no node has failed, and not every node has exited.
	stillRunning verdict = iota
	// allSucceeded: every node exited 0.
	allSucceeded
	// programFailed: a node exited non-zero (setup or run); the others are stopped.
	programFailed
	// nodeLost: a node is gone, preempted or stopped without exiting by itself.
	nodeLost
)

// assessment is the verdict with what the manager acts on.
type assessment struct {
	verdict verdict
	// exitCodes by rank, -1 where the node has not exited by itself.
	exitCodes []int
	// code is the failing status (the first non-zero by rank, ExitSetupFailed first).
	code int
	// lost is the first node lost, for the reason and the zone to avoid.
	lost   *launcher.Instance
	reason string
}

// assess judges the gang of attempt from insts (the job's instances as listed; others'
// attempts are ignored). n is the gang size. A lost node outweighs exits: the gang is
// relaunched as a whole either way, and a lost node's program did not get to finish.
func assess(insts []launcher.Instance, attempt, n int) assessment {
	byRank := make([]*launcher.Instance, n)
	for i := range insts {
		in := &insts[i]
		if in.Labels[launcher.LabelAttempt] != strconv.Itoa(attempt) {
			continue
		}
		r, err := strconv.Atoi(in.Labels[launcher.LabelNodeRank])
		if err != nil || r < 0 || r >= n {
			r = 0 // a single-node gang carries rank 0
		}
		byRank[r] = in
	}
	a := assessment{exitCodes: make([]int, n)}
	exited, failedRank := 0, -1
	for r, in := range byRank {
		a.exitCodes[r] = -1
		switch {
		case in == nil:
			if a.lost == nil {
				a.lost, a.reason = &launcher.Instance{}, fmt.Sprintf("node %d is gone", r)
			}
		case in.State == launcher.StatePreempted:
			if a.lost == nil {
				a.lost, a.reason = in, fmt.Sprintf("node %d was preempted%s", r, because(in.Reason))
			}
		case in.State == launcher.StateTerminated:
			code, ok := in.Exited()
			if !ok {
				if a.lost == nil {
					a.lost, a.reason = in, fmt.Sprintf("node %d stopped without exiting%s", r, because(in.Reason))
				}
				continue
			}
			a.exitCodes[r] = code
			exited++
			if code != 0 && (failedRank < 0 || code == launcher.ExitSetupFailed && a.code != launcher.ExitSetupFailed) {
				failedRank, a.code = r, code
			}
		}
	}
	switch {
	case a.lost != nil:
		a.verdict = nodeLost
	case failedRank >= 0:
		a.verdict = programFailed
		if a.code == launcher.ExitSetupFailed {
			a.reason = fmt.Sprintf("setup failed on node %d (its log has the status)", failedRank)
		} else {
			a.reason = fmt.Sprintf("node %d exited with status %d", failedRank, a.code)
		}
	case exited == n:
		a.verdict = allSucceeded
	}
	return a
}

func because(reason string) string {
	if reason == "" {
		return ""
	}
	return ": " + reason
}

// next is what the manager does after a failing program or a lost node.
type next struct {
	state State
	// relaunch: the gang goes back to the queue as RECOVERING; onError counts it against
	// max_restarts_on_errors.
	relaunch, onError bool
	reason            string
}

// decide applies SkyPilot's recovery rules (sky/jobs/controller.py): a lost node recovers
// unless job_recovery is none; a failing program restarts while restarts remain, or always for
// an exit code in recover_on_exit_codes; otherwise FAILED, or FAILED_SETUP for a setup.
func decide(a assessment, rec configs.JobRecovery, restarts int) next {
	switch a.verdict {
	case allSucceeded:
		return next{state: Succeeded, reason: "every node exited 0"}
	case nodeLost:
		if rec.Strategy == configs.RecoveryNone {
			return next{state: Failed, reason: a.reason + "; job_recovery is none"}
		}
		return next{state: Recovering, relaunch: true, reason: a.reason}
	case programFailed:
		if slices.Contains(rec.RecoverOnExitCodes, a.code) {
			return next{state: Recovering, relaunch: true, reason: a.reason + " (in recover_on_exit_codes)"}
		}
		if restarts < rec.MaxRestartsOnErrors {
			return next{state: Recovering, relaunch: true, onError: true,
				reason: fmt.Sprintf("%s; restart %d of %d", a.reason, restarts+1, rec.MaxRestartsOnErrors)}
		}
		if a.code == launcher.ExitSetupFailed {
			return next{state: FailedSetup, reason: a.reason}
		}
		return next{state: Failed, reason: a.reason}
	}
	return next{state: Running}
}
