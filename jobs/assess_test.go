package jobs

import (
	"strconv"
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

func node(rank, attempt int, state launcher.State, code ...int) launcher.Instance {
	in := launcher.Instance{ID: "n" + strconv.Itoa(rank), State: state,
		Labels: map[string]string{launcher.LabelNodeRank: strconv.Itoa(rank), launcher.LabelAttempt: strconv.Itoa(attempt)}}
	if len(code) > 0 {
		in.ExitCode = &code[0]
	}
	return in
}

func TestAssess(t *testing.T) {
	run, term, pre := launcher.StateRunning, launcher.StateTerminated, launcher.StatePreempted
	tests := []struct {
		name  string
		insts []launcher.Instance
		want  verdict
		code  int
		codes string
	}{
		{"all running", []launcher.Instance{node(0, 1, run), node(1, 1, run)}, stillRunning, 0, "[-1 -1]"},
		{"one done, one running", []launcher.Instance{node(0, 1, term, 0), node(1, 1, run)}, stillRunning, 0, "[0 -1]"},
		{"all exited 0", []launcher.Instance{node(0, 1, term, 0), node(1, 1, term, 0)}, allSucceeded, 0, "[0 0]"},
		{"one failed", []launcher.Instance{node(0, 1, run), node(1, 1, term, 3)}, programFailed, 3, "[-1 3]"},
		{"setup failure wins the code", []launcher.Instance{node(0, 1, term, 1), node(1, 1, term, launcher.ExitSetupFailed)}, programFailed, launcher.ExitSetupFailed, "[1 223]"},
		{"preempted", []launcher.Instance{node(0, 1, run), node(1, 1, pre)}, nodeLost, 0, "[-1 -1]"},
		{"stopped without exiting", []launcher.Instance{node(0, 1, term), node(1, 1, run)}, nodeLost, 0, "[-1 -1]"},
		{"gone", []launcher.Instance{node(0, 1, run)}, nodeLost, 0, "[-1 -1]"},
		{"lost outweighs a failure", []launcher.Instance{node(0, 1, term, 1), node(1, 1, pre)}, nodeLost, 1, "[1 -1]"},
		{"another attempt's nodes do not count", []launcher.Instance{node(0, 2, term, 0), node(1, 2, term, 0), node(1, 1, term, 9)}, allSucceeded, 0, "[0 0]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := assess(tc.insts, 1+boolInt(tc.name == "another attempt's nodes do not count"), 2)
			if a.verdict != tc.want || a.code != tc.code || fmtInts(a.exitCodes) != tc.codes {
				t.Errorf("verdict %d code %d codes %v (%s); want %d %d %s", a.verdict, a.code, a.exitCodes, a.reason, tc.want, tc.code, tc.codes)
			}
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func fmtInts(v []int) string {
	s := "["
	for i, n := range v {
		if i > 0 {
			s += " "
		}
		s += strconv.Itoa(n)
	}
	return s + "]"
}

func TestDecide(t *testing.T) {
	failed := func(code int) assessment { return assessment{verdict: programFailed, code: code, reason: "x"} }
	rec := configs.JobRecovery{Strategy: configs.RecoveryEagerNextRegion, MaxRestartsOnErrors: 1, RecoverOnExitCodes: []int{33}}
	tests := []struct {
		name     string
		a        assessment
		rec      configs.JobRecovery
		restarts int
		state    State
		relaunch bool
		onError  bool
	}{
		{"success", assessment{verdict: allSucceeded}, rec, 0, Succeeded, false, false},
		{"lost node recovers, however often", assessment{verdict: nodeLost}, rec, 5, Recovering, true, false},
		{"lost node with recovery none fails", assessment{verdict: nodeLost}, configs.JobRecovery{Strategy: configs.RecoveryNone}, 0, Failed, false, false},
		{"failure restarts while restarts remain", failed(1), rec, 0, Recovering, true, true},
		{"out of restarts", failed(1), rec, 1, Failed, false, false},
		{"setup failure out of restarts", failed(launcher.ExitSetupFailed), rec, 1, FailedSetup, false, false},
		{"recover_on_exit_codes never counts", failed(33), rec, 1, Recovering, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nx := decide(tc.a, tc.rec, tc.restarts)
			if nx.state != tc.state || nx.relaunch != tc.relaunch || nx.onError != tc.onError {
				t.Errorf("got %+v; want %s relaunch=%v onError=%v", nx, tc.state, tc.relaunch, tc.onError)
			}
		})
	}
}
