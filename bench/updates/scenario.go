package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ferryserve/ferry/bench/benchkit"
	"github.com/ferryserve/ferry/bench/childproc"
	"github.com/ferryserve/ferry/bench/loadgen"
	"github.com/ferryserve/ferry/bench/servicekit"
	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/replicas"
)

const (
	// pollEvery is how often the rollout's state is read while it runs.
	pollEvery = 100 * time.Millisecond
	// cliTimeout bounds the short CLI commands (status, controller stop).
	cliTimeout = 30 * time.Second
	// upTimeout bounds `serve up` and `serve down`.
	upTimeout = 2 * time.Minute
	// updateExitWait bounds how long `serve update` may take to exit after the rollout ended.
	updateExitWait = 30 * time.Second
	// drainWait bounds how long the old version's processes may take to go after a rollout.
	drainWait = 20 * time.Second
	// apiOutage bounds how long the controller's API may stay unreachable before the scenario
	// gives up (outside the deliberate kill, it should never be unreachable).
	apiOutage = 30 * time.Second
	// proxyReadyTimeout bounds the attached proxy's start.
	proxyReadyTimeout = 30 * time.Second
)

// scenarioDef is one update under load.
type scenarioDef struct {
	Key   string
	Title string
	// From and To are the model versions before and after (modelName).
	From, To int
	Mode     string
	// Crash makes version To's replicas exit at start.
	Crash bool
	// KillController SIGKILLs the controller as soon as one replica of the new version is
	// READY, then restarts it with `ferry serve status`.
	KillController bool
	// ViaProxy sends the load through the standalone `ferry proxy --attach` instead of the
	// controller's own endpoint (which dies with the controller).
	ViaProxy bool
	// WantState is how the rollout must end; WantServing the version serving after it.
	WantState   replicas.RolloutState
	WantServing int
}

// scenarios are run in this order on the same service; each starts from where the previous
// one left it.
func scenarios() []scenarioDef {
	return []scenarioDef{
		{Key: "a", Title: "rolling v1 → v2", From: 1, To: 2, Mode: configs.UpdateRolling,
			WantState: replicas.RolloutSucceeded, WantServing: 2},
		{Key: "b", Title: "blue-green v2 → v3", From: 2, To: 3, Mode: configs.UpdateBlueGreen,
			WantState: replicas.RolloutSucceeded, WantServing: 3},
		{Key: "c", Title: "v3 → v4 that crashes at start", From: 3, To: 4, Mode: configs.UpdateRolling, Crash: true,
			WantState: replicas.RolloutRolledBack, WantServing: 3},
		{Key: "d", Title: "rolling v3 → v5, controller SIGKILLed", From: 3, To: 5, Mode: configs.UpdateRolling,
			KillController: true, ViaProxy: true, WantState: replicas.RolloutSucceeded, WantServing: 5},
	}
}

// bench is the service under test and what runs around it.
type bench struct {
	opts     options
	f        *servicekit.Ferry
	spec     taskSpec
	taskDir  string
	endpoint string // the service endpoint's host:port

	proxy     *childproc.Proc
	proxyAddr string
	// proxyErr says why there is no attached proxy; scenarios that need one fail with it.
	proxyErr error

	progress func(format string, args ...any)
}

// writeTask writes version v's YAML and returns its path.
func (b *bench) writeTask(v int, crash bool) (string, error) {
	path := filepath.Join(b.taskDir, fmt.Sprintf("v%d.yaml", v))
	return path, os.WriteFile(path, []byte(taskYAML(b.spec, v, crash)), 0o644)
}

// setup brings the service up at version 1 and starts the attached proxy.
func (b *bench) setup(ctx context.Context) error {
	file, err := b.writeTask(1, false)
	if err != nil {
		return err
	}
	b.progress("setup: ferry serve up (%d replicas of %s)", b.spec.Replicas, modelName(1))
	if _, err := b.f.Run(ctx, "serve-up", upTimeout, "serve", "up", file, "-y"); err != nil {
		return err
	}
	st, err := b.f.Status(ctx)
	if err != nil {
		return err
	}
	if b.endpoint, err = servicekit.EndpointAddr(st.Endpoint); err != nil {
		return err
	}
	if err := b.waitServes(ctx, b.endpoint, modelName(1), nil); err != nil {
		return fmt.Errorf("service endpoint %s: %w", b.endpoint, err)
	}
	b.progress("setup: service %q serves %s at %s", serviceName, modelName(1), b.endpoint)
	b.proxyErr = b.startProxy(ctx)
	if b.proxyErr != nil {
		b.progress("setup: no attached proxy: %v", b.proxyErr)
	} else {
		b.progress("setup: ferry proxy --attach %s serves at %s", serviceName, b.proxyAddr)
	}
	return nil
}

