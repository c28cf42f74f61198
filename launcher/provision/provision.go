// Package provision is the launcher a service or job talks to: one launcher.Provider over
// every enabled infra. Launch asks a Planner for placements (the optimizer: Kubernetes first,
// then clouds by price), tries them in order, and fails over: a capacity or quota error blocks
// that location for a while and the next placement is tried. List and Terminate reach the
// infras that could hold the caller's instances.
package provision

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/policy"
)

// DefaultBlockFor is how long a location that answered "no capacity" is skipped. SkyPilot
// blocks a failed zone for the rest of one launch attempt; Ferry launches replica by replica,
// so the block must outlive one launch, yet end soon enough to come back to a cheaper location
// (a cluster's freed GPUs, a zone's returning spot capacity).
const DefaultBlockFor = 5 * time.Minute

// Planner orders the placements that satisfy r, best first. The optimizer is the real one.
type Planner interface {
	Plan(ctx context.Context, r configs.Resources) ([]launcher.Placement, error)
}

// PlannerFunc adapts a function to Planner.
type PlannerFunc func(ctx context.Context, r configs.Resources) ([]launcher.Placement, error)

// Plan calls f.
func (f PlannerFunc) Plan(ctx context.Context, r configs.Resources) ([]launcher.Placement, error) {
	return f(ctx, r)
}

// Infra is one enabled infra: its canonical name ("local", "kubernetes/CONTEXT", "aws",
// "gcp") and the provider that launches there.
type Infra struct {
	Name     string
	Provider launcher.Provider
}

// Options configures a Provisioner.
type Options struct {
	Infras  []Infra
	Planner Planner
	// BlockFor is how long a failed location is skipped; default DefaultBlockFor.
	BlockFor time.Duration
	// Now is the clock blocks use; nil is time.Now.
	Now    func() time.Time
	Logger *zap.Logger
}

// Provisioner fails over across infras. It is safe for concurrent use.
type Provisioner struct {
	opts   Options
	log    *zap.Logger
	infras map[string]launcher.Provider

	// blocks are shared with scoped copies: a location full for one service is full for all.
	blocks *blockSet
	// spread is this Provisioner's own (a scoped copy's: one service's).
	spread *spreadState
}

// blockSet holds the locations that failed recently, by location key.
type blockSet struct {
	mu sync.Mutex
	m  map[string]block
}

// spreadState is what one caller's spot launches know of each other beyond the caller's own
// view: launches under way by zone, and instances placed so recently that the caller may not
// list them yet. Without it, replicas launched in one pass all pick the same "empty" zone.
type spreadState struct {
	mu       sync.Mutex
	inflight map[string]int    // zone key → launches under way
	placed   map[string]placed // instance id → where and when
}

type placed struct {
	key string
	at  time.Time
}

// placedTTL is how long a placement counts without the caller reporting it: by then the
// caller's own view has it (or it is gone).
const placedTTL = 10 * time.Minute

func newSpreadState() *spreadState {
	return &spreadState{inflight: map[string]int{}, placed: map[string]placed{}}
}

type block struct {
	until  time.Time
	reason string
}

