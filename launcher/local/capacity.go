package local

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// Local capacity. Ferry cannot see GPUs from Go, so this machine's GPUs are what the ferry
// config declares (Options.Accelerators, from local.accelerators). An instance that asks for a
// declared GPU holds its share while its processes live, as a pod holds its node's allocatable:
// a launch that does not fit fails with launcher.ErrNoCapacity — a job waits PENDING, a replica
// tries its next infra — unless it may preempt. GPUs the config does not declare are not
// counted: `infra: local` runs anything, for development against simulated replicas.
//
// Serving preempts jobs here as Ferry's priority classes let Kubernetes' scheduler do: a
// replica's launch that does not fit may take the GPUs of running instances that are
// preemptible (a job's node with preemptible: true) and of a lower priority (replicas run at
// launcher.ServingPriority). Victims are taken lowest priority first, then newest first (the
// least work lost), and only as many as make the launch fit; each gets SIGTERM and its grace,
// and lists as PREEMPTED from then on, so that its job recovers. The replica's launch still
// fails with ErrNoCapacity until the victims' processes are gone, and the replica manager
// retries, as a pod nominated to a node waits for its victims to leave. A job preempted here is
// not preempted again within Options.PreemptionCooldown, so a stream of replicas cannot starve
// it. Between jobs the job queue preempts (jobs/preempt.go), as on every infra Ferry owns.

// DefaultPreemptionCooldown is Options.PreemptionCooldown's default.
const DefaultPreemptionCooldown = 5 * time.Minute

// gpuClaim is what an instance holds of one declared GPU type: whole devices, or a share of
// one (a fraction, as GPU sharing asks).
type gpuClaim struct {
	Name  string  `json:"name"`
	Count float64 `json:"count"`
}

// holder is an instance holding GPUs, as the capacity check sees it.
type holder struct {
	id, name    string
	job         string // its LabelJob, "" for a replica
	claim       gpuClaim
	priority    int
	preemptible bool
	launchedAt  time.Time
	preempted   bool // already stopping for another launch: its GPUs free soon
}

// claimOf is the declared GPU spec asks for, if any: its placement's accelerator (the
// optimizer's choice), else the first the task names.
func (p *Provider) claimOf(spec launcher.Spec) (gpuClaim, bool) {
	acc := configs.Accelerator{Name: spec.Placement.Accelerator, Count: spec.Placement.AcceleratorCount}
	if acc.Name == "" && len(spec.Resources.Accelerators) > 0 {
		acc = spec.Resources.Accelerators[0]
	}
	if acc.Name == "" || acc.Count <= 0 {
		return gpuClaim{}, false
	}
	for _, d := range p.opts.Accelerators {
		if strings.EqualFold(d.Name, acc.Name) {
			return gpuClaim{Name: d.Name, Count: acc.Count}, true
		}
	}
	return gpuClaim{}, false
}

// priorityOf is spec's scheduling priority and whether a higher one may preempt it.
func priorityOf(spec launcher.Spec) (int, bool) {
	if spec.Job == nil {
		return launcher.ServingPriority, false
	}
	// A multi-node replica's nodes carry a JobSpec at serving priority; only a job's own
	// nodes are preemptible.
	return spec.Job.Priority, spec.Job.Preemptible && spec.Labels[launcher.LabelService] == ""
}