// startProxy starts `ferry proxy --attach` and waits until it serves the service.
func (b *bench) startProxy(ctx context.Context) error {
	addr, err := benchkit.FreeLoopbackAddr()
	if err != nil {
		return err
	}
	p, err := b.f.Start("proxy-attach", "proxy", "--attach", serviceName, "--listen", addr, "--access-log")
	if err != nil {
		return err
	}
	b.proxy = p
	if err := b.waitServes(ctx, addr, modelName(1), p); err != nil {
		if errors.Is(err, childproc.ErrExited) && strings.Contains(servicekit.ReadLog(p), "unknown flag: --attach") {
			return fmt.Errorf("this ferry has no `ferry proxy --attach` (%s)", servicekit.LastLines(servicekit.ReadLog(p), 1))
		}
		return fmt.Errorf("`ferry proxy --attach %s --listen %s`: %w", serviceName, addr, err)
	}
	b.proxyAddr = addr
	return nil
}

// waitServes polls addr with non-streamed requests until one is answered by model, p (when
// given) exits, or proxyReadyTimeout passes.
func (b *bench) waitServes(ctx context.Context, addr, model string, p *childproc.Proc) error {
	c, err := newClient(addr, 1, 5*time.Second, 1, 1)
	if err != nil {
		return err
	}
	defer c.closeIdle()
	var last error
	err = servicekit.PollUntil(ctx, proxyReadyTimeout, pollEvery, func() (bool, error) {
		if p != nil {
			select {
			case <-p.Exited():
				return false, fmt.Errorf("%w: %v: %s", childproc.ErrExited, p.Err(), servicekit.LastLines(servicekit.ReadLog(p), 3))
			default:
			}
		}
		got, err := c.doPlain()
		if err == nil && got != model {
			err = fmt.Errorf("answered by %s", got)
		}
		last = err
		return err == nil, nil
	})
	if err != nil && last != nil && !errors.Is(err, childproc.ErrExited) {
		err = fmt.Errorf("%w (last answer: %v)", err, last)
	}
	return err
}

// runScenario runs def and judges it. An error that kept the driver from finishing it is in
// the result, not returned: the next scenario may still run.
func (b *bench) runScenario(ctx context.Context, def scenarioDef) *scenarioResult {
	res := &scenarioResult{Key: def.Key, Title: def.Title, WantState: string(def.WantState),
		WantModel: modelName(def.WantServing), UpdateExit: -1, SettleMs: loadgen.Ms(b.opts.settle)}
	if err := b.scenario(ctx, def, res); err != nil {
		res.Error = err.Error()
	}
	res.judge()
	return res
}

