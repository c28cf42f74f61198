package main

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/launcher/fakefault"
)

const (
	// pollEvery is how often state is read while the driver waits on it.
	pollEvery = 100 * time.Millisecond
	// cliTimeout bounds the short CLI commands.
	cliTimeout = 30 * time.Second
	// downTimeout bounds `serve down` and `jobs cancel`.
	downTimeout = 3 * time.Minute
	// localService serves on local through every scenario, under load.
	localService = "steady"
	// jobRun is how long the short jobs' nodes run before they exit.
	jobRun = 2 * time.Second
)

// Targets: what "unaffected" means.
const (
	// jobEndTarget: a job is SUCCEEDED within this long of its last node exiting.
	jobEndTarget = 5 * time.Second
	// statusTarget: `ferry serve status` answers within this long.
	statusTarget = time.Second
	// readySlack: a service is READY within twice its time before any fault, or that time plus
	// readySlack, whichever is longer.
	readySlack = 10 * time.Second
	// cleanupTarget: after the infra recovered, it holds nothing of what was torn down.
	cleanupTarget = time.Minute
)

// scenarioDef is one infra fault.
type scenarioDef struct {
	Key, Title string
	// Failing is the infra the fault hits; Healthy the cloud whose work must go on.
	Failing, Healthy string
	// Partial faults leave the failing infra usable (a zone, throttling): a new service on it
	// must be READY too, and teardown there must complete with nothing left.
	Partial bool
	// Recovers ends by itself after --outage; the controller is SIGKILLed and restarted while
	// it lasts.
	Recovers bool
	inject   func(e *env, x xState) error
	heal     func(e *env) error
}

// xState is what runs on the failing infra when the fault starts.
type xState struct {
	Zone string // the failing infra's service's replica's zone
}

// scenarios run in this order, each on a controller that healed from the previous one.
func scenarios() []scenarioDef {
	gcpSet := func(f fakefault.Fault) func(*env, xState) error {
		return func(e *env, _ xState) error { e.gce.Outages().Set(f); return nil }
	}
	awsSet := func(f fakefault.Fault) func(*env, xState) error {
		return func(e *env, _ xState) error { e.ec2.Outages().Set(f); return nil }
	}
	gcpClear := func(e *env) error { e.gce.Outages().Clear(); return nil }
	awsClear := func(e *env) error { e.ec2.Outages().Clear(); return nil }
	return []scenarioDef{
		{Key: "gcp-503", Title: "GCP answers 503 everywhere", Failing: infraGCP, Healthy: infraAWS,
			inject: gcpSet(fakefault.Fault{Status: 503}), heal: gcpClear},
		{Key: "gcp-zone-404", Title: "one GCP zone answers 404", Failing: infraGCP, Healthy: infraAWS, Partial: true,
			inject: func(e *env, x xState) error {
				e.gce.Outages().Set(fakefault.Fault{Status: 404, Zone: otherZone(x.Zone)})
				return nil
			}, heal: gcpClear},
		{Key: "aws-hang", Title: "EC2 accepts connections and never answers", Failing: infraAWS, Healthy: infraGCP,
			inject: awsSet(fakefault.Fault{Hang: true}), heal: awsClear},
		{Key: "aws-throttle", Title: "EC2 throttles (RequestLimitExceeded on 60% of calls)", Failing: infraAWS, Healthy: infraGCP, Partial: true,
			inject: awsSet(fakefault.Fault{Throttle: true, Rate: 0.6}), heal: awsClear},
		{Key: "kube-down", Title: "the Kubernetes API server stops mid-run", Failing: infraKube, Healthy: infraAWS,
			inject: func(e *env, _ xState) error { e.apiDoor.Stop(); return nil },
			heal:   func(e *env) error { return e.apiDoor.Start() }},
		{Key: "gcp-recovers", Title: "GCP answers 503, then recovers by itself (controller restarted meanwhile)", Failing: infraGCP, Healthy: infraAWS,
			Recovers: true, inject: nil, heal: nil},
	}
}

func scenarioKeys() []string {
	var keys []string
	for _, s := range scenarios() {
		keys = append(keys, s.Key)
	}
	return keys
}

// otherZone is a served zone other than z: the zone that fails while the service runs in z.
func otherZone(z string) string {
	for _, c := range gcpZones {
		if c != z {
			return c
		}
	}
	return gcpZones[0]
}

// bench is one run.
type bench struct {
	opts     options
	e        *env
	progress func(string, ...any)
	// baselines are the READY times of a service on each infra before any fault.
	baselines map[string]time.Duration
	// steady is the load on the local service, for the whole run.
	steady   *load
	endpoint string
}

