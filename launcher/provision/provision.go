// Package provision is the launcher a service or job talks to: one launcher.Provider over
// every enabled infra. Launch asks a Planner for placements (the optimizer: Kubernetes first,
// then clouds by price), tries them in order, and fails over: a capacity or quota error blocks
// that location for a while and the next placement is tried. List and Terminate reach the
// infras that could hold the caller's instances.
//
// One broken infra never stalls the others (docs/placement.md, "When an infra fails"): every
// call has a deadline and feeds the infra's circuit breaker (health.go); List asks the infras at
// once and reports one that fails or is slow as a launcher.Gap rather than failing whole; an
// infra that is down is skipped at once; what a Terminate could not reach is kept as a leftover
// that the janitor stops once its infra answers again (janitor.go).
package provision

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

// Deadlines of the calls the provisioner makes to an infra.
const (
	// DefaultListTimeout bounds one infra's List: a real cloud answers in well under a second.
	DefaultListTimeout = 10 * time.Second
	// DefaultStraggleFor is the least a List waits for an infra before reporting it as a gap
	// (its call goes on to its deadline): three times the infra's last answer, if longer.
	DefaultStraggleFor = 2 * time.Second
	// DefaultCallTimeout bounds a Terminate (some wait for the cloud's operation).
	DefaultCallTimeout = 2 * time.Minute
)

// Options configures a Provisioner.
type Options struct {
	Infras  []Infra
	Planner Planner
	// BlockFor is how long a failed location is skipped; default DefaultBlockFor.
	BlockFor time.Duration
	// ListTimeout, StraggleFor and CallTimeout are the calls' deadlines (the Default values
	// when zero).
	ListTimeout, StraggleFor, CallTimeout time.Duration
	// Health holds the infras' breakers; nil makes one with the default options.
	Health *Health
	// JanitorInterval is how often leftovers on infras that are up are retried (default 10s;
	// also whenever a breaker closes).
	JanitorInterval time.Duration
	// Now is the clock blocks use; nil is time.Now.
	Now    func() time.Time
	Logger *zap.Logger
}

// Provisioner fails over across infras. It is safe for concurrent use.
type Provisioner struct {
	opts   Options
	log    *zap.Logger
	infras map[string]launcher.Provider

	// blocks, health and the janitor are shared with scoped copies: a location full for one
	// service is full for all, an infra down for one is down for all.
	blocks  *blockSet
	health  *Health
	janitor *janitor
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
	launcher.SetDefault(&opts.BlockFor, DefaultBlockFor)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	opts.ListTimeout = cmp.Or(opts.ListTimeout, DefaultListTimeout)
	opts.StraggleFor = cmp.Or(opts.StraggleFor, DefaultStraggleFor)
	opts.CallTimeout = cmp.Or(opts.CallTimeout, DefaultCallTimeout)
	opts.JanitorInterval = cmp.Or(opts.JanitorInterval, defaultJanitorInterval)
	if opts.Health == nil {
		opts.Health = NewHealth(HealthOptions{Now: opts.Now})
	}
	p := &Provisioner{opts: opts, log: opts.Logger, infras: map[string]launcher.Provider{}, blocks: &blockSet{m: map[string]block{}},
		health: opts.Health, spread: newSpreadState()}
	p.janitor = newJanitor(p)
	for _, in := range opts.Infras {
		if in.Name == "" || in.Provider == nil {
			return nil, fmt.Errorf("provision: infra %q has no name or provider", in.Name)
		}
		if _, dup := p.infras[in.Name]; dup {
			return nil, fmt.Errorf("provision: infra %q enabled twice", in.Name)
		}
		p.infras[in.Name] = in.Provider
		p.health.Register(in.Name)
	}
	return p, nil
}

