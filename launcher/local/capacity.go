package local

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// Local capacity. Ferry cannot see GPUs from Go, so this machine's GPUs are what the ferry
// config declares (Options.Accelerators, from local.accelerators), and its CPUs and memory
// what it declares under local.cpus and local.memory. An instance that asks for a declared
// GPU, or for cpus or memory when those are declared, holds them while its processes live, as
// a pod holds its node's allocatable by its requests: a launch that does not fit fails with
// launcher.ErrNoCapacity — a job waits PENDING, a replica tries its next infra — unless it may
// preempt. What the config does not declare is not counted: `infra: local` runs anything, for
// development against simulated replicas.
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

// holder is an instance holding GPUs, as the capacity check sees it.
type holder struct {
	id, name    string
	job         string              // its LabelJob, "" for a replica
	claim       configs.Accelerator // the declared GPU it holds, whole devices or a share; Name "" when none
	cpus, mem   float64             // what it holds of the declared CPUs and GiB of memory
	priority    int
	preemptible bool
	launchedAt  time.Time
	preempted   bool // already stopping for another launch: its GPUs free soon
}

// claimOf is the declared GPU spec asks for, if any: its placement's accelerator (the
// optimizer's choice), else the first the task names.
func (p *Provider) claimOf(spec launcher.Spec) (configs.Accelerator, bool) {
	acc := configs.Accelerator{Name: spec.Placement.Accelerator, Count: spec.Placement.AcceleratorCount}
	if acc.Name == "" && len(spec.Resources.Accelerators) > 0 {
		acc = spec.Resources.Accelerators[0]
	}
	if acc.Name == "" || acc.Count <= 0 {
		return configs.Accelerator{}, false
	}
	for _, d := range p.opts.Accelerators {
		if strings.EqualFold(d.Name, acc.Name) {
			return configs.Accelerator{Name: d.Name, Count: acc.Count}, true
		}
	}
	return configs.Accelerator{}, false
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

// reserve holds spec's GPUs, CPUs and memory (what the config declares of them) for instance
// id until release, or fails with ErrNoCapacity (after starting to preempt what it may) or
// ErrInvalid (more than this machine declares).
func (p *Provider) reserve(spec launcher.Spec, id string) (release func(), err error) {
	want := p.wants(spec)
	if want.claim.Name == "" && want.cpus == 0 && want.mem == 0 {
		return func() {}, nil
	}
	want.id, want.name, want.job, want.launchedAt = id, spec.Name, spec.Labels[launcher.LabelJob], time.Now()
	p.capMu.Lock()
	defer p.capMu.Unlock()
	if short := p.short(nil, want); short != "" {
		return nil, fmt.Errorf("%w: a node asks for more than this machine declares: %s", launcher.ErrInvalid, short)
	}
	held, err := p.holders()
	if err != nil {
		return nil, err
	}
	if short := p.short(held, want); short != "" {
		if spec.Job != nil && spec.Labels[launcher.LabelService] == "" {
			// A job's node: between jobs the queue preempts (jobs/preempt.go), not the infra.
			return nil, fmt.Errorf("%w: %s (%s)", launcher.ErrNoCapacity, short, describeHolders(held))
		}
		return nil, p.preemptFor(want, short, held)
	}
	p.pending[id] = want
	return func() {
		p.capMu.Lock()
		delete(p.pending, id)
		p.capMu.Unlock()
	}, nil
}

// wants is what spec holds once launched: its declared GPU, and its cpus and memory where the
// config declares those, with its priority.
func (p *Provider) wants(spec launcher.Spec) holder {
	var h holder
	if claim, ok := p.claimOf(spec); ok {
		h.claim = claim
	}
	if p.opts.CPUs > 0 {
		h.cpus = amount(spec.Resources.CPUs)
	}
	if p.opts.MemoryGiB > 0 {
		h.mem = amount(spec.Resources.Memory)
	}
	h.priority, h.preemptible = priorityOf(spec)
	return h
}

// amount is a cpus or memory request's number ("4", "4+": 4), 0 when none.
func amount(s string) float64 {
	v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), "+"), 64)
	if err != nil || !(v > 0) {
		return 0
	}
	return v
}

