package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/launcher"
)

// clouds is the provisioner as the jobs manager meets it, in process: the env's real local
// provider (infra "local") beside an in-memory cloud, "gcp", whose API can be made to fail or
// hang per operation. As provision.Provisioner does, ListIn asks only the infras named and
// waits for each at most straggle, reporting one that fails or does not answer as a gap, and
// Terminate on a failing infra hands the node to its janitor (LeaveBehind) and returns a
// *launcher.LeftBehindError. A gang of a task with `infra: gcp` is launched on gcp, as VMs
// that run until the test says they exited (exit).
type clouds struct {
	local    *gangs
	straggle time.Duration

	mu  sync.Mutex
	vms map[string]*launcher.Instance
	seq int
	// faults are by operation: "list", "launch", "terminate", "cleanup".
	faults map[string]fault
	// unhang is closed (and replaced) when the faults are cleared, releasing what hangs.
	unhang chan struct{}
	// lists counts the listings of each infra; launches the gcp launches of each job.
	lists    map[string]int
	launches map[string]int
	left     map[string]launcher.Leftover
}

// fault is how an operation on gcp fails: with a 503 (unavailable), or hanging until its
// context ends (hang), or until the faults are cleared whatever its context (deaf: a call
// that ignores its deadline). zone limits a listing's fault to that zone.
type fault struct {
	hang, deaf bool
	zone       string
}

const (
	gcpRegion = "us-central1"
	gcpZone   = "us-central1-a"
)

func newClouds(local *gangs, straggle time.Duration) *clouds {
	return &clouds{local: local, straggle: straggle, vms: map[string]*launcher.Instance{}, faults: map[string]fault{},
		unhang: make(chan struct{}), lists: map[string]int{}, launches: map[string]int{}, left: map[string]launcher.Leftover{}}
}

// down makes op fail on gcp as f says.
func (c *clouds) down(op string, f fault) {
	c.mu.Lock()
	c.faults[op] = f
	c.mu.Unlock()
}

// up clears every fault and releases every call that hangs.
func (c *clouds) up() {
	c.mu.Lock()
	clear(c.faults)
	close(c.unhang)
	c.unhang = make(chan struct{})
	c.mu.Unlock()
}

// fail is op's fault on gcp, after hanging if it hangs; nil when op works (or was released).
func (c *clouds) fail(ctx context.Context, op string) error {
	c.mu.Lock()
	f, ok := c.faults[op]
	released := c.unhang
	c.mu.Unlock()
	switch {
	case !ok:
		return nil
	case f.deaf:
		<-released
		return nil
	case f.hang:
		select {
		case <-ctx.Done():
			return launcher.ClassifyTransport(ctx.Err())
		case <-released:
			return nil
		}
	}
	return fmt.Errorf("gcp: %s: HTTP 503 backendError: %w", op, launcher.ErrUnavailable)
}

func (c *clouds) LaunchGang(ctx context.Context, spec launcher.Spec, n int) ([]launcher.Instance, error) {
	if spec.Resources.Infra != "gcp" {
		return c.local.LaunchGang(ctx, spec, n)
	}
	c.mu.Lock()
	c.launches[spec.Labels[launcher.LabelJob]]++
	c.mu.Unlock()
	if err := c.fail(ctx, "launch"); err != nil {
		// As a provider that tried its locations and found one that does not take the task
		// and one that does not answer: no verdict on the task.
		return nil, fmt.Errorf("every location failed: gcp/us-west1: %w: no such machine type; gcp/us-central1: %w", launcher.ErrInvalid, err)
	}
	return c.launchGCP(spec.Labels, n), nil
}

// launchGCP makes an n-node gang of VMs on gcp labelled labels.
func (c *clouds) launchGCP(labels map[string]string, n int) []launcher.Instance {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]launcher.Instance, n)
	for rank := range n {
		c.seq++
		l := maps.Clone(labels)
		l[launcher.LabelNodeRank] = strconv.Itoa(rank)
		vm := &launcher.Instance{ID: fmt.Sprintf("gcp-%d", c.seq), Infra: "gcp", Region: gcpRegion, Zone: gcpZone,
			State: launcher.StateRunning, Labels: l, LaunchedAt: time.Now(), IP: fmt.Sprintf("10.0.0.%d", c.seq), PricePerHour: 1}
		c.vms[vm.ID] = vm
		out[rank] = *vm
	}
	return out
}