// New checks opts and returns a Provisioner.
func New(opts Options) (*Provisioner, error) {
	if opts.Planner == nil {
		return nil, errors.New("provision: missing Planner")
	}
	if len(opts.Infras) == 0 {
		return nil, errors.New("provision: no infra enabled")
	}
	if opts.BlockFor <= 0 {
		opts.BlockFor = DefaultBlockFor
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	p := &Provisioner{opts: opts, log: opts.Logger, infras: map[string]launcher.Provider{}, blocks: &blockSet{m: map[string]block{}}, spread: newSpreadState()}
	for _, in := range opts.Infras {
		if in.Name == "" || in.Provider == nil {
			return nil, fmt.Errorf("provision: infra %q has no name or provider", in.Name)
		}
		if _, dup := p.infras[in.Name]; dup {
			return nil, fmt.Errorf("provision: infra %q enabled twice", in.Name)
		}
		p.infras[in.Name] = in.Provider
	}
	return p, nil
}

// Plan returns the placements for r, best first, with blocked ones last: what a launch would
// try, in order, each saying whether a recent failure blocks it and why.
func (p *Provisioner) Plan(ctx context.Context, r configs.Resources) ([]Choice, error) {
	places, err := p.opts.Planner.Plan(ctx, r)
	if err != nil {
		return nil, err
	}
	now := p.opts.Now()
	p.blocks.mu.Lock()
	defer p.blocks.mu.Unlock()
	out := make([]Choice, 0, len(places))
	for _, pl := range places {
		if _, ok := p.infras[pl.Infra]; !ok {
			continue // planned for an infra that is not enabled here
		}
		c := Choice{Placement: pl}
		p.markBlockedLocked(&c, now)
		out = append(out, c)
	}
	// Unblocked first, each group in the planner's order.
	slices.SortStableFunc(out, func(a, b Choice) int { return cmp.Compare(blocked(a), blocked(b)) })
	return out, nil
}

// Choice is a placement and, if a recent failure blocks it, until when and why.
type Choice struct {
	launcher.Placement
	BlockedUntil   time.Time
	BlockedBecause string
}

// Launch tries the placements in order. A location error (capacity, quota, preemption, or any
// other failure) blocks that location and moves on; an infra that refuses Ferry's credentials
// is blocked whole; an infra that finds the request invalid (its own image or shape rules) is
// skipped for this launch. When every placement fails, the error lists each reason and wraps
// launcher.ErrNoCapacity, or launcher.ErrInvalid when every infra found the request invalid;
// the caller retries with backoff.
func (p *Provisioner) Launch(ctx context.Context, spec launcher.Spec) (launcher.Instance, error) {
	insts, err := p.launch(ctx, spec, 1, false)
	if err != nil {
		return launcher.Instance{}, err
	}
	return insts[0], nil
}

// LaunchGang launches n nodes in one location, all or none, failing over between locations
// as Launch does: a job's gang never spans infras.
func (p *Provisioner) LaunchGang(ctx context.Context, spec launcher.Spec, n int) ([]launcher.Instance, error) {
	return p.launch(ctx, spec, n, true)
}

var _ launcher.GangLauncher = (*Provisioner)(nil)

// launch places one instance (gang false) or an n-node gang, failing over between locations.
func (p *Provisioner) launch(ctx context.Context, spec launcher.Spec, n int, gang bool) ([]launcher.Instance, error) {
	choices, err := p.Plan(ctx, spec.Resources)
	if err != nil {
		return nil, err
	}
	if len(choices) == 0 {
		return nil, fmt.Errorf("%w: no enabled infra can run %s", launcher.ErrNoCapacity, spec.Resources)
	}
	var reasons []string
	allInvalid := true
	for remaining := choices; len(remaining) > 0; {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var c Choice
		var release func(id string, at time.Time)
		c, remaining, release = p.next(remaining, spec.Spread)
		s := spec
		s.Placement = c.Placement
		var insts []launcher.Instance
		prov := p.infras[c.Infra]
		if !gang {
			var inst launcher.Instance
			if inst, err = prov.Launch(ctx, s); err == nil {
				insts = []launcher.Instance{inst}
			}
		} else {
			insts, err = launcher.LaunchGang(ctx, prov, s, n)
		}
		placedID := ""
		if err == nil && len(insts) > 0 {
			placedID = insts[0].ID
		}
		release(placedID, p.opts.Now())
		if err == nil {
			for i := range insts {
				fillFromPlacement(&insts[i], c.Placement)
			}
			p.unblock(c.Placement)
			return insts, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		switch {
		case errors.Is(err, launcher.ErrQueued):
			// Held in the infra's queue, or for a reservation's window: the place is ours
			// once it comes, so neither block it nor try further (capacity.go).
			return nil, err
		case errors.Is(err, launcher.ErrInvalid):
			// Invalid for this infra (its image or shape rules: an AMI on Kubernetes, files
			// too big for a VM's boot script); another infra may take the same request. Not a block: the
			// next launch of the same task would fail here the same way, and says so.
			remaining = slices.DeleteFunc(remaining, func(o Choice) bool { return o.Infra == c.Infra })
		case errors.Is(err, launcher.ErrUnauthorized):
			// Credentials are per infra, not per location: skip all of it for a while.
			p.blockInfra(c.Infra, err)
			remaining = slices.DeleteFunc(remaining, func(o Choice) bool { return o.Infra == c.Infra })
			allInvalid = false
		default:
			p.block(c.Placement, err)
			allInvalid = false
		}
		p.log.Warn("launch failed; trying the next location", zap.String("instance", spec.Name),
			zap.String("location", describe(c.Placement)), zap.Error(err))
		reasons = append(reasons, describe(c.Placement)+": "+err.Error())
	}
	kind := launcher.ErrNoCapacity
	if allInvalid {
		kind = launcher.ErrInvalid // no infra can run it as written: retrying will not help
	}
	return nil, fmt.Errorf("%w: every location failed (%d): %s", kind, len(reasons), strings.Join(reasons, "; "))
}

// blockInfra skips every location of an infra (bad credentials) for the block time.
func (p *Provisioner) blockInfra(infra string, err error) {
	p.blocks.mu.Lock()
	defer p.blocks.mu.Unlock()
	p.blocks.m[infraBlockKey(infra)] = block{until: p.opts.Now().Add(p.opts.BlockFor), reason: err.Error()}
}

func infraBlockKey(infra string) string { return "infra|" + infra }

// next picks the choice to try now among remaining and returns the rest. It re-reads the
// blocks (a concurrent launch may just have found a zone full) and, for a spread launch,
// orders by the caller's spot instances plus the spread launches under way, and counts this
// one as under way in its zone until release.
func (p *Provisioner) next(remaining []Choice, spread map[string]string) (Choice, []Choice, func(id string, at time.Time)) {
	now := p.opts.Now()
	p.blocks.mu.Lock()
	defer p.blocks.mu.Unlock()
	for i := range remaining {
		p.markBlockedLocked(&remaining[i], now)
	}
	slices.SortStableFunc(remaining, func(a, b Choice) int { return cmp.Compare(blocked(a), blocked(b)) })
	if spread == nil {
		return remaining[0], remaining[1:], func(string, time.Time) {}
	}
	ordered := spreadOrder(remaining, p.spread.counts(spread, now))
	key := launcher.ZoneKey(ordered[0].Infra, ordered[0].Region, ordered[0].Zone)
	return ordered[0], ordered[1:], p.spread.reserve(key)
}

// counts is how many of the caller's spot instances each zone holds: the caller's own view,
// the instances placed since that it may not show yet, and the launches under way.
func (s *spreadState) counts(view map[string]string, now time.Time) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for _, key := range view {
		out[key]++
	}
	for id, pl := range s.placed {
		switch _, known := view[id]; {
		case known || now.Sub(pl.at) > placedTTL:
			delete(s.placed, id) // the caller counts it now, or it is long gone
		default:
			out[pl.key]++
		}
	}
	for key, n := range s.inflight {
		out[key] += n
	}
	return out
}

// reserve counts a launch under way in zone key until the returned release; release(id)
// with a launched instance's id keeps counting it as placed.
func (s *spreadState) reserve(key string) func(id string, at time.Time) {
	s.mu.Lock()
	s.inflight[key]++
	s.mu.Unlock()
	return func(id string, at time.Time) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.inflight[key]--; s.inflight[key] <= 0 {
			delete(s.inflight, key)
		}
		if id != "" {
			s.placed[id] = placed{key: key, at: at}
		}
	}
}

