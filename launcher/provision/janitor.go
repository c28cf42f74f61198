package provision

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
)

// The janitor finishes the cleanups an infra's failure interrupted. What a Terminate could not
// reach, and what a teardown could not even list (every instance of a service or job on an
// infra that did not answer, launched before the teardown), is a launcher.Leftover, written to
// the ledger (the controller's store) before the caller is told. Run retries the leftovers of
// infras that are up every JanitorInterval and whenever a breaker closes, and forgets each once
// it is gone; a restarted controller reads them back and goes on.

// defaultJanitorInterval is how often leftovers are retried when nothing wakes the janitor.
const defaultJanitorInterval = 10 * time.Second

type janitor struct {
	p *Provisioner

	mu    sync.Mutex
	items map[string]*pending
	// ledger is nil until Run opens it.
	ledger launcher.Ledger
}

// pending is one leftover and what the janitor knows of its tries.
type pending struct {
	launcher.Leftover
	// stored is set once the ledger holds it; an item not stored is written again at the
	// next sweep (a store that failed once must not lose it).
	stored bool
	// tries and next pace the retries of this leftover alone: a zone that keeps failing is
	// not asked at every sweep, and a breaker that closes does not bring every leftover back
	// at once.
	tries int
	next  time.Time
}

func newJanitor(p *Provisioner) *janitor {
	return &janitor{p: p, items: map[string]*pending{}}
}

var _ launcher.LeftoverKeeper = (*Provisioner)(nil)

// LeaveBehind records l, in the ledger too once Run has one (Key and Since are filled when
// empty). A leftover already known under the same key keeps its tries.
func (p *Provisioner) LeaveBehind(l launcher.Leftover) error {
	_, err := p.leaveBehind(l)
	return err
}

// leaveBehind is LeaveBehind returning the leftover as recorded.
func (p *Provisioner) leaveBehind(l launcher.Leftover) (launcher.Leftover, error) {
	if l.Since.IsZero() {
		l.Since = p.opts.Now()
	}
	if l.Key == "" {
		l.Key = launcher.LeftoverKey(l)
	}
	j := p.janitor
	j.mu.Lock()
	it := j.items[l.Key]
	if it == nil {
		it = &pending{}
		j.items[l.Key] = it
	} else if l.Owner == "" {
		l.Owner = it.Owner // a terminate's own record knows no owner; the caller's did
	}
	it.Leftover, it.stored = l, false
	ledger := j.ledger
	j.mu.Unlock()
	p.log.Warn("left behind on an infra that did not answer; Ferry stops it when the infra answers again",
		zap.String("infra", l.Infra), zap.String("what", l.Describe()), zap.String("owner", l.Owner), zap.String("reason", l.Reason))
	if ledger == nil {
		return l, nil
	}
	if err := ledger.PutLeftover(l); err != nil {
		return l, fmt.Errorf("record what is left on %s (kept in memory, written again at the next sweep): %w", l.Infra, err)
	}
	j.setStored(l.Key, l)
	return l, nil
}

// setStored marks key stored, if it still holds l.
func (j *janitor) setStored(key string, l launcher.Leftover) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if it := j.items[key]; it != nil && it.Since.Equal(l.Since) && it.Reason == l.Reason {
		it.stored = true
	}
}

// Leftovers are what is still to stop, oldest first.
func (p *Provisioner) Leftovers() []launcher.Leftover {
	j := p.janitor
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make([]launcher.Leftover, 0, len(j.items))
	for _, it := range j.items {
		out = append(out, it.Leftover)
	}
	slices.SortFunc(out, func(a, b launcher.Leftover) int { return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.Key, b.Key)) })
	return out
}

// leave makes l a leftover and returns the error that says so, with the leftover as recorded.
// Even when the ledger could not take it, it is kept (and written again later): the caller
// may go on as if it were left behind.
func (p *Provisioner) leave(l launcher.Leftover, err error) error {
	l.Reason = err.Error()
	l, perr := p.leaveBehind(l)
	if perr != nil {
		p.log.Error("leftover not written to the store yet", zap.String("what", l.Describe()), zap.Error(perr))
	}
	return &launcher.LeftBehindError{Leftover: l, Err: err}
}

// forget drops a leftover that is gone.
func (j *janitor) forget(key string) {
	j.mu.Lock()
	_, ok := j.items[key]
	delete(j.items, key)
	ledger := j.ledger
	j.mu.Unlock()
	if ok && ledger != nil {
		if err := ledger.DeleteLeftover(key); err != nil {
			j.p.log.Warn("forget a leftover", zap.String("key", key), zap.Error(err))
		}
	}
}