// exit ends the programs of job id's VMs with status code, as their boot script reports it.
func (c *clouds) exit(id int64, code int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, vm := range c.vms {
		if vm.Labels[launcher.LabelJob] == strconv.FormatInt(id, 10) {
			vm.State, vm.ExitCode = launcher.StateTerminated, &code
		}
	}
}

func (c *clouds) List(ctx context.Context, selector map[string]string) ([]launcher.Instance, error) {
	return c.ListIn(ctx, []string{"gcp", "local"}, selector)
}

func (c *clouds) ListIn(ctx context.Context, infras []string, selector map[string]string) ([]launcher.Instance, error) {
	type answer struct {
		insts []launcher.Instance
		gaps  []launcher.Gap
	}
	deadline := time.Now().Add(c.straggle)
	answers := make([]chan answer, len(infras))
	for i, name := range infras {
		c.mu.Lock()
		c.lists[name]++
		c.mu.Unlock()
		answers[i] = make(chan answer, 1)
		go func() {
			insts, gaps := c.listOne(ctx, name, selector)
			answers[i] <- answer{insts, gaps}
		}()
	}
	var out []launcher.Instance
	var gaps []launcher.Gap
	for i, name := range infras {
		// An answer already in wins over a deadline that passed while waiting for another.
		select {
		case a := <-answers[i]:
			out, gaps = append(out, a.insts...), append(gaps, a.gaps...)
			continue
		default:
		}
		timer := time.NewTimer(time.Until(deadline))
		select {
		case a := <-answers[i]:
			out, gaps = append(out, a.insts...), append(gaps, a.gaps...)
		case <-timer.C:
			gaps = append(gaps, launcher.Gap{Infra: name, Err: fmt.Errorf("%w: %s did not answer within %v", launcher.ErrUnavailable, name, c.straggle)})
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		}
		timer.Stop()
	}
	return out, launcher.PartialList(gaps)
}