// forget stops counting an instance that was terminated.
func (s *spreadState) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.placed, id)
}

// markBlockedLocked sets whether c is blocked now, and why: its location failed, or (for spot)
// its zone had a preemption. Callers hold p.blocks.mu.
func (p *Provisioner) markBlockedLocked(c *Choice, now time.Time) {
	c.BlockedUntil, c.BlockedBecause = time.Time{}, ""
	keys := []string{locationKey(c.Placement), infraBlockKey(c.Infra)}
	if c.Spot {
		keys = append(keys, zoneBlockKey(c.Placement)) // a preempted zone is avoided for spot only
	}
	for _, key := range keys {
		if b, ok := p.blocks.m[key]; ok && now.Before(b.until) && b.until.After(c.BlockedUntil) {
			c.BlockedUntil, c.BlockedBecause = b.until, b.reason
		}
	}
}

// blocked is 1 for a blocked choice, 0 for one that may be tried: unblocked choices sort first.
func blocked(c Choice) int {
	if c.BlockedUntil.IsZero() {
		return 0
	}
	return 1
}

// spreadOrder reorders the spot choices as SpotHedge would try them (policy.SpotOrder):
// unblocked zones before blocked ones, then zones holding fewer of the caller's spot
// instances, then the planner's order (price). Other choices (a Kubernetes cluster, which the
// planner puts first even for spot) keep their places: spreading is among spot capacity only.
func spreadOrder(choices []Choice, counts map[string]int) []Choice {
	var slots []int
	var zones []policy.ZoneState
	for i, c := range choices {
		if !c.Spot {
			continue
		}
		key := launcher.ZoneKey(c.Infra, c.Region, c.Zone)
		slots = append(slots, i)
		zones = append(zones, policy.ZoneState{Name: key, SpotPrice: float64(i), Active: c.BlockedUntil.IsZero(), Spot: counts[key]})
	}
	out := slices.Clone(choices)
	for k, j := range policy.SpotOrder(zones) {
		out[slots[k]] = choices[slots[j]]
	}
	return out
}