// reserve holds spec's GPUs for instance id until release, or fails with ErrNoCapacity (after
// starting to preempt what it may) or ErrInvalid (more than this machine declares).
func (p *Provider) reserve(spec launcher.Spec, id string) (release func(), err error) {
	claim, ok := p.claimOf(spec)
	if !ok {
		return func() {}, nil
	}
	prio, preemptible := priorityOf(spec)
	p.capMu.Lock()
	defer p.capMu.Unlock()
	devices := p.devices(claim.Name)
	if !fits(devices, nil, claim.Count) {
		return nil, fmt.Errorf("%w: a node asks for %s:%s, and local.accelerators declares %d %s on this machine",
			launcher.ErrInvalid, claim.Name, formatCount(claim.Count), devices, claim.Name)
	}
	held, err := p.holders(claim.Name)
	if err != nil {
		return nil, err
	}
	if !fits(devices, counts(held), claim.Count) {
		if spec.Job != nil && spec.Labels[launcher.LabelService] == "" {
			// A job's node: between jobs the queue preempts (jobs/preempt.go), not the infra.
			return nil, fmt.Errorf("%w: local's %d %s are in use (%s)", launcher.ErrNoCapacity, devices, claim.Name, describeHolders(held))
		}
		return nil, p.preemptFor(spec.Name, claim, prio, devices, held)
	}
	p.pending[id] = holder{id: id, name: spec.Name, job: spec.Labels[launcher.LabelJob], claim: claim,
		priority: prio, preemptible: preemptible, launchedAt: time.Now()}
	return func() {
		p.capMu.Lock()
		delete(p.pending, id)
		p.capMu.Unlock()
	}, nil
}

// devices is how many GPUs named name this machine declares.
func (p *Provider) devices(name string) int {
	n := 0
	for _, d := range p.opts.Accelerators {
		if strings.EqualFold(d.Name, name) {
			n += int(d.Count)
		}
	}
	return n
}

// holders are the live instances and launches in flight that hold GPUs named name. An
// instance holds them until its processes are gone, preempted or not.
func (p *Provider) holders(name string) ([]holder, error) {
	entries, err := os.ReadDir(p.opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("list local instances: %w", err)
	}
	var out []holder
	for _, e := range entries {
		meta, err := loadMetadata(filepath.Join(p.opts.Dir, e.Name()))
		if err != nil || meta.GPU == nil || !strings.EqualFold(meta.GPU.Name, name) {
			continue
		}
		if meta.ExitReason != "" || !instanceAlive(meta) {
			continue
		}
		out = append(out, holder{id: meta.ID, name: meta.Name, job: meta.Labels[launcher.LabelJob], claim: *meta.GPU,
			priority: meta.Priority, preemptible: meta.Preemptible, launchedAt: meta.LaunchedAt, preempted: meta.PreemptedBy != ""})
	}
	for _, h := range p.pending {
		if strings.EqualFold(h.claim.Name, name) {
			out = append(out, h)
		}
	}
	return out, nil
}

func counts(hs []holder) []float64 {
	out := make([]float64, len(hs))
	for i, h := range hs {
		out[i] = h.claim.Count
	}
	return out
}

// fits reports whether a claim of want fits devices GPUs beside claims held: whole counts take
// whole free devices, a fraction shares a device with other fractions (first fit, largest
// first), as GPU sharing packs them.
func fits(devices int, held []float64, want float64) bool {
	free := make([]float64, devices) // what each device has left
	for i := range free {
		free[i] = 1
	}
	all := append(slices.Clone(held), want)
	slices.SortFunc(all, func(a, b float64) int { return cmp.Compare(b, a) })
	const eps = 1e-9
	for _, c := range all {
		if c >= 1 {
			need := int(c + 1 - eps) // whole devices, rounded up
			for i := range free {
				if need > 0 && free[i] >= 1-eps {
					free[i], need = 0, need-1
				}
			}
			if need > 0 {
				return false
			}
			continue
		}
		i := slices.IndexFunc(free, func(f float64) bool { return f+eps >= c })
		if i < 0 {
			return false
		}
		free[i] -= c
	}
	return true
}