func (c *clouds) listOne(ctx context.Context, name string, selector map[string]string) ([]launcher.Instance, []launcher.Gap) {
	switch name {
	case "local":
		insts, err := c.local.List(ctx, selector)
		if err != nil {
			return nil, []launcher.Gap{{Infra: name, Err: err}}
		}
		return insts, nil
	case "gcp":
	default:
		return nil, []launcher.Gap{{Infra: name, Err: fmt.Errorf("%w: %s is not enabled here", launcher.ErrNotFound, name)}}
	}
	c.mu.Lock()
	f, faulty := c.faults["list"]
	c.mu.Unlock()
	var gaps []launcher.Gap
	if faulty && f.zone != "" {
		gaps = []launcher.Gap{{Infra: "gcp", Region: gcpRegion, Zone: f.zone, Err: fmt.Errorf("gcp: zone %s: HTTP 503: %w", f.zone, launcher.ErrUnavailable)}}
	} else if err := c.fail(ctx, "list"); err != nil {
		return nil, []launcher.Gap{{Infra: "gcp", Err: err}}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []launcher.Instance
	for _, vm := range c.vms {
		if matches(vm.Labels, selector) && (len(gaps) == 0 || vm.Zone != f.zone) {
			out = append(out, *vm)
		}
	}
	return out, gaps
}

func matches(labels, selector map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func (c *clouds) Terminate(ctx context.Context, id string) error {
	if !strings.HasPrefix(id, "gcp-") {
		return c.local.Terminate(ctx, id)
	}
	if err := c.fail(ctx, "terminate"); err != nil {
		l := launcher.Leftover{Infra: "gcp", InstanceID: id, Reason: err.Error()}
		_ = c.LeaveBehind(l)
		return &launcher.LeftBehindError{Leftover: l, Err: err}
	}
	c.mu.Lock()
	delete(c.vms, id)
	c.mu.Unlock()
	return nil
}

func (c *clouds) CleanupJob(ctx context.Context, job string) error {
	return errors.Join(c.local.CleanupJob(ctx, job), c.fail(ctx, "cleanup"))
}

func (c *clouds) LogPath(id string) (string, error) {
	if strings.HasPrefix(id, "gcp-") {
		return "", fmt.Errorf("%w: gcp keeps no local log", launcher.ErrNotFound)
	}
	return c.local.LogPath(id)
}

func (c *clouds) LeaveBehind(l launcher.Leftover) error {
	if l.Key == "" {
		l.Key = launcher.LeftoverKey(l)
	}
	c.mu.Lock()
	c.left[l.Key] = l
	c.mu.Unlock()
	return nil
}

func (c *clouds) Leftovers() []launcher.Leftover {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.SortedFunc(maps.Values(c.left), func(a, b launcher.Leftover) int { return strings.Compare(a.Key, b.Key) })
}

func (c *clouds) listCalls(infra string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lists[infra]
}

func (c *clouds) launchCalls(id int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.launches[strconv.FormatInt(id, 10)]
}

func (c *clouds) vmsOf(id int64) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, vm := range c.vms {
		if vm.Labels[launcher.LabelJob] == strconv.FormatInt(id, 10) {
			out = append(out, vm.ID)
		}
	}
	slices.Sort(out)
	return out
}

var (
	_ jobs.Provider           = (*clouds)(nil)
	_ launcher.JobCleaner     = (*clouds)(nil)
	_ launcher.LogSource      = (*clouds)(nil)
	_ launcher.LeftoverKeeper = (*clouds)(nil)
)

// listsEverything is clouds behind a provider that cannot list by infra: every listing asks
// every infra, and the manager must judge a partial list outside its gaps.
type listsEverything struct{ c *clouds }

func (p listsEverything) LaunchGang(ctx context.Context, spec launcher.Spec, n int) ([]launcher.Instance, error) {
	return p.c.LaunchGang(ctx, spec, n)
}
func (p listsEverything) List(ctx context.Context, sel map[string]string) ([]launcher.Instance, error) {
	return p.c.List(ctx, sel)
}
func (p listsEverything) Terminate(ctx context.Context, id string) error {
	return p.c.Terminate(ctx, id)
}
func (p listsEverything) LogPath(id string) (string, error) { return p.c.LogPath(id) }
func (p listsEverything) CleanupJob(ctx context.Context, job string) error {
	return p.c.CleanupJob(ctx, job)
}

// withClouds restarts the env's manager over clouds in front of its local provider, with
// tune's changes to the config, and returns the clouds and the manager's warnings.
func withClouds(e *env, straggle time.Duration, tune func(*jobs.Config)) (*clouds, *observer.ObservedLogs) {
	c := newClouds(e.prov, straggle)
	core, logs := observer.New(zap.InfoLevel)
	e.stop()
	e.provider = c
	e.tune = func(cfg *jobs.Config) {
		cfg.Logger = zap.New(core)
		if tune != nil {
			tune(cfg)
		}
	}
	e.start()
	// Cleanups run last first: hung calls are released before the manager is stopped.
	e.t.Cleanup(c.up)
	return c, logs
}

const gcpGang = "name: train\nnum_nodes: 2\nresources:\n  infra: gcp\nrun: python train.py\n"

// The first bug of issue 32: a local gang whose ranks have exited ends SUCCEEDED within about
// one watch interval while another infra's API fails or hangs — that infra is not even asked
// when the provider can list by infra, and its gap does not hold the verdict when it cannot.
func TestLocalGangEndsWhileAnotherInfraFails(t *testing.T) {
	const interval = time.Second
	tests := []struct {
		name      string
		f         fault
		listsAll  bool
		wantAsked bool
	}{
		{name: "gcp answers 503", f: fault{}},
		{name: "gcp hangs", f: fault{hang: true}},
		{name: "gcp answers 503 to a provider that lists everything", f: fault{}, listsAll: true, wantAsked: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			// A look that asked a hung gcp would take the straggle wait, far beyond the bound.
			c, _ := withClouds(e, 20*time.Second, func(cfg *jobs.Config) { cfg.WatchInterval = interval })
			if tc.listsAll {
				e.stop()
				e.provider = listsEverything{c}
				e.start()
			}
			c.down("list", tc.f)
			marker := filepath.Join(t.TempDir(), "go")
			j := e.submit(fmt.Sprintf("num_nodes: 2\nrun: |\n  while [ ! -f %s ]; do sleep 0.02; done\n  echo done\n", marker))
			e.waitState(j.ID, jobs.Running)
			exited := time.Now()
			if err := os.WriteFile(marker, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			done := e.waitState(j.ID, jobs.Succeeded)
			// One interval to the next look, and room for a loaded machine to notice the exits.
			if took, most := time.Since(exited), interval+8*time.Second; took > most {
				t.Errorf("SUCCEEDED %v after its nodes exited, want within %v", took, most)
			}
			if fmt.Sprint(done.ExitCodes) != "[0 0]" || len(done.LeftBehind) != 0 {
				t.Errorf("exit codes %v, left behind %v: want [0 0] and nothing", done.ExitCodes, done.LeftBehind)
			}
			if asked := c.listCalls("gcp") > 0; asked != tc.wantAsked {
				t.Errorf("gcp listed %d times for a job on local; want asked=%v", c.listCalls("gcp"), tc.wantAsked)
			}
		})
	}
}

// A gap over a node of the gang makes it unknown: the job stays RUNNING however its nodes
// ended, says once which infra does not answer and since when, and is judged once its infra
// answers. A gap elsewhere (another zone) holds nothing back.
func TestGapOverNodeKeepsJobRunning(t *testing.T) {
	tests := []struct {
		name      string
		f         fault
		wantWhere string // "" when the gang is judged at once
	}{
		{name: "gcp answers 503", f: fault{}, wantWhere: "gcp"},
		{name: "gcp hangs", f: fault{hang: true}, wantWhere: "gcp"},
		{name: "its zone fails", f: fault{zone: gcpZone}, wantWhere: "gcp/" + gcpZone},
		{name: "another zone fails", f: fault{zone: "us-central1-b"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			c, logs := withClouds(e, 500*time.Millisecond, nil)
			j := e.submit(gcpGang)
			run := e.waitState(j.ID, jobs.Running)
			if run.Where() != "gcp/"+gcpZone || len(run.Nodes) != 2 {
				t.Fatalf("gang on %s with %d nodes, want 2 on gcp/%s", run.Where(), len(run.Nodes), gcpZone)
			}
			c.down("list", tc.f)
			c.exit(j.ID, 0) // both ranks finished while their infra is not answering
			if tc.wantWhere == "" {
				if done := e.waitState(j.ID, jobs.Succeeded); fmt.Sprint(done.ExitCodes) != "[0 0]" {
					t.Errorf("exit codes %v", done.ExitCodes)
				}
				return
			}
			u := e.waitFor(j.ID, 20*time.Second, "said its nodes do not answer", func(j jobs.Job) bool {
				return strings.Contains(j.Reason, "not answering since")
			})
			if want := "nodes on " + tc.wantWhere + " not answering since "; !strings.HasPrefix(u.Reason, want) || !strings.Contains(u.Reason, "unavailable") {
				t.Errorf("reason %q, want it to start %q and give the infra's error", u.Reason, want)
			}
			// Several more looks decide nothing and say nothing new.
			looked := c.listCalls("gcp")
			e.waitFor(j.ID, 20*time.Second, "looked again", func(jobs.Job) bool { return c.listCalls("gcp") >= looked+5 })
			if cur, _ := e.m.Get(j.ID); cur.State != jobs.Running || cur.Attempt != 1 || cur.Reason != u.Reason || len(cur.Nodes) != 2 {
				t.Fatalf("while its nodes are hidden: %s attempt %d nodes %d reason %q; want RUNNING, attempt 1, both nodes, the same reason",
					cur.State, cur.Attempt, len(cur.Nodes), cur.Reason)
			}
			if n := logs.FilterMessage("job's nodes cannot be listed; the gang is not judged until they can").Len(); n != 1 {
				t.Errorf("%d warnings that the nodes cannot be listed over many looks, want 1", n)
			}
			c.up()
			done := e.waitState(j.ID, jobs.Succeeded)
			if fmt.Sprint(done.ExitCodes) != "[0 0]" || done.Attempt != 1 || done.Reason != "every node exited 0" {
				t.Errorf("after its infra answered: exit codes %v attempt %d reason %q", done.ExitCodes, done.Attempt, done.Reason)
			}
			if left := c.vmsOf(j.ID); len(left) != 0 {
				t.Errorf("VMs left after the job ended: %v", left)
			}
		})
	}
}

// A launch that hangs holds only its own job: the queue goes on to the next after its short
// hold, and the hung job is not tried again until its launch returns.
func TestHungLaunchDoesNotHoldTheQueue(t *testing.T) {
	e := newEnv(t)
	c, _ := withClouds(e, 500*time.Millisecond, nil) // the default LaunchHold
	c.down("launch", fault{hang: true})
	stuck := e.submit("name: stuck\nnum_nodes: 2\njob: {priority: 900}\nresources:\n  infra: gcp\nrun: train\n")
	e.waitFor(stuck.ID, 10*time.Second, "began its launch", func(jobs.Job) bool { return c.launchCalls(stuck.ID) == 1 })
	next := e.submit("name: next\nrun: exec sleep 600\n")
	e.waitFor(next.ID, 20*time.Second, "started beside the hung launch", func(j jobs.Job) bool { return j.State == jobs.Running })
	// The queue keeps going: a later job runs to its end while the launch still hangs.
	last := e.submit("name: last\nrun: echo ok\n")
	e.waitState(last.ID, jobs.Succeeded)
	if cur, _ := e.m.Get(stuck.ID); cur.State != jobs.Starting || cur.Attempt != 1 || c.launchCalls(stuck.ID) != 1 {
		t.Fatalf("hung job %s attempt %d launched %d times; want STARTING, attempt 1, launched once", cur.State, cur.Attempt, c.launchCalls(stuck.ID))
	}
	// A cancel cuts a hung launch short.
	also := e.submit("name: also\nresources:\n  infra: gcp\nrun: train\n")
	e.waitFor(also.ID, 20*time.Second, "began its launch", func(jobs.Job) bool { return c.launchCalls(also.ID) == 1 })
	if _, err := e.m.Cancel(also.ID); err != nil {
		t.Fatal(err)
	}
	if done := e.waitState(also.ID, jobs.Cancelled); done.Reason != "cancelled by the user" || len(done.LeftBehind) != 0 {
		t.Errorf("cancelled during its launch: reason %q, left behind %v", done.Reason, done.LeftBehind)
	}
	c.up() // the launch returns
	r := e.waitState(stuck.ID, jobs.Running)
	if r.Attempt != 1 || len(r.Nodes) != 2 || c.launchCalls(stuck.ID) != 1 {
		t.Errorf("after its launch returned: attempt %d, %d nodes, launched %d times", r.Attempt, len(r.Nodes), c.launchCalls(stuck.ID))
	}
	for _, j := range []jobs.Job{stuck, next} {
		if _, err := e.m.Cancel(j.ID); err != nil {
			t.Fatal(err)
		}
		e.waitState(j.ID, jobs.Cancelled)
	}
}

// A launch that failed because an infra does not answer is no verdict on the task, even when
// another location found it invalid: the job waits, saying why, and starts once it answers.
func TestLaunchOnDownInfraWaits(t *testing.T) {
	e := newEnv(t)
	c, _ := withClouds(e, 500*time.Millisecond, nil)
	c.down("launch", fault{})
	j := e.submit(gcpGang)
	w := e.waitFor(j.ID, 20*time.Second, "waited", func(j jobs.Job) bool {
		return j.State != jobs.Starting && j.Attempt > 0 && c.launchCalls(j.ID) >= 2
	})
	if w.State != jobs.Pending || !strings.Contains(w.Reason, "waiting for capacity") || !strings.Contains(w.Reason, "unavailable") {
		t.Fatalf("job %s (%s), want PENDING waiting, with the infra's error", w.State, w.Reason)
	}
	c.up()
	e.waitState(j.ID, jobs.Running)
	if _, err := e.m.Cancel(j.ID); err != nil {
		t.Fatal(err)
	}
	e.waitState(j.ID, jobs.Cancelled)
}

// Cancelling a job whose infra does not answer ends it CANCELLED anyway, within a bounded
// time, with what could not be stopped handed to the provisioner, in LeftBehind and in the
// reason.
func TestCancelWithUnreachableInfra(t *testing.T) {
	const stopTimeout = 2 * time.Second
	tests := []struct {
		name   string
		faults map[string]fault
		// wantSelector: a leftover for any other node of the job on gcp (it could not be listed).
		wantSelector bool
		wantReason   string
	}{
		{name: "gcp down", faults: map[string]fault{"list": {}, "terminate": {}, "cleanup": {}}, wantSelector: true,
			wantReason: "cancelled by the user; 2 node(s) left on gcp, stopped when gcp answers again"},
		{name: "terminate fails", faults: map[string]fault{"terminate": {}},
			wantReason: "cancelled by the user; 2 node(s) left on gcp, stopped when gcp answers again"},
		{name: "terminate ignores its deadline", faults: map[string]fault{"terminate": {deaf: true}, "cleanup": {deaf: true}},
			wantReason: "cancelled by the user; 2 node(s) left on gcp, stopped when gcp answers again"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			c, _ := withClouds(e, 500*time.Millisecond, func(cfg *jobs.Config) { cfg.StopTimeout = stopTimeout })
			j := e.submit(gcpGang)
			run := e.waitState(j.ID, jobs.Running)
			for op, f := range tc.faults {
				c.down(op, f)
			}
			asked := time.Now()
			if _, err := e.m.Cancel(j.ID); err != nil {
				t.Fatal(err)
			}
			done := e.waitState(j.ID, jobs.Cancelled)
			// Listing, terminating and cleaning up are each bounded by StopTimeout.
			if took, most := time.Since(asked), 3*stopTimeout+10*time.Second; took > most {
				t.Errorf("CANCELLED %v after the cancel, want within %v", took, most)
			}
			if !strings.HasPrefix(done.Reason, tc.wantReason) {
				t.Errorf("reason %q, want it to start %q", done.Reason, tc.wantReason)
			}
			var ids []string
			selectors := 0
			for _, l := range done.LeftBehind {
				switch {
				case l.Infra != "gcp" || l.Owner != fmt.Sprintf("job %d", j.ID) || l.Key == "" || l.Since.IsZero() || l.Reason == "":
					t.Errorf("leftover %+v: want on gcp, owned by the job, keyed, dated, with the reason", l)
				case l.InstanceID != "":
					ids = append(ids, l.InstanceID)
				case l.Selector[launcher.LabelJob] == strconv.FormatInt(j.ID, 10) && !l.Before.IsZero():
					selectors++
				default:
					t.Errorf("leftover %+v selects nothing of the job", l)
				}
			}
			slices.Sort(ids)
			if want := []string{run.Nodes[0].InstanceID, run.Nodes[1].InstanceID}; !slices.Equal(ids, want) {
				t.Errorf("nodes left behind %v, want %v", ids, want)
			}
			if want := map[bool]int{true: 1}[tc.wantSelector]; selectors != want {
				t.Errorf("%d selector leftovers, want %d", selectors, want)
			}
			// The provisioner has them all, to stop when gcp answers again.
			kept := c.Leftovers()
			for _, l := range done.LeftBehind {
				if !slices.ContainsFunc(kept, func(k launcher.Leftover) bool { return k.Key == l.Key && k.Owner == l.Owner }) {
					t.Errorf("leftover %s not handed to the provisioner (it has %v)", l.Key, kept)
				}
			}
		})
	}
}