func (b *bench) scenario(ctx context.Context, def scenarioDef, res *scenarioResult) error {
	addr := b.endpoint
	res.Target = "service endpoint " + addr
	if def.ViaProxy {
		if b.proxyErr != nil {
			res.Target = "ferry proxy --attach (unavailable)"
			return fmt.Errorf("needs the attached proxy: %w", b.proxyErr)
		}
		addr = b.proxyAddr
		res.Target = "ferry proxy --attach " + addr
	}
	file, err := b.writeTask(def.To, def.Crash)
	if err != nil {
		return err
	}
	prev, err := b.f.Status(ctx)
	if err != nil {
		return err
	}
	prevVersion := prev.Version
	if prev.Update != nil {
		prevVersion = max(prevVersion, prev.Update.To)
	}

	c, err := newClient(addr, b.opts.workers, b.opts.requestTimeout, b.opts.plainTokens, b.opts.streamTokens)
	if err != nil {
		return err
	}
	defer c.closeIdle()
	bound := b.opts.before + b.opts.rolloutTimeout + updateExitWait + b.opts.after + time.Minute
	b.progress("scenario %s (%s): %d workers on %s, %v before the update", def.Key, def.Title, b.opts.workers, res.Target, b.opts.before)
	ld := startLoad(c, b.opts.workers, bound)
	defer func() { _, _ = ld.Stop() }() // Stop may be called again

	if err := servicekit.SleepCtx(ctx, b.opts.before); err != nil {
		return err
	}
	updateStart := time.Now()
	args := []string{"serve", "update", serviceName, file, "-y", "--mode", def.Mode}
	upd, err := b.f.Start("update-v"+fmt.Sprint(def.To), args...)
	if err != nil {
		return err
	}
	defer b.f.Group.Stop(upd) // only if it outlives the scenario

	end, err := b.followRollout(ctx, def, res, upd, prevVersion, updateStart)
	rolloutEnd := time.Now()
	if err != nil {
		return err
	}
	res.State = string(end.State)
	res.RolloutReason = end.Reason
	res.RolloutWallS = rolloutEnd.Sub(updateStart).Seconds()
	if !end.FinishedAt.IsZero() {
		res.ControllerRolloutS = end.FinishedAt.Sub(end.StartedAt).Seconds()
	}
	b.progress("scenario %s: rollout %d → %d ended %s after %.1f s%s", def.Key, end.From, end.To, end.State, res.RolloutWallS, reasonSuffix(end.Reason))

	if err := servicekit.WaitExit(ctx, b.f.Group, upd, updateExitWait); err != nil {
		res.UpdateOutput = "did not exit: " + err.Error()
	} else {
		res.UpdateExit = servicekit.ExitCode(upd)
		res.UpdateOutput = servicekit.LastLines(servicekit.ReadLog(upd), 1)
	}

	if err := servicekit.SleepCtx(ctx, b.opts.after); err != nil {
		return err
	}
	records, err := ld.Stop()
	if err != nil {
		return err
	}
	res.aggregate(records, updateStart, rolloutEnd, modelName(def.From), modelName(def.To))
	if def.ViaProxy {
		select {
		case <-b.proxy.Exited():
			res.Notes = append(res.Notes, fmt.Sprintf("the attached proxy exited: %v: %s", b.proxy.Err(), servicekit.LastLines(servicekit.ReadLog(b.proxy), 2)))
		default:
		}
	}

	// Which version's replicas are READY, and which versions still have processes once the
	// old ones have had time to drain and go.
	servingVersion := end.To
	if end.State != replicas.RolloutSucceeded {
		servingVersion = end.From
	}
	if st, err := b.f.Status(ctx); err == nil {
		res.ReadyAtEnd = readyByVersion(st)
	}
	var live []instance
	_ = servicekit.PollUntil(ctx, drainWait, pollEvery, func() (bool, error) {
		live = liveInstances(b.f)
		for _, in := range live {
			if version(in) != servingVersion {
				return false, nil
			}
		}
		return true, nil
	})
	res.ProcessesAtEnd = countByVersion(live)
	for _, in := range live {
		if version(in) != servingVersion {
			res.Notes = append(res.Notes, fmt.Sprintf("replica process of version %d (%s, pgid %d) still alive %v after the rollout ended (only version %d should be left)",
				version(in), in.ID, in.PGID, drainWait, servingVersion))
		}
	}
	if res.UpdateExit >= 0 && (res.UpdateExit == 0) != (def.WantState == replicas.RolloutSucceeded) {
		res.Notes = append(res.Notes, fmt.Sprintf("`ferry serve update` exited %d for a rollout that ended %s: %s", res.UpdateExit, end.State, res.UpdateOutput))
	}
	return nil
}