// Preempted blocks the zone an instance was preempted in, for every shape: SpotHedge's
// "preempted zone", which the next spot launches avoid until the block ends.
func (p *Provisioner) Preempted(inst launcher.Instance) {
	pl := launcher.Placement{Infra: inst.Infra, Region: inst.Region, Zone: inst.Zone}
	p.blocks.mu.Lock()
	defer p.blocks.mu.Unlock()
	p.blocks.m[zoneBlockKey(pl)] = block{until: p.opts.Now().Add(p.opts.BlockFor), reason: "spot instance preempted here"}
}

// zoneBlockKey blocks a whole zone (after a preemption), as opposed to one shape in it.
func zoneBlockKey(pl launcher.Placement) string {
	return "zone|" + launcher.ZoneKey(pl.Infra, pl.Region, pl.Zone)
}

// Scope returns a Provisioner over the infras r could use, sharing this one's blocks: a
// service's replica manager lists only where its replicas may be, so an unreachable cluster
// does not stall a service that never runs there.
func (p *Provisioner) Scope(r configs.Resources) *Provisioner {
	scoped := &Provisioner{opts: p.opts, log: p.log, infras: map[string]launcher.Provider{}, blocks: p.blocks, spread: newSpreadState()}
	for name, prov := range p.infras {
		for _, c := range r.Candidates() {
			if InfraMatches(c.Infra, name) {
				scoped.infras[name] = prov
				break
			}
		}
	}
	return scoped
}

// InfraMatches reports whether an infra filter from a task ("", "*", "local", "kubernetes",
// "kubernetes/CTX", "aws", "aws/REGION[/ZONE]") admits the enabled infra name. "" (no infra
// written) is every infra; the optimizer plans local only for what the machine has. "*" is
// every infra but local: local replicas for a task that asks anywhere are chosen by name.
func InfraMatches(filter, name string) bool {
	switch filter {
	case "":
		return true
	case "*":
		return name != configs.InfraLocal
	case configs.InfraLocal:
		return name == configs.InfraLocal
	}
	if filter == name {
		return true
	}
	cloud, _, _ := strings.Cut(filter, "/")
	if cloud == "kubernetes" {
		return filter == "kubernetes" && strings.HasPrefix(name, "kubernetes/")
	}
	return cloud == name // aws/us-east-1 is served by the aws infra
}

// Terminate routes to the infra whose id prefix matches.
func (p *Provisioner) Terminate(ctx context.Context, id string) error {
	prov, err := p.owner(id)
	if err != nil {
		return err
	}
	p.spread.forget(id)
	return prov.Terminate(ctx, id)
}

// List merges every infra's instances. An infra that cannot answer fails the whole List: a
// partial answer would read as instances gone, and their replicas would be replaced.
func (p *Provisioner) List(ctx context.Context, selector map[string]string) ([]launcher.Instance, error) {
	var out []launcher.Instance
	for _, name := range slices.Sorted(maps.Keys(p.infras)) {
		insts, err := p.infras[name].List(ctx, selector)
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", name, err)
		}
		out = append(out, insts...)
	}
	return out, nil
}

// LogPath finds an instance's log where its infra keeps one locally.
func (p *Provisioner) LogPath(id string) (string, error) {
	prov, err := p.owner(id)
	if err != nil {
		return "", err
	}
	if ls, ok := prov.(launcher.LogSource); ok {
		return ls.LogPath(id)
	}
	if h, ok := prov.(launcher.LogHinter); ok {
		return "", fmt.Errorf("%w: %s keeps no local log for %s; read it with: %s", launcher.ErrNotFound, infraOf(id), id, h.LogHint(id))
	}
	return "", fmt.Errorf("%w: %s keeps no local log for %s", launcher.ErrNotFound, infraOf(id), id)
}