// baseline brings the steady local service up and measures a service's READY time on local,
// AWS and GCP before any fault (they are torn down again).
func (b *bench) baseline(ctx context.Context, rep *report) error {
	b.baselines = map[string]time.Duration{}
	b.progress("before any fault: the steady local service and one service on each cloud")
	took, err := b.e.up(ctx, localService, infraLocal, b.opts.readyLimit)
	if err != nil {
		return err
	}
	b.baselines[infraLocal] = took
	st, err := b.e.service(ctx, localService)
	if err != nil {
		return err
	}
	b.endpoint = st.Endpoint
	b.steady = startLoad(b.endpoint)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, infra := range []string{infraAWS, infraGCP} {
		wg.Go(func() {
			name := "base-" + infra
			took, err := b.e.up(ctx, name, infra, b.opts.readyLimit)
			if err == nil {
				b.baselines[infra] = took
				_, err = b.e.f.Run(ctx, "down-"+name, downTimeout, "serve", "down", name, "-y")
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	rep.Baselines = map[string]float64{}
	for k, v := range b.baselines {
		rep.Baselines[k] = v.Seconds()
	}
	b.progress("READY before any fault: local %v, aws %v, gcp %v", b.baselines[infraLocal].Round(time.Millisecond),
		b.baselines[infraAWS].Round(time.Millisecond), b.baselines[infraGCP].Round(time.Millisecond))
	return nil
}

// runScenario runs one fault and judges it.
func (b *bench) runScenario(ctx context.Context, def scenarioDef) *result {
	res := &result{Key: def.Key, Title: def.Title, Failing: def.Failing, Healthy: def.Healthy}
	before := b.steady.snapshot()
	if err := b.scenario(ctx, def, res); err != nil {
		res.Error = err.Error()
	}
	after := b.steady.snapshot()
	res.LocalRequests, res.LocalFailed = after.sent-before.sent, after.failed-before.failed
	if after.failed > before.failed {
		res.LocalFirstError = after.firstErr
	}
	res.judge(b)
	return res
}

// scenario is one fault: work on the failing infra, the fault, new work elsewhere, teardown
// under the fault, recovery and cleanup.
func (b *bench) scenario(ctx context.Context, def scenarioDef, res *result) error {
	k := def.Key
	svcX, jobX := "x-"+k, "jx-"+k
	if _, err := b.e.up(ctx, svcX, def.Failing, b.opts.readyLimit); err != nil {
		return fmt.Errorf("before the fault: %w", err)
	}
	jobXID, err := b.e.launchJob(ctx, jobX, b.e.jobTask(jobX, def.Failing, 1, time.Hour))
	if err != nil {
		return fmt.Errorf("before the fault: %w", err)
	}
	if _, err := b.e.waitJob(ctx, jobXID, b.opts.jobLimit, jobs.Running); err != nil {
		return fmt.Errorf("before the fault: %w", err)
	}
	stX, err := b.e.service(ctx, svcX)
	if err != nil {
		return err
	}
	x := xState{}
	var xInstances []string
	for _, r := range stX.Replicas {
		x.Zone = r.Zone
		xInstances = append(xInstances, r.InstanceID)
	}
	xLoad := startLoad(stX.Endpoint)
	status := b.startStatusProbe()

	began := time.Now()
	if def.Recovers {
		b.e.gce.Outages().Set(fakefault.Fault{Status: 503, For: b.opts.outage})
	} else if err := def.inject(b.e, x); err != nil {
		return err
	}
	if def.Recovers {
		// Teardown first, then a controller restart, while the outage lasts: the restarted
		// controller must find the leftovers in its store and the new work must not wait.
		if err := b.underOutage(ctx, def, svcX, xInstances, jobXID, xLoad, status, res); err != nil {
			return err
		}
		if err := sleep(ctx, time.Until(began.Add(b.opts.outage))); err != nil {
			return err
		}
	} else {
		b.progress("  fault on %s; new work on local and %s", def.Failing, def.Healthy)
		b.newWork(ctx, def, res)
		xs := xLoad.stop()
		res.FailingRequests, res.FailingFailed, res.FailingFirstError = xs.sent, xs.failed, xs.firstErr
		b.progress("  teardown on %s under the fault", def.Failing)
		b.teardownFailing(ctx, svcX, xInstances, jobXID, res)
		if err := def.heal(b.e); err != nil {
			return err
		}
	}
	healed := time.Now()
	res.FaultS = healed.Sub(began).Seconds()
	st := status.stop()
	res.StatusCalls, res.StatusMaxS, res.StatusAPIMaxS, res.StatusErrors = st.calls, st.max.Seconds(), st.apiMax.Seconds(), st.errors
	b.progress("  %s answers again; waiting for it to hold nothing of %s and job %s", def.Failing, svcX, jobXID)
	res.CleanedAfterS = b.waitClean(ctx, def.Failing, svcX, jobXID, healed)
	return nil
}

// underOutage is the recovering scenario's part while its cloud is down: teardown there, the
// controller SIGKILLed and restarted, then the new work elsewhere.
func (b *bench) underOutage(ctx context.Context, def scenarioDef, svcX string, xInstances []string, jobXID string, xLoad *load, status *statusProbe, res *result) error {
	// The service on the down cloud serves on meanwhile.
	if err := sleep(ctx, min(5*time.Second, b.opts.outage/4)); err != nil {
		return err
	}
	xs := xLoad.stop()
	res.FailingRequests, res.FailingFailed, res.FailingFirstError = xs.sent, xs.failed, xs.firstErr
	b.progress("  %s down for %v: teardown there, then the controller SIGKILLed and restarted", def.Failing, b.opts.outage)
	b.teardownFailing(ctx, svcX, xInstances, jobXID, res)
	// The steady service's endpoint is the controller's own listener: its load pauses while
	// the controller restarts (what the infra fault does to it is measured before and after).
	b.steady.pause()
	status.pause()
	err := b.e.killController(ctx)
	if err == nil {
		_, err = b.e.waitReady(ctx, localService, time.Now(), b.opts.readyLimit)
	}
	status.resume()
	b.steady.resume()
	if err != nil {
		return fmt.Errorf("restart the controller: %w", err)
	}
	res.ControllerRestarted = true
	b.progress("  new work on local and %s while %s is still down", def.Healthy, def.Failing)
	b.newWork(ctx, def, res)
	return nil
}

// newWork starts, while the fault lasts, services and jobs on local and on the healthy cloud
// (and on the failing infra for a partial fault), and measures them.
func (b *bench) newWork(ctx context.Context, def scenarioDef, res *result) {
	k := def.Key
	var wg sync.WaitGroup
	var mu sync.Mutex
	fail := func(what string, err error) {
		mu.Lock()
		defer mu.Unlock()
		res.Why = append(res.Why, fmt.Sprintf("%s: %v", what, err))
	}
	ready := func(name, infra string, into *float64) {
		defer wg.Done()
		took, err := b.e.up(ctx, name, infra, b.opts.readyLimit)
		if err != nil {
			*into = -1
			fail("service "+name+" on "+infra, err)
			return
		}
		*into = took.Seconds()
		if _, err := b.e.f.Run(ctx, "down-"+name, downTimeout, "serve", "down", name, "-y"); err != nil {
			fail("serve down "+name, err)
		}
	}
	ended := func(name, infra string, nodes int, into *float64) {
		defer wg.Done()
		took, err := b.jobEnd(ctx, name, infra, nodes)
		if err != nil {
			*into = -1
			fail("job "+name+" on "+infra, err)
			return
		}
		*into = took.Seconds()
	}
	wg.Add(4)
	go ready("l-"+k, infraLocal, &res.LocalReadyS)
	go ready("h-"+k, def.Healthy, &res.HealthyReadyS)
	go ended("jl-"+k, infraLocal, 2, &res.LocalJobEndS)
	go ended("jh-"+k, def.Healthy, 1, &res.HealthyJobEndS)
	if def.Partial {
		wg.Add(1)
		go ready("n-"+k, def.Failing, &res.FailingReadyS)
	}
	wg.Wait()
}

// jobEnd launches a short job and returns how long after its last node exited it was
// SUCCEEDED.
func (b *bench) jobEnd(ctx context.Context, name, infra string, nodes int) (time.Duration, error) {
	id, err := b.e.launchJob(ctx, name, b.e.jobTask(name, infra, nodes, jobRun))
	if err != nil {
		return 0, err
	}
	var seen time.Time
	j, err := b.e.waitJob(ctx, id, b.opts.jobLimit, jobs.Succeeded, jobs.Failed, jobs.FailedSetup, jobs.FailedNoResource, jobs.FailedController, jobs.Cancelled)
	seen = time.Now()
	if err != nil {
		return 0, err
	}
	if j.State != jobs.Succeeded {
		return 0, fmt.Errorf("ended %s: %s", j.State, j.Reason)
	}
	exit, err := b.e.lastExit(name, nodes)
	if err != nil {
		return 0, err
	}
	// The controller's own end time is the better reading; what the driver saw bounds it.
	end := seen
	if !j.EndedAt.IsZero() && j.EndedAt.Before(seen) {
		end = j.EndedAt
	}
	return max(end.Sub(exit), 0), nil
}

// teardownFailing takes down the failing infra's service and job while the fault lasts and
// records what they say they left.
func (b *bench) teardownFailing(ctx context.Context, svc string, instances []string, jobID string, res *result) {
	began := time.Now()
	out, err := b.e.f.Run(ctx, "down-"+svc, downTimeout, "serve", "down", svc, "-y")
	res.DownS = time.Since(began).Seconds()
	res.DownOutput = lastLines(out, 12)
	if err != nil {
		res.Why = append(res.Why, fmt.Sprintf("serve down %s under the fault: %v", svc, err))
	}
	for _, id := range instances {
		if strings.Contains(out, id) {
			res.DownLeft = append(res.DownLeft, id)
		}
	}
	// What the infra still holds must be what the output said it left.
	if live, err := b.e.live(ctx, res.Failing, ownerLabel(false), svc); err == nil {
		for _, id := range live {
			if !strings.Contains(out, id[strings.LastIndexByte(id, '/')+1:]) {
				res.Unreported = append(res.Unreported, id)
			}
		}
	}
	began = time.Now()
	if _, err := b.e.f.Run(ctx, "cancel-"+jobID, cliTimeout, "jobs", "cancel", jobID, "-y"); err != nil {
		res.Why = append(res.Why, fmt.Sprintf("jobs cancel %s under the fault: %v", jobID, err))
		return
	}
	j, err := b.e.waitJob(ctx, jobID, downTimeout, jobs.Cancelled)
	res.CancelS = time.Since(began).Seconds()
	if err != nil {
		res.Why = append(res.Why, fmt.Sprintf("job %s did not end CANCELLED under the fault: %v", jobID, err))
		return
	}
	for _, l := range j.LeftBehind {
		res.CancelLeft = append(res.CancelLeft, l.Describe())
	}
	if live, err := b.e.live(ctx, res.Failing, ownerLabel(true), jobID); err == nil && len(live) > 0 && len(j.LeftBehind) == 0 {
		res.Unreported = append(res.Unreported, live...)
	}
}

// waitClean waits until the failing infra holds nothing of the service and the job, and
// returns how long after healed that was (-1: not within --cleanup-limit).
func (b *bench) waitClean(ctx context.Context, infra, svc, jobID string, healed time.Time) float64 {
	for time.Since(healed) < b.opts.cleanupLimit {
		svcLeft, err1 := b.e.live(ctx, infra, ownerLabel(false), svc)
		jobLeft, err2 := b.e.live(ctx, infra, ownerLabel(true), jobID)
		if err1 == nil && err2 == nil && len(svcLeft) == 0 && len(jobLeft) == 0 {
			return time.Since(healed).Seconds()
		}
		if sleep(ctx, 250*time.Millisecond) != nil {
			break
		}
	}
	return -1
}

// teardown takes the steady service down and reports what is left.
func (b *bench) teardown(ctx context.Context) []string {
	var problems []string
	if b.steady != nil {
		b.steady.stop()
	}
	if _, err := b.e.f.Run(ctx, "down-"+localService, downTimeout, "serve", "down", localService, "-y"); err != nil {
		problems = append(problems, fmt.Sprintf("serve down %s: %v", localService, err))
	}
	return problems
}

// statusProbe times `ferry serve status` while a fault lasts.
type statusProbe struct {
	stopOnce func() statusStats
	// gate is held by each call and, while a controller restarts, by pause.
	gate *sync.Mutex
}

// pause waits for the call in flight and holds the next until resume.
func (p *statusProbe) pause() { p.gate.Lock() }

func (p *statusProbe) resume() { p.gate.Unlock() }

type statusStats struct {
	calls, errors int
	// max is the CLI's wall time (a process start included); apiMax the controller's answer
	// to the same question over its API.
	max, apiMax time.Duration
}

func (p *statusProbe) stop() statusStats { return p.stopOnce() }

// startStatusProbe runs `ferry serve status` every --status-every until stopped.
func (b *bench) startStatusProbe() *statusProbe {
	done := make(chan struct{})
	result := make(chan statusStats, 1)
	gate := &sync.Mutex{}
	go func() {
		var st statusStats
		t := time.NewTicker(b.opts.statusEvery)
		defer t.Stop()
		for {
			gate.Lock()
			cmd := exec.Command(b.e.f.Bin, "serve", "status")
			cmd.Env = b.e.f.Env
			began := time.Now()
			err := cmd.Run()
			st.max = max(st.max, time.Since(began))
			began = time.Now()
			if err == nil {
				err = b.e.services(context.Background())
			}
			st.apiMax = max(st.apiMax, time.Since(began))
			st.calls++
			if err != nil {
				st.errors++
			}
			gate.Unlock()
			select {
			case <-done:
				result <- st
				return
			case <-t.C:
			}
		}
	}()
	var once sync.Once
	var st statusStats
	return &statusProbe{gate: gate, stopOnce: func() statusStats {
		once.Do(func() { close(done); st = <-result })
		return st
	}}
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) []string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return slices.Clone(lines[max(0, len(lines)-n):])
}