// A controller restarted while the infra of a job's nodes does not answer neither judges nor
// relaunches the job: a RUNNING gang stays RUNNING until its nodes are seen, and a launch the
// restart cut short is adopted — not launched again — once they are.
func TestRestartWhileInfraDown(t *testing.T) {
	t.Run("running gang", func(t *testing.T) {
		e := newEnv(t)
		c, _ := withClouds(e, 500*time.Millisecond, nil)
		j := e.submit(gcpGang)
		e.waitState(j.ID, jobs.Running)
		e.stop()
		c.down("list", fault{})
		c.exit(j.ID, 0)
		e.start()
		e.waitFor(j.ID, 20*time.Second, "said its nodes do not answer", func(j jobs.Job) bool {
			return strings.HasPrefix(j.Reason, "nodes on gcp not answering since")
		})
		looked := c.listCalls("gcp")
		e.waitFor(j.ID, 20*time.Second, "looked again", func(jobs.Job) bool { return c.listCalls("gcp") >= looked+5 })
		if cur, _ := e.m.Get(j.ID); cur.State != jobs.Running || cur.Attempt != 1 || c.launchCalls(j.ID) != 1 {
			t.Fatalf("after the restart: %s attempt %d, launched %d times; want RUNNING, attempt 1, launched once", cur.State, cur.Attempt, c.launchCalls(j.ID))
		}
		c.up()
		if done := e.waitState(j.ID, jobs.Succeeded); done.Attempt != 1 || fmt.Sprint(done.ExitCodes) != "[0 0]" {
			t.Errorf("attempt %d exit codes %v", done.Attempt, done.ExitCodes)
		}
	})
	for _, cancelled := range []bool{false, true} {
		name := "launch cut short"
		if cancelled {
			name += ", then cancelled"
		}
		t.Run(name, func(t *testing.T) { testLaunchCutShortWhileInfraDown(t, cancelled) })
	}
}

