package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// The queue: jobs waiting for capacity (PENDING, or RECOVERING with no nodes) are tried in
// priority order, highest first, then in the order they were submitted, so that a
// higher-priority job gets freed capacity first. A job that does not fit is passed over for the
// next (Kueue's BestEffortFIFO: a small job is not held behind a big one that cannot start; a
// big gang can therefore wait while smaller ones keep taking capacity — give it a higher
// priority). The queue runs at every poke (a job submitted or ended, capacity freed) and every
// RetryInterval.
//
// Each launch runs in its own goroutine, and the queue waits for it at most LaunchHold before
// it goes on to the next job: a fast launch (local, Kubernetes) still keeps priority order,
// while one held by a slow or hung infra (a cloud waiting for a VM, an endpoint that never
// answers) holds only its own job. That job stays owned by its launch, and is not tried again,
// until the launch returns.

// runQueue tries the queue until ctx ends.
func (m *Manager) runQueue(ctx context.Context) {
	t := time.NewTicker(m.cfg.RetryInterval)
	defer t.Stop()
	for {
		m.schedule(ctx)
		select {
		case <-ctx.Done():
			return
		case <-m.poke:
		case <-t.C:
		}
	}
}

// waiting returns the ids of the jobs that need a gang, in queue order.
func (m *Manager) waiting() []int64 {
	m.mu.Lock()
	var js []*Job
	for _, j := range m.jobs {
		_, busy := m.active[j.ID]
		if (j.State == Pending || j.State == Recovering) && len(j.Nodes) == 0 && !busy {
			js = append(js, j)
		}
	}
	slices.SortFunc(js, func(a, b *Job) int {
		return cmp.Or(cmp.Compare(b.Priority, a.Priority), a.SubmittedAt.Compare(b.SubmittedAt), cmp.Compare(a.ID, b.ID))
	})
	ids := make([]int64, len(js))
	for i, j := range js {
		ids[i] = j.ID
	}
	m.mu.Unlock()
	return ids
}

// schedule tries each waiting job once, in queue order, waiting for each launch at most
// LaunchHold. Capacity freed during a pass, after a job was passed over for the lack of it,
// starts the pass again from the top: otherwise the next job down, lower in priority, would
// take what the one passed over waited for. A stop under way then is waited for (at most
// LaunchHold), as the capacity it frees shows before it returns. A node that ends on its own
// frees its capacity before its job's watch sees it and stops it (WatchInterval later): a
// lower job tried in that window takes it, as Kueue's BestEffortFIFO would.
func (m *Manager) schedule(ctx context.Context) {
	const mostPasses = 8 // each is caused by a node stopping; the queue's next poke goes on
	waited := false      // for stops under way: once, so that a slow infra's stop holds it once
	for range mostPasses {
		if !m.schedulePass(ctx, &waited) {
			return
		}
	}
}

// schedulePass is one pass of schedule; it reports whether it stopped to start again.
func (m *Manager) schedulePass(ctx context.Context, waited *bool) (again bool) {
	var freed uint64 // the stops that had ended when the first job passed over was tried
	passedOver := false
	for _, id := range m.waiting() {
		if ctx.Err() != nil {
			return false
		}
		if passedOver && !*waited {
			m.awaitStops(ctx)
			*waited = true
		}
		if passedOver && m.freed.Load() != freed {
			return true
		}
		before := m.freed.Load()
		launched := m.startLaunch(ctx, id)
		if launched == nil {
			continue
		}
		hold := time.NewTimer(m.cfg.LaunchHold)
		select {
		case <-launched:
			if j, err := m.Get(id); err == nil && len(j.Nodes) == 0 && !passedOver {
				passedOver, freed = true, before
			}
		case <-hold.C:
			m.log.Info("a job's launch is taking long; the queue goes on without it", zap.Int64("job", id),
				zap.Duration("held", m.cfg.LaunchHold))
		case <-ctx.Done():
		}
		hold.Stop()
	}
	return false
}

// awaitStops waits, at most LaunchHold, until no stop of a node is under way.
func (m *Manager) awaitStops(ctx context.Context) {
	const poll = 5 * time.Millisecond
	deadline := time.Now().Add(m.cfg.LaunchHold)
	for m.stopping.Load() > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(poll)
	}
}

// startLaunch launches job id's gang in a goroutine that owns the job until the launch
// returns, and returns a channel closed then; nil when another goroutine owns the job.
func (m *Manager) startLaunch(parent context.Context, id int64) <-chan struct{} {
	ctx, done, ok := m.own(parent, id)
	if !ok {
		return nil
	}
	launched := make(chan struct{})
	m.spawn("launch", func() {
		defer close(launched)
		placed := m.launch(ctx, id, done)
		done()
		if !placed {
			m.endCancelled(context.WithoutCancel(ctx), id)
		}
	})
	return launched
}