// followRollout polls the service until the rollout started by upd ends, killing and
// restarting the controller on the way when def says so. It returns the rollout as it ended.
func (b *bench) followRollout(ctx context.Context, def scenarioDef, res *scenarioResult, upd *childproc.Proc,
	prevVersion int, updateStart time.Time) (*replicas.Rollout, error) {
	deadline := updateStart.Add(b.opts.rolloutTimeout)
	killed := !def.KillController
	var apiDownSince time.Time
	var lastErr error
	for {
		b.f.SeenInstances() // records the instances there are now
		st, err := b.f.Status(ctx)
		switch {
		case err != nil:
			if apiDownSince.IsZero() {
				apiDownSince = time.Now()
			}
			lastErr = err
			if time.Since(apiDownSince) > apiOutage {
				return nil, fmt.Errorf("controller API unreachable for %v: %w", apiOutage, err)
			}
		default:
			apiDownSince = time.Time{}
			r := st.Update
			if r == nil || r.To <= prevVersion {
				// Not recorded yet: the update command may still be starting, or it failed.
				select {
				case <-upd.Exited():
					return nil, fmt.Errorf("`ferry serve update` exited (%v) before the controller had a rollout: %s", upd.Err(), servicekit.LastLines(servicekit.ReadLog(upd), 3))
				default:
				}
				break
			}
			since := time.Since(updateStart).Seconds()
			if res.NewLaunchedAtS == 0 && slices.ContainsFunc(st.Replicas, func(rec replicas.Record) bool { return rec.Version == r.To }) {
				res.NewLaunchedAtS = since
			}
			if res.NewReadyAtS == 0 && newReady(st, r.To) {
				res.NewReadyAtS = since
			}
			if !killed && newReady(st, r.To) {
				if err := b.killAndRestart(ctx, res, updateStart); err != nil {
					return nil, err
				}
				killed = true
				continue
			}
			if r.State != replicas.RolloutInProgress {
				if !killed {
					return r, fmt.Errorf("the rollout ended %s before a new replica was seen READY, so the controller was never killed", r.State)
				}
				return r, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("rollout not over after %v (last status error: %v)", b.opts.rolloutTimeout, lastErr)
		}
		if err := servicekit.SleepCtx(ctx, pollEvery); err != nil {
			return nil, err
		}
	}
}

// killAndRestart SIGKILLs the controller, then runs `ferry serve status` (which starts a new
// one) and waits until the API answers again.
func (b *bench) killAndRestart(ctx context.Context, res *scenarioResult, updateStart time.Time) error {
	pid, err := b.f.KillController(ctx)
	if err != nil {
		return err
	}
	killedAt := time.Now()
	res.KillAtS = killedAt.Sub(updateStart).Seconds()
	b.progress("scenario %s: SIGKILLed the controller (pid %d) %.1f s into the rollout, with a new replica READY", res.Key, pid, res.KillAtS)
	out, err := b.f.Run(ctx, "serve-status-restart", cliTimeout, "serve", "status", serviceName)
	if err != nil {
		return fmt.Errorf("restart the controller: %w", err)
	}
	err = servicekit.PollUntil(ctx, apiOutage, pollEvery, func() (bool, error) {
		_, err := b.f.Status(ctx)
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("controller API after the restart: %w", err)
	}
	res.ControllerDownS = time.Since(killedAt).Seconds()
	newPID, _ := b.f.ControllerPID()
	b.progress("scenario %s: controller back (pid %d) after %.1f s (`ferry serve status` said: %s)", res.Key, newPID, res.ControllerDownS, servicekit.FirstLine(out))
	return nil
}

// newReady reports whether a replica of version v is READY.
func newReady(st api.ServiceStatus, v int) bool {
	return slices.ContainsFunc(st.Replicas, func(r replicas.Record) bool {
		return r.Version == v && r.Status == replicas.StatusReady
	})
}

// readyByVersion counts READY replicas per version.
func readyByVersion(st api.ServiceStatus) map[int]int {
	out := map[int]int{}
	for _, r := range st.Replicas {
		if r.Status == replicas.StatusReady {
			out[r.Version]++
		}
	}
	return out
}

func reasonSuffix(reason string) string {
	if reason == "" {
		return ""
	}
	return " (" + reason + ")"
}

// teardown takes the service down, stops the attached proxy and the controller, and reports
// any replica or controller process left behind (then stops it, so the run leaves nothing).
// It runs on its own deadline, after the run's context may have ended.
func (b *bench) teardown() []string {
	problems := []string{}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if b.proxy != nil {
		b.f.Group.Stop(b.proxy)
	}
	if _, err := b.f.Run(ctx, "serve-down", upTimeout, "serve", "down", serviceName, "-y"); err != nil {
		problems = append(problems, err.Error())
	}
	if _, err := b.f.Run(ctx, "controller-stop", cliTimeout, "controller", "stop"); err != nil {
		problems = append(problems, err.Error())
	}
	if err := servicekit.PollUntil(ctx, 10*time.Second, pollEvery, func() (bool, error) {
		pid, err := b.f.ControllerPID()
		return pid == 0, err
	}); err != nil {
		problems = append(problems, fmt.Sprintf("controller still running after `ferry controller stop`: %v", err))
		if _, err := b.f.KillController(ctx); err != nil {
			problems = append(problems, err.Error())
		}
	}
	var live []instance
	_ = servicekit.PollUntil(ctx, 10*time.Second, pollEvery, func() (bool, error) {
		live = liveInstances(b.f)
		return len(live) == 0, nil
	})
	for _, in := range live {
		problems = append(problems, fmt.Sprintf("replica process group %d (%s, version %d) alive after `serve down` and `controller stop`; killed it", in.PGID, in.ID, version(in)))
		killGroup(in)
	}
	return problems
}

// killGroup SIGKILLs a leaked replica's process group, which this run's controller started.
func killGroup(in instance) {
	if in.PGID > 1 {
		_ = syscall.Kill(-in.PGID, syscall.SIGKILL)
	}
}