// Run probes the infras whose breakers are open and stops leftovers, until ctx ends. With a
// ledger it reads the leftovers an earlier controller kept (retrying while the store fails:
// the probes run meanwhile), and writes those this one made.
func (p *Provisioner) Run(ctx context.Context, ledger launcher.Ledger) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { p.probeLoop(ctx) })
	for wait := time.Second; ; wait = min(2*wait, time.Minute) {
		err := p.janitor.open(ledger)
		if err == nil {
			break
		}
		p.log.Error("read leftovers from the store; will retry", zap.Error(err))
		if sleepCtx(ctx, wait) != nil {
			return nil
		}
	}
	tick := time.NewTicker(p.opts.JanitorInterval)
	defer tick.Stop()
	for {
		p.sweep(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-p.health.Recovered():
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// open joins the ledger's leftovers and this process's; those of this process go to the
// ledger at the next sweep.
func (j *janitor) open(ledger launcher.Ledger) error {
	if ledger == nil {
		return nil
	}
	stored, err := ledger.ListLeftovers()
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.ledger = ledger
	for _, l := range stored {
		if _, mine := j.items[l.Key]; !mine {
			j.items[l.Key] = &pending{Leftover: l, stored: true}
		}
	}
	return nil
}

// sweep writes what the ledger lacks, then tries every leftover that is due and whose infra
// (and part of it) is up.
func (p *Provisioner) sweep(ctx context.Context) {
	p.janitor.store()
	now := p.opts.Now()
	for _, l := range p.Leftovers() {
		if ctx.Err() != nil {
			return
		}
		region, zone := p.locate(l.Infra, l.InstanceID)
		if _, enabled := p.infras[l.Infra]; !enabled || p.health.Allow(l.Infra, region, zone) != nil || !p.janitor.due(l.Key, now) {
			continue
		}
		if err := p.clean(ctx, l, cmp.Or(zone, region)); err != nil {
			p.janitor.failed(l.Key, now)
			p.log.Info("leftover not stopped yet", zap.String("infra", l.Infra), zap.String("what", l.Describe()), zap.Error(err))
			continue
		}
		p.log.Info("leftover stopped", zap.String("infra", l.Infra), zap.String("what", l.Describe()), zap.String("owner", l.Owner),
			zap.Duration("after", p.opts.Now().Sub(l.Since).Round(time.Second)))
		p.janitor.forget(l.Key)
	}
}

// store writes the leftovers the ledger does not hold yet.
func (j *janitor) store() {
	j.mu.Lock()
	ledger := j.ledger
	var todo []launcher.Leftover
	for _, it := range j.items {
		if !it.stored {
			todo = append(todo, it.Leftover)
		}
	}
	j.mu.Unlock()
	if ledger == nil {
		return
	}
	for _, l := range todo {
		if err := ledger.PutLeftover(l); err != nil {
			j.p.log.Error("leftover not written to the store yet", zap.String("what", l.Describe()), zap.Error(err))
			continue
		}
		j.setStored(l.Key, l)
	}
}

// due reports whether key's next try has come.
func (j *janitor) due(key string, now time.Time) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	it := j.items[key]
	return it != nil && !now.Before(it.next)
}

// failed paces key's next try: 2 s doubling to a minute, with jitter.
func (j *janitor) failed(key string, now time.Time) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if it := j.items[key]; it != nil {
		it.tries++
		it.next = now.Add(j.p.health.jitter(min(time.Second<<min(it.tries, 6), time.Minute)))
	}
}

// clean stops one leftover: its instance, or every instance its selector finds that was
// launched before its cut-off. part is the breaker its outcome counts for.
func (p *Provisioner) clean(ctx context.Context, l launcher.Leftover, part string) error {
	prov := p.infras[l.Infra]
	terminate := func(id string) error {
		err := p.call(ctx, p.opts.CallTimeout, func(ctx context.Context) error { return prov.Terminate(ctx, id) })
		p.observeCall(l.Infra, part, err)
		return err
	}
	if l.InstanceID != "" {
		return terminate(l.InstanceID)
	}
	insts, err := p.ListIn(ctx, []string{l.Infra}, l.Selector)
	gaps, partial := launcher.Partial(err)
	if !partial {
		return err
	}
	var errs []error
	for _, g := range gaps {
		if !errors.Is(g.Err, launcher.ErrNotFound) { // a zone that does not exist holds nothing
			errs = append(errs, errors.New(g.String()))
		}
	}
	for _, in := range insts {
		if !l.Before.IsZero() && !in.LaunchedAt.IsZero() && !in.LaunchedAt.Before(l.Before) {
			continue // something new under the same labels
		}
		errs = append(errs, terminate(in.ID))
	}
	return errors.Join(errs...)
}

// probeLoop asks each infra whose breaker (or a zone's or region's) is open and whose
// cooldown has passed whether it answers again: a List that matches nothing, asking every part
// (none skipped), which also reads every zone it has.
func (p *Provisioner) probeLoop(ctx context.Context) {
	t := time.NewTicker(probeTick)
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, name := range p.health.dueProbes(p.opts.Now()) {
			prov, ok := p.infras[name]
			if !ok {
				p.health.probed(name)
				continue
			}
			wg.Go(func() {
				defer p.health.probed(name)
				p.listOne(ctx, name, prov, probeSelector, false)
			})
		}
	}
}

// probeTick is how often due probes are looked for.
const probeTick = 250 * time.Millisecond

// probeSelector matches no instance: a probe only asks whether the infra answers.
var probeSelector = map[string]string{launcher.LabelOwner: "true", "ferry.health-probe": "none"}