// endCancelled ends job id if a cancel reached it while its launch owned it, too late for the
// launch to see: after its last look at the job (its try saved as waiting, or refused to start),
// before it gave the job up. That cancel left the job CANCELLING to its owner; with the owner
// gone and no nodes, nothing else would end it.
func (m *Manager) endCancelled(ctx context.Context, id int64) {
	if j, err := m.Get(id); err == nil && j.State == Cancelling && len(j.Nodes) == 0 {
		m.release(ctx, id, Cancelled, "cancelled by the user")
	}
}

// launch places job id's gang: the attempt is saved first (so that a controller killed
// mid-launch recognises the half-made gang), then the provisioner tries placements best first.
// An elastic job tries smaller gangs down to its min_nodes (elastic.go), each an attempt of its
// own. No capacity anywhere, or an infra that failed, leaves the job waiting, with the reason;
// a task no infra can run is FAILED_NO_RESOURCE. done gives up the job's ownership, handed to
// the watch once the gang runs; placed says it was.
func (m *Manager) launch(ctx context.Context, id int64, done func()) (placed bool) {
	first, err := m.Get(id)
	if err != nil {
		return false
	}
	sizes := launchSizes(first)
	for i, size := range sizes {
		j, ok := m.attempt(id, size, i > 0)
		if !ok {
			return false
		}
		insts, err := m.cfg.Provider.LaunchGang(ctx, m.spec(j), size)
		if err == nil {
			m.placed(ctx, id, insts, done)
			return true
		}
		if i+1 < len(sizes) && smallerMayFit(ctx, err) {
			m.log.Info("an elastic job's gang does not fit; trying one node fewer", zap.Int64("job", id),
				zap.Int("nodes", size), zap.Int("min_nodes", sizes[len(sizes)-1]), zap.Error(err))
			continue
		}
		m.launchFailed(ctx, j, err)
		return false
	}
	return false
}

// attempt saves the next launch of job id, a gang of size nodes, before it is made; again says
// an elastic launch tries a smaller gang after its larger one found no room.
func (m *Manager) attempt(id int64, size int, again bool) (Job, bool) {
	return m.update(id, func(j *Job) bool {
		waiting := j.State == Pending || j.State == Recovering || (again && j.State == Starting)
		if !waiting || len(j.Nodes) > 0 {
			return false
		}
		if !j.InQueue {
			// A queued request is found again by its attempt's labels (capacity.go).
			j.Attempt++
		}
		j.GangSize = size
		switch {
		case strings.HasPrefix(j.Reason, waitingForCapacity) || j.InQueue:
			// Trying again: it stays as it was, saying why it waits, rather than flickering
			// through STARTING at every try.
		case j.State == Pending:
			j.setState(Starting, fmt.Sprintf("launching %d node(s)", size), m.cfg.Now())
		default:
			j.Reason = fmt.Sprintf("relaunching %d node(s)", size)
		}
		return true
	})
}

// placed records job id's launched gang and hands it to a watch.
func (m *Manager) placed(ctx context.Context, id int64, insts []launcher.Instance, done func()) {
	started, ok := m.update(id, func(cur *Job) bool {
		if cur.State == Cancelling {
			cur.Nodes = nodesOf(insts)
			return true
		}
		cur.Nodes = nodesOf(insts)
		cur.GangSize = len(insts) // the placement's own shape, when the task offers several
		cur.CostSince = m.cfg.Now()
		to := cur.Where()
		m.started(cur, runningReason(*cur, len(insts), to))
		if h := len(cur.History); h > 0 && cur.History[h-1].ResumedAt.IsZero() {
			r := &cur.History[h-1]
			r.ResumedAt, r.To = m.cfg.Now(), to
			r.Lost = r.ResumedAt.Sub(r.At)
		}
		return true
	})
	if !ok {
		return
	}
	if started.State == Cancelling {
		m.release(ctx, id, Cancelled, "cancelled by the user")
		return
	}
	m.log.Info("job running", zap.Int64("job", id), zap.Int("attempt", started.Attempt), zap.String("where", started.Where()),
		zap.Int("nodes", len(started.Nodes)), zap.Float64("price_per_hour", started.PricePerHour()))
	done() // the watch owns the nodes from here
	m.startWatch(id)
	m.spawn("withdraw", func() { m.withdrawQueued(ctx, started) }) // capacity.go
}

// waitingForCapacity starts the reason of a job that found no capacity and is tried again.
const waitingForCapacity = "waiting for capacity: "