// Health is the infras' breakers, shared by every scoped copy.
func (p *Provisioner) Health() *Health { return p.health }

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
	if spec.SpreadFrom != "" {
		if choices = p.spreadTargets(choices, spec); len(choices) == 0 {
			return nil, fmt.Errorf("%w: no spot zone to move a replica to from %s (each holds as many, or is blocked)", launcher.ErrNoCapacity, spec.SpreadFrom)
		}
	}
	var reasons []string
	allInvalid, allRefused := true, true // allRefused: every failure a capacity or quota refusal
	for remaining := choices; len(remaining) > 0; {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var c Choice
		var release func(id string, at time.Time)
		c, remaining, release = p.next(remaining, spec.Spread)
		if down := p.health.Allow(c.Infra, c.Region, c.Zone); down != nil {
			// Down or throttled: not tried, and neither is the rest of it while it is.
			release("", p.opts.Now())
			remaining = slices.DeleteFunc(remaining, func(o Choice) bool { return p.health.Allow(o.Infra, o.Region, o.Zone) != nil })
			allInvalid, allRefused = false, false
			reasons = append(reasons, describe(c.Placement)+": "+down.Error())
			continue
		}
		insts, err := p.try(ctx, c, spec, n, gang, release)
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
		allRefused = allRefused && (errors.Is(err, launcher.ErrNoCapacity) || errors.Is(err, launcher.ErrQuota))
		switch {
		case errors.Is(err, launcher.ErrQueued):
			// Held in the infra's queue, or for a reservation's window: the place is ours
			// once it comes, so neither block it nor try further. The caller tries again
			// later with the same spec, which the infra recognises.
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
		case launcher.IsInfraFault(err) || errors.Is(err, context.DeadlineExceeded):
			// The infra failed, not the location: skip the rest of it for this launch; its
			// breaker decides when it is tried again (health.go).
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
	return nil, launchFailed(reasons, allInvalid, allRefused)
}

// launchFailed is the error of a launch every location failed, for the reasons given: invalid
// when every infra found the request invalid, else no capacity, marked refused when every
// location refused for capacity or quota (launcher.ErrCapacityRefused).
func launchFailed(reasons []string, allInvalid, allRefused bool) error {
	kind := launcher.ErrNoCapacity
	if allInvalid {
		kind = launcher.ErrInvalid // no infra can run it as written: retrying will not help
	}
	err := fmt.Errorf("%w: every location failed (%d): %s", kind, len(reasons), strings.Join(reasons, "; "))
	if allRefused && len(reasons) > 0 {
		return launcher.CapacityRefused(err)
	}
	return err
}

// try launches spec at choice c, one instance or (gang) n of them, and records the outcome:
// with the infra's breaker, and through release with the spread (the first instance's id).
func (p *Provisioner) try(ctx context.Context, c Choice, spec launcher.Spec, n int, gang bool, release func(id string, at time.Time)) ([]launcher.Instance, error) {
	s := placedSpec(spec, c.Placement)
	var insts []launcher.Instance
	var err error
	prov := p.infras[c.Infra]
	if !gang {
		var inst launcher.Instance
		if inst, err = prov.Launch(ctx, s); err == nil {
			insts = []launcher.Instance{inst}
		}
	} else {
		if c.Nodes > 0 {
			n = c.Nodes // this alternative's own gang shape
		}
		insts, err = launcher.LaunchGang(ctx, prov, s, n)
	}
	p.observeCall(c.Infra, launchPart(c, err), err)
	placedID := ""
	if err == nil && len(insts) > 0 {
		placedID = insts[0].ID
	}
	release(placedID, p.opts.Now())
	return insts, err
}

// launchPart is the breaker a launch's outcome counts for: its zone (or region) — a launch
// that fails tells of the place it went to, and a whole infra that fails shows in its listing
// — except refused credentials and throttling, which are the account's, on the whole infra.
func launchPart(c Choice, err error) string {
	if errors.Is(err, launcher.ErrUnauthorized) || errors.Is(err, launcher.ErrThrottled) {
		return ""
	}
	return cmp.Or(c.Zone, c.Region)
}

// observeCall records the outcome of a call about one instance or place (a launch, a
// terminate, a cleanup) in the breaker of part (its zone or region; "" for the whole infra):
// an answer about the request or the place closes it, the infra failing (unavailable,
// throttled, unauthorized, our own deadline) counts against it, and anything else (a program
// that ended while starting, a provider's own whole-operation timeout) says nothing of the
// infra's health.
func (p *Provisioner) observeCall(infra, part string, err error) {
	switch {
	case launcher.IsInfraFault(err):
		p.health.Observe(infra, part, err)
	case errors.Is(err, launcher.ErrNotFound) && part != "":
		p.health.Observe(infra, part, err) // a zone that does not exist
	case err == nil, errors.Is(err, launcher.ErrNoCapacity), errors.Is(err, launcher.ErrQuota), errors.Is(err, launcher.ErrInvalid),
		errors.Is(err, launcher.ErrQueued), errors.Is(err, launcher.ErrPreempted), errors.Is(err, launcher.ErrNotFound):
		p.health.Observe(infra, part, nil)
	}
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
	var down *DownError
	if err := p.health.Allow(c.Infra, c.Region, c.Zone); errors.As(err, &down) {
		until := down.State.RetryAt
		if until.Before(now) {
			until = now.Add(time.Second) // a probe is due: about now
		}
		if until.After(c.BlockedUntil) {
			c.BlockedUntil = until
		}
		c.BlockedBecause = err.Error()
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

// MovesSpot says the provisioner takes spread moves (launcher.Spec.SpreadFrom): the replica
// manager's SpreadMover.
func (p *Provisioner) MovesSpot() bool { return true }

// spreadTargets keeps the choices a spread move may take (launcher.Spec.SpreadFrom): spot ones
// in zones that are not blocked and hold at least two fewer of the caller's spot instances
// than the zone it moves out of (policy.SpreadTargets' rule).
func (p *Provisioner) spreadTargets(choices []Choice, spec launcher.Spec) []Choice {
	now := p.opts.Now()
	counts := p.spread.counts(spec.Spread, now)
	from := policy.ZoneState{Name: spec.SpreadFrom, Spot: counts[spec.SpreadFrom]}
	p.blocks.mu.Lock()
	defer p.blocks.mu.Unlock()
	var out []Choice
	for _, c := range choices {
		p.markBlockedLocked(&c, now)
		key := launcher.ZoneKey(c.Infra, c.Region, c.Zone)
		to := policy.ZoneState{Name: key, Active: c.BlockedUntil.IsZero(), Spot: counts[key]}
		if c.Spot && key != spec.SpreadFrom && policy.TakesMove(from, to) {
			out = append(out, c)
		}
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
	scoped := &Provisioner{opts: p.opts, log: p.log, infras: map[string]launcher.Provider{}, blocks: p.blocks, health: p.health,
		janitor: p.janitor, spread: newSpreadState()}
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

// Terminate routes to the infra whose id prefix matches, within CallTimeout. An infra that is
// down, or fails the call as an infra (unavailable, throttled, no answer in time), leaves the
// instance to the janitor: the error is a *launcher.LeftBehindError, and the instance is
// stopped once the infra answers again.
func (p *Provisioner) Terminate(ctx context.Context, id string) error {
	name, err := p.ownerName(id)
	if err != nil {
		return err
	}
	p.spread.forget(id)
	region, zone := p.locate(name, id)
	if down := p.health.Allow(name, region, zone); down != nil {
		return p.leave(launcher.Leftover{Infra: name, InstanceID: id}, down)
	}
	err = p.call(ctx, p.opts.CallTimeout, func(ctx context.Context) error { return p.infras[name].Terminate(ctx, id) })
	p.observeCall(name, cmp.Or(zone, region), err)
	switch {
	case err == nil:
		p.janitor.forget(id) // stopped by its owner after all
	case launcher.IsInfraFault(err):
		return p.leave(launcher.Leftover{Infra: name, InstanceID: id}, err)
	}
	return err
}

// call runs fn within timeout; a call its own deadline cut (not its caller's) is the infra's
// timeout (timedOut). The caller records the outcome where it belongs (observeCall).
func (p *Provisioner) call(ctx context.Context, timeout time.Duration, fn func(context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return timedOut(ctx, cctx, timeout, fn(cctx))
}

// timedOut marks err as the infra's timeout (ErrUnavailable with context.DeadlineExceeded)
// when the call's own deadline ended it while its caller still waited. A caller's deadline
// or cancel that ended it is left as it is: not the infra's fault, and not recorded.
func timedOut(parent, call context.Context, timeout time.Duration, err error) error {
	if err == nil || parent.Err() != nil || !errors.Is(call.Err(), context.DeadlineExceeded) || errors.Is(err, launcher.ErrUnavailable) {
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: no answer within %v: %w", launcher.ErrUnavailable, timeout, err)
	}
	return fmt.Errorf("%w: no answer within %v: %w (%w)", launcher.ErrUnavailable, timeout, err, context.DeadlineExceeded)
}

// placedSpec is spec at placement pl, with SkyPilot's SKYPILOT_CLUSTER_INFO for it unless the
// task set its own (spec's Envs are not changed: they are shared across tries).
func placedSpec(spec launcher.Spec, pl launcher.Placement) launcher.Spec {
	s := spec
	s.Placement = pl
	_, infoSet := spec.Envs[launcher.EnvClusterInfo]
	_, gpusSet := spec.Envs[launcher.EnvNumGPUsPerNode]
	if infoSet && !(gpusSet && pl.AcceleratorCount > 0) {
		return s
	}
	s.Envs = maps.Clone(spec.Envs)
	if s.Envs == nil {
		s.Envs = map[string]string{}
	}
	if !infoSet {
		s.Envs[launcher.EnvClusterInfo] = launcher.ClusterInfo(s, pl)
	}
	if gpusSet && pl.AcceleratorCount > 0 {
		// The placement's own count: alternatives may differ (8 × 1 GPU against 1 × 8), and
		// the job's spec says only the largest. SkyPilot rounds a fraction up.
		s.Envs[launcher.EnvNumGPUsPerNode] = strconv.Itoa(int(math.Ceil(pl.AcceleratorCount)))
	}
	return s
}

// List merges every infra's instances (listing.go).
func (p *Provisioner) List(ctx context.Context, selector map[string]string) ([]launcher.Instance, error) {
	return p.ListIn(ctx, slices.Sorted(maps.Keys(p.infras)), selector)
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

// ownerName finds the infra of an instance id: ids start with their infra's name
// ("kubernetes/ctx/ns/pod", "aws/..."), except local ids ("local-...").
func (p *Provisioner) ownerName(id string) (string, error) {
	best := ""
	for name := range p.infras {
		local := name == configs.InfraLocal && strings.HasPrefix(id, name+"-")
		if (strings.HasPrefix(id, name+"/") || local) && len(name) > len(best) {
			best = name
		}
	}
	if best == "" {
		return "", fmt.Errorf("%w: instance %q belongs to no enabled infra", launcher.ErrNotFound, id)
	}
	return best, nil
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