// preemptFor stops the fewest preemptible, lower-priority holders that make claim fit for
// replica launch at priority prio, and
// returns the ErrNoCapacity that tells the launch to come back once they are gone (or why
// nothing can be taken).
func (p *Provider) preemptFor(launch string, claim gpuClaim, prio, devices int, held []holder) error {
	busy := fmt.Errorf("%w: local's %d %s are in use (%s)", launcher.ErrNoCapacity, devices, claim.Name, describeHolders(held))
	var keep []holder
	var victims []holder
	for _, h := range held {
		if h.preempted {
			victims = append(victims, h) // going already: counts as freed
		} else {
			keep = append(keep, h)
		}
	}
	if fits(devices, counts(keep), claim.Count) {
		return fmt.Errorf("%w; waiting for %s to stop", busy, describeHolders(victims))
	}
	candidates := slices.DeleteFunc(slices.Clone(keep), func(h holder) bool { return !p.mayPreempt(h, prio) })
	// Lowest priority first, then the newest: the least work lost.
	slices.SortFunc(candidates, func(a, b holder) int {
		return cmp.Or(cmp.Compare(a.priority, b.priority), b.launchedAt.Compare(a.launchedAt))
	})
	var chosen []holder
	for _, c := range candidates {
		keep = slices.DeleteFunc(keep, func(h holder) bool { return h.id == c.id })
		chosen = append(chosen, c)
		if fits(devices, counts(keep), claim.Count) {
			for _, v := range chosen {
				p.preempt(v, fmt.Sprintf("preempted for %s (priority %d) on local's %s", launch, prio, claim.Name))
			}
			return fmt.Errorf("%w; preempting %s", busy, describeHolders(chosen))
		}
	}
	return busy
}

// mayPreempt reports whether a launch at priority prio may take h's GPUs.
func (p *Provider) mayPreempt(h holder, prio int) bool {
	if !h.preemptible || h.priority >= prio || h.id == "" {
		return false
	}
	if _, launching := p.pending[h.id]; launching {
		return false
	}
	if h.job != "" {
		if at, ok := p.preemptedAt[h.job]; ok && time.Since(at) < p.opts.PreemptionCooldown {
			return false // preempted recently: its turn to make progress
		}
	}
	return true
}

// preempt marks h PREEMPTED (why) and stops its process group in the background: SIGTERM,
// then SIGKILL after its grace. Its owner sees PREEMPTED in List at once and terminates it.
func (p *Provider) preempt(h holder, why string) {
	dir := filepath.Join(p.opts.Dir, h.id)
	p.mu.Lock()
	meta, err := loadMetadata(dir)
	p.mu.Unlock()
	if err != nil {
		return
	}
	meta.PreemptedBy = why
	p.mu.Lock() // wait() records an exit under mu: neither write may lose the other's
	err = saveMetadata(dir, meta)
	p.mu.Unlock()
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			p.log.Warn("mark instance preempted", zap.String("instance", h.id), zap.Error(err))
		}
		return
	}
	if h.job != "" {
		p.preemptedAt[h.job] = time.Now()
	}
	p.log.Info("preempting instance", zap.String("instance", h.id), zap.String("name", h.name), zap.String("why", why))
	go func() {
		// Stopped as Terminate would (the same grace), leaving the directory for the owner's
		// Terminate, which archives the log.
		if err := signalInstance(meta, syscall.SIGTERM); err != nil {
			return
		}
		grace := cmp.Or(meta.StopGrace, p.opts.StopGrace)
		if !waitGone(context.Background(), meta, grace) {
			_ = signalInstance(meta, syscall.SIGKILL)
		}
	}()
}

func describeHolders(hs []holder) string {
	parts := make([]string, 0, len(hs))
	for _, h := range hs {
		parts = append(parts, fmt.Sprintf("%s holds %s (priority %d)", who(h.name, h.job), formatCount(h.claim.Count), h.priority))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// who names an instance for messages: "job 4's high-4-1", or a replica's name.
func who(name, job string) string {
	if job == "" {
		return name
	}
	return "job " + job + "'s " + name
}

func formatCount(f float64) string { return strings.TrimSuffix(fmt.Sprintf("%g", f), ".0") }

// checkGang refuses a gang of n nodes whose GPUs this machine could never hold at once.
func (p *Provider) checkGang(spec launcher.Spec, n int) error {
	claim, ok := p.claimOf(spec)
	if !ok {
		return nil
	}
	devices := p.devices(claim.Name)
	if fits(devices, slices.Repeat([]float64{claim.Count}, n-1), claim.Count) {
		return nil
	}
	return fmt.Errorf("%w: %d nodes of %s:%s each, and local.accelerators declares %d %s on this machine",
		launcher.ErrInvalid, n, claim.Name, formatCount(claim.Count), devices, claim.Name)
}