// launchFailed records why a launch did not place the gang.
func (m *Manager) launchFailed(ctx context.Context, j Job, err error) {
	if ctx.Err() != nil {
		// Cancelled (or the controller is stopping): a cancel finishes here; a stop leaves the
		// job STARTING for the next controller to relaunch.
		if cur, _ := m.Get(j.ID); cur.State == Cancelling {
			m.release(context.WithoutCancel(ctx), j.ID, Cancelled, "cancelled by the user")
		}
		return
	}
	back := Pending
	if j.State == Recovering {
		back = Recovering
	}
	switch {
	case errors.Is(err, launcher.ErrInvalid) && !launcher.IsInfraFault(err):
		// Invalid everywhere. An infra that failed (down, throttled, refusing credentials) is
		// no verdict on the task: the job then waits for it, or for another, as for capacity.
		m.transition(j.ID, FailedNoResource, "no enabled infra can run it: "+err.Error(), nil)
		m.release(ctx, j.ID, FailedNoResource, "")
	case m.waitedTooLong(j, err):
		m.release(ctx, j.ID, FailedNoResource, "") // withdraws a queued request (capacity.go)
	default: // no capacity, held in a cloud's queue, or an infra that failed
		since := waitStart(j, err, m.cfg.Now())
		reason := waitReason(err, since)
		if errors.Is(err, launcher.ErrNoCapacity) && !launcher.IsInfraFault(err) {
			reason += m.preemptFor(j) // preempt.go
		}
		m.transition(j.ID, back, reason, func(cur *Job) {
			cur.WaitingSince, cur.InQueue = since, errors.Is(err, launcher.ErrQueued)
		})
		m.log.Info("job waits for capacity", zap.Int64("job", j.ID), zap.Error(err))
	}
}

// spec is what every node of job j's next gang runs.
func (m *Manager) spec(j Job) launcher.Spec {
	t := j.Task
	id := strconv.FormatInt(j.ID, 10)
	envs := maps.Clone(t.Envs)
	if envs == nil {
		envs = map[string]string{}
	}
	maps.Copy(envs, t.Secrets)
	envs[launcher.EnvTaskID] = j.TaskID
	envs[launcher.EnvNumGPUsPerNode] = strconv.Itoa(gpusPerNode(t.Resources))
	envs["FERRY_JOB_ID"] = id
	job := t.Job
	if job == nil {
		d := configs.DefaultJob()
		job = &d
	}
	port := 0
	if len(t.Resources.Ports) > 0 {
		port = t.Resources.Ports[0]
	}
	return launcher.Spec{
		// <name>-<job id>-<attempt>, and GangName adds the rank: unique across recoveries,
		// so an ended gang's logs are never overwritten by the next one's.
		Name:         fmt.Sprintf("%s-%s-%d", shortName(j.Name), id, j.Attempt),
		Cluster:      shortName(j.Name) + "-" + id, // SkyPilot's managed job cluster: the same across recoveries
		Labels:       withTaskLabels(t.Resources.Labels, labelsFor(j.ID, j.Attempt)),
		InstanceType: t.Resources.InstanceType,
		Setup:        t.Setup,
		Run:          t.Run,
		Workdir:      t.Workdir,
		GitWorkdir:   t.GitWorkdir,
		Kubernetes:   t.KubernetesConfig(),
		FileMounts:   t.FileMounts,
		MountModes:   t.MountModes,
		Envs:         envs,
		SecretEnvs:   t.SecretEnvNames(),
		Port:         port,
		Resources:    t.Resources,
		Job: &launcher.JobSpec{
			Priority:        job.Priority,
			Preemptible:     job.Preemptible,
			Grace:           time.Duration(job.GracePeriodSeconds) * time.Second,
			CheckpointClaim: launcher.CheckpointClaim(id),
			CheckpointDir:   m.cfg.CheckpointMount,
		},
	}
}

// withTaskLabels adds the task's resources.labels under Ferry's own (configs keeps them apart).
func withTaskLabels(task, own map[string]string) map[string]string {
	out := maps.Clone(task)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, own)
	return out
}

// gpusPerNode is SKYPILOT_NUM_GPUS_PER_NODE: the accelerator count each node asks for, rounded
// up (SkyPilot rounds fractional GPUs up), the largest among the alternatives.
func gpusPerNode(r configs.Resources) int {
	n := 0.0
	for _, c := range r.Candidates() {
		for _, a := range c.Accelerators {
			n = math.Max(n, a.Count)
		}
	}
	return int(math.Ceil(n))
}

// shortName keeps instance names within what every infra accepts once ids are appended.
func shortName(name string) string {
	const most = 40
	if len(name) > most {
		name = name[:most]
	}
	for len(name) > 0 && name[len(name)-1] == '-' {
		name = name[:len(name)-1]
	}
	return name
}

// nodesOf records a gang's instances in rank order.
func nodesOf(insts []launcher.Instance) []Node {
	out := make([]Node, len(insts))
	for i, in := range insts {
		rank := i
		if r, err := strconv.Atoi(in.Labels[launcher.LabelNodeRank]); err == nil {
			rank = r
		}
		out[i] = Node{Rank: rank, InstanceID: in.ID, IP: in.IP, Infra: in.Infra, Region: in.Region,
			Zone: in.Zone, Spot: in.Spot, Price: in.PricePerHour, WindowEnd: in.WindowEnd}
	}
	slices.SortFunc(out, func(a, b Node) int { return cmp.Compare(a.Rank, b.Rank) })
	return out
}