// StreamLogs reads an instance's output through its infra's API, for infras that keep it
// there (Kubernetes, clouds); infras with a local file answer through LogPath instead.
func (p *Provisioner) StreamLogs(ctx context.Context, id string, opts launcher.LogOptions, w io.Writer) error {
	prov, err := p.owner(id)
	if err != nil {
		return err
	}
	if ls, ok := prov.(launcher.LogStreamer); ok {
		return ls.StreamLogs(ctx, id, opts, w)
	}
	return fmt.Errorf("%w: %s cannot stream the output of %s", launcher.ErrNotFound, infraOf(id), id)
}

// CleanupJob asks every infra that keeps something of a job beyond its instances to release it.
func (p *Provisioner) CleanupJob(ctx context.Context, job string) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(p.infras)) {
		if c, ok := p.infras[name].(launcher.JobCleaner); ok {
			if err := c.CleanupJob(ctx, job); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Rank orders infras for scale-down: the position of the infra among the planner's choices
// for r (lower is preferred, kept longer); an infra the plan does not name ranks last.
func (p *Provisioner) Rank(ctx context.Context, r configs.Resources) (map[string]int, error) {
	places, err := p.opts.Planner.Plan(ctx, r)
	if err != nil {
		return nil, err
	}
	rank := map[string]int{}
	for _, pl := range places {
		if _, ok := rank[pl.Infra]; !ok {
			rank[pl.Infra] = len(rank)
		}
	}
	return rank, nil
}

// owner finds the provider of an instance id: ids start with their infra's name ("kubernetes/
// ctx/ns/pod", "aws/..."), except local ids ("local-...").
func (p *Provisioner) owner(id string) (launcher.Provider, error) {
	best := ""
	for name := range p.infras {
		local := name == configs.InfraLocal && strings.HasPrefix(id, name+"-")
		if (strings.HasPrefix(id, name+"/") || local) && len(name) > len(best) {
			best = name
		}
	}
	if best == "" {
		return nil, fmt.Errorf("%w: instance %q belongs to no enabled infra", launcher.ErrNotFound, id)
	}
	return p.infras[best], nil
}

func infraOf(id string) string {
	if i := strings.IndexAny(id, "/-"); i > 0 {
		return id[:i]
	}
	return id
}

func (p *Provisioner) block(pl launcher.Placement, err error) {
	p.blocks.mu.Lock()
	defer p.blocks.mu.Unlock()
	p.blocks.m[locationKey(pl)] = block{until: p.opts.Now().Add(p.opts.BlockFor), reason: err.Error()}
}

func (p *Provisioner) unblock(pl launcher.Placement) {
	p.blocks.mu.Lock()
	defer p.blocks.mu.Unlock()
	delete(p.blocks.m, locationKey(pl))
}

// locationKey identifies what a capacity error is about: one shape in one zone of one infra.
func locationKey(pl launcher.Placement) string {
	shape := pl.InstanceType
	if shape == "" {
		shape = pl.Accelerator
	}
	return strings.Join([]string{pl.Infra, pl.Region, pl.Zone, shape, fmt.Sprint(pl.Spot)}, "|")
}

func describe(pl launcher.Placement) string {
	parts := []string{pl.Infra}
	if pl.Zone != "" {
		parts = append(parts, pl.Zone)
	} else if pl.Region != "" {
		parts = append(parts, pl.Region)
	}
	if pl.InstanceType != "" {
		parts = append(parts, pl.InstanceType)
	} else if pl.Accelerator != "" {
		parts = append(parts, fmt.Sprintf("%gx %s", pl.AcceleratorCount, pl.Accelerator))
	}
	if pl.Spot {
		parts = append(parts, "spot")
	}
	return strings.Join(parts, " ")
}

// fillFromPlacement completes what a provider left out of the instance with the placement it
// launched at, so status shows price and zone whatever the provider reports.
func fillFromPlacement(inst *launcher.Instance, pl launcher.Placement) {
	if inst.Infra == "" {
		inst.Infra = pl.Infra
	}
	if inst.Region == "" {
		inst.Region = pl.Region
	}
	if inst.Zone == "" {
		inst.Zone = pl.Zone
	}
	if inst.PricePerHour == 0 {
		inst.PricePerHour = pl.PricePerHour
	}
	if inst.Accelerator == "" {
		inst.Accelerator = pl.Accelerator
	}
	inst.Spot = inst.Spot || pl.Spot
	if inst.WindowEnd.IsZero() {
		inst.WindowEnd = pl.WindowEnd
	}
}