// short says what of this machine's declared capacity want does not find beside held, "" when
// it fits: whole GPUs take free devices, a fraction shares one (fits), CPUs and memory add up.
func (p *Provider) short(held []holder, want holder) string {
	const eps = 1e-9
	if name := want.claim.Name; name != "" {
		var counts []float64
		for _, h := range held {
			if strings.EqualFold(h.claim.Name, name) {
				counts = append(counts, h.claim.Count)
			}
		}
		if devices := p.devices(name); !fits(devices, counts, want.claim.Count) {
			return fmt.Sprintf("local's %d %s are in use", devices, name)
		}
	}
	var cpus, mem float64
	for _, h := range held {
		cpus, mem = cpus+h.cpus, mem+h.mem
	}
	if want.cpus > 0 && cpus+want.cpus > p.opts.CPUs+eps {
		return fmt.Sprintf("local's %s declared CPUs are in use (%s held, %s asked)", formatCount(p.opts.CPUs), formatCount(cpus), formatCount(want.cpus))
	}
	if want.mem > 0 && mem+want.mem > p.opts.MemoryGiB+eps {
		return fmt.Sprintf("local's %s GiB of declared memory are in use (%s held, %s asked)", formatCount(p.opts.MemoryGiB), formatCount(mem), formatCount(want.mem))
	}
	return ""
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

// holders are the live instances and launches in flight that hold any of the declared
// capacity. An instance holds it until its processes are gone, preempted or not.
func (p *Provider) holders() ([]holder, error) {
	entries, err := os.ReadDir(p.opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("list local instances: %w", err)
	}
	var out []holder
	for _, e := range entries {
		meta, err := loadMetadata(filepath.Join(p.opts.Dir, e.Name()))
		if err != nil || (meta.GPU == nil && meta.CPUs == 0 && meta.MemoryGiB == 0) {
			continue
		}
		if meta.ExitReason != "" || !instanceAlive(meta) {
			continue
		}
		h := holder{id: meta.ID, name: meta.Name, job: meta.Labels[launcher.LabelJob], cpus: meta.CPUs, mem: meta.MemoryGiB,
			priority: meta.Priority, preemptible: meta.Preemptible, launchedAt: meta.LaunchedAt, preempted: meta.PreemptedBy != ""}
		if meta.GPU != nil {
			h.claim = *meta.GPU
		}
		out = append(out, h)
	}
	for _, h := range p.pending {
		out = append(out, h)
	}
	return out, nil
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

// preemptFor stops the fewest preemptible, lower-priority holders that make room for replica
// launch want (short: what it lacks), and returns the ErrNoCapacity that tells the launch to
// come back once they are gone (or why nothing can be taken).
func (p *Provider) preemptFor(want holder, short string, held []holder) error {
	busy := fmt.Errorf("%w: %s (%s)", launcher.ErrNoCapacity, short, describeHolders(held))
	var keep, victims []holder
	for _, h := range held {
		if h.preempted {
			victims = append(victims, h) // going already: counts as freed
		} else {
			keep = append(keep, h)
		}
	}
	if p.short(keep, want) == "" {
		return fmt.Errorf("%w; waiting for %s to stop", busy, describeHolders(victims))
	}
	candidates := slices.DeleteFunc(slices.Clone(keep), func(h holder) bool { return !p.mayPreempt(h, want.priority) })
	// Lowest priority first, then the newest: the least work lost.
	slices.SortFunc(candidates, func(a, b holder) int {
		return cmp.Or(cmp.Compare(a.priority, b.priority), b.launchedAt.Compare(a.launchedAt))
	})
	var chosen []holder
	for _, c := range candidates {
		keep = slices.DeleteFunc(keep, func(h holder) bool { return h.id == c.id })
		chosen = append(chosen, c)
		if p.short(keep, want) == "" {
			for _, v := range chosen {
				p.preempt(v, fmt.Sprintf("preempted for %s (priority %d) on local", want.name, want.priority))
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
	p.mu.Lock() // wait() records an exit under mu: neither write may lose the other's
	meta, err := loadMetadata(dir)
	if err == nil {
		meta.PreemptedBy = why
		err = saveMetadata(dir, meta)
	}
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
	// Stopped as Terminate would (the same grace), leaving the directory for the owner's
	// Terminate, which archives the log.
	go func() { _ = p.endGroup(context.Background(), meta, true) }()
}

func describeHolders(hs []holder) string {
	parts := make([]string, 0, len(hs))
	for _, h := range hs {
		var what []string
		if h.claim.Name != "" {
			what = append(what, formatCount(h.claim.Count))
		}
		if h.cpus > 0 {
			what = append(what, formatCount(h.cpus)+" CPUs")
		}
		if h.mem > 0 {
			what = append(what, formatCount(h.mem)+" GiB")
		}
		parts = append(parts, fmt.Sprintf("%s holds %s (priority %d)", who(h.name, h.job), strings.Join(what, ", "), h.priority))
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

func formatCount(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

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