// testLaunchCutShortWhileInfraDown: a launch cut short by a restart, with gcp down, is held
// and then adopted once gcp answers — or, cancelled meanwhile, ends CANCELLED leaving the job's
// nodes on gcp, which it could not list, to the provisioner.
func testLaunchCutShortWhileInfraDown(t *testing.T, cancelled bool) {
	e := newEnv(t)
	c, _ := withClouds(e, 500*time.Millisecond, nil)
	e.stop()
	task, err := configs.Parse("job.yaml", []byte(gcpGang), configs.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	// What the dead controller left: the job STARTING at attempt 1, its whole gang up on
	// gcp, which now does not answer.
	now := time.Now()
	id, err := e.store.CreateJob(jobs.Job{Name: "train", Task: task, State: jobs.Starting, Reason: "launching 2 node(s)", Attempt: 1,
		SubmittedAt: now, StateSince: now, Priority: 500})
	if err != nil {
		t.Fatal(err)
	}
	gang := c.launchGCP(map[string]string{launcher.LabelOwner: "true", launcher.LabelJob: strconv.FormatInt(id, 10), launcher.LabelAttempt: "1"}, 2)
	c.down("list", fault{})
	e.start()
	e.waitFor(id, 20*time.Second, "said why it waits", func(j jobs.Job) bool {
		return strings.Contains(j.Reason, "restarted during its launch; nodes on gcp not answering since")
	})
	looked := c.listCalls("gcp")
	e.waitFor(id, 20*time.Second, "looked again", func(jobs.Job) bool { return c.listCalls("gcp") >= looked+5 })
	if cur, _ := e.m.Get(id); cur.State != jobs.Starting || cur.Attempt != 1 || c.launchCalls(id) != 0 || len(c.vmsOf(id)) != 2 {
		t.Fatalf("while gcp is down: %s attempt %d, launched %d times, VMs %v; want STARTING, attempt 1, never launched, the gang kept",
			cur.State, cur.Attempt, c.launchCalls(id), c.vmsOf(id))
	}
	if cancelled {
		if _, err := e.m.Cancel(id); err != nil {
			t.Fatal(err)
		}
		done := e.waitState(id, jobs.Cancelled)
		if want := "cancelled by the user; gcp could not be listed: any node of it there is stopped when gcp answers again"; done.Reason != want {
			t.Errorf("reason %q, want %q", done.Reason, want)
		}
		if len(done.LeftBehind) != 1 || done.LeftBehind[0].Infra != "gcp" || done.LeftBehind[0].Selector[launcher.LabelJob] != strconv.FormatInt(id, 10) ||
			len(c.Leftovers()) != 1 {
			t.Errorf("left behind %+v, the provisioner keeps %+v; want every node of the job on gcp, once", done.LeftBehind, c.Leftovers())
		}
		return
	}
	c.up()
	r := e.waitState(id, jobs.Running)
	if r.Attempt != 1 || c.launchCalls(id) != 0 || len(r.Nodes) != 2 || r.Nodes[0].InstanceID != gang[0].ID || r.Nodes[1].InstanceID != gang[1].ID {
		t.Errorf("after gcp answered: attempt %d, launched %d times, nodes %+v; want the gang it had, adopted", r.Attempt, c.launchCalls(id), r.Nodes)
	}
	if _, err := e.m.Cancel(id); err != nil {
		t.Fatal(err)
	}
	e.waitState(id, jobs.Cancelled)
}
