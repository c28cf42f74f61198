package provision

import (
	"cmp"
	"context"
	"errors"
	"maps"
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

	mu     sync.Mutex
	items  map[string]launcher.Leftover
	ledger launcher.Ledger // nil until Run
}

func newJanitor(p *Provisioner) *janitor {
	return &janitor{p: p, items: map[string]launcher.Leftover{}}
}

var _ launcher.LeftoverKeeper = (*Provisioner)(nil)

// LeaveBehind records l, in the ledger too once Run has one.
func (p *Provisioner) LeaveBehind(l launcher.Leftover) error {
	if l.Since.IsZero() {
		l.Since = p.opts.Now()
	}
	if l.Key == "" {
		l.Key = launcher.LeftoverKey(l)
	}
	j := p.janitor
	j.mu.Lock()
	j.items[l.Key] = l
	ledger := j.ledger
	j.mu.Unlock()
	p.log.Warn("left behind on an infra that did not answer; Ferry stops it when the infra answers again",
		zap.String("infra", l.Infra), zap.String("what", l.Describe()), zap.String("owner", l.Owner), zap.String("reason", l.Reason))
	if ledger != nil {
		return ledger.PutLeftover(l)
	}
	return nil
}

// Leftovers are what is still to stop, oldest first.
func (p *Provisioner) Leftovers() []launcher.Leftover {
	j := p.janitor
	j.mu.Lock()
	defer j.mu.Unlock()
	out := slices.Collect(maps.Values(j.items))
	slices.SortFunc(out, func(a, b launcher.Leftover) int { return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.Key, b.Key)) })
	return out
}

// leave makes l a leftover and returns the error that says so.
func (p *Provisioner) leave(l launcher.Leftover, err error) error {
	l.Reason = err.Error()
	if perr := p.LeaveBehind(l); perr != nil {
		return errors.Join(&launcher.LeftBehindError{Leftover: l, Err: err}, perr)
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
// ledger it first reads the leftovers an earlier controller kept, and writes those this one
// made before Run.
func (p *Provisioner) Run(ctx context.Context, ledger launcher.Ledger) error {
	if err := p.janitor.open(ledger); err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { p.probeLoop(ctx) })
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

// open joins the ledger's leftovers and this process's.
func (j *janitor) open(ledger launcher.Ledger) error {
	if ledger == nil {
		return nil
	}
	stored, err := ledger.ListLeftovers()
	if err != nil {
		return err
	}
	j.mu.Lock()
	j.ledger = ledger
	mine := slices.Collect(maps.Values(j.items))
	for _, l := range stored {
		j.items[l.Key] = l
	}
	j.mu.Unlock()
	for _, l := range mine {
		if err := ledger.PutLeftover(l); err != nil {
			return err
		}
	}
	return nil
}

// sweep tries every leftover whose infra is up.
func (p *Provisioner) sweep(ctx context.Context) {
	for _, l := range p.Leftovers() {
		if ctx.Err() != nil {
			return
		}
		if _, enabled := p.infras[l.Infra]; !enabled || p.health.Allow(l.Infra, "") != nil {
			continue
		}
		if err := p.clean(ctx, l); err != nil {
			p.log.Info("leftover not stopped yet", zap.String("infra", l.Infra), zap.String("what", l.Describe()), zap.Error(err))
			continue
		}
		p.log.Info("leftover stopped", zap.String("infra", l.Infra), zap.String("what", l.Describe()), zap.String("owner", l.Owner),
			zap.Duration("after", p.opts.Now().Sub(l.Since).Round(time.Second)))
		p.janitor.forget(l.Key)
	}
}

// clean stops one leftover: its instance, or every instance its selector finds that was
// launched before its cut-off.
func (p *Provisioner) clean(ctx context.Context, l launcher.Leftover) error {
	prov := p.infras[l.Infra]
	if l.InstanceID != "" {
		return p.call(ctx, l.Infra, p.opts.CallTimeout, func(ctx context.Context) error { return prov.Terminate(ctx, l.InstanceID) })
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
		errs = append(errs, p.call(ctx, l.Infra, p.opts.CallTimeout, func(ctx context.Context) error { return prov.Terminate(ctx, in.ID) }))
	}
	return errors.Join(errs...)
}

// probeLoop asks each infra whose breaker is open and whose cooldown has passed whether it
// answers again: a List that matches nothing, which also reads every zone it has.
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
				p.listOne(ctx, name, prov, probeSelector)
			})
		}
	}
}

// probeTick is how often due probes are looked for.
const probeTick = 250 * time.Millisecond

// probeSelector matches no instance: a probe only asks whether the infra answers.
var probeSelector = map[string]string{launcher.LabelOwner: "true", "ferry.health-probe": "none"}
