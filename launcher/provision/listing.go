package provision

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ferryserve/ferry/launcher"
)

// Listing across infras. A List asks every infra at once, each within ListTimeout. What one
// infra cannot answer — an error, its breaker open, or no answer within its straggle wait — is
// a launcher.Gap in a *launcher.PartialListError returned with what the others listed, so that
// a caller treats that infra's instances as unknown: never as gone, and never as a reason to
// wait for everyone. A straggling call goes on in the background to its deadline, and its
// outcome still feeds the breaker: a hung endpoint is found out once, by one call, and then
// skipped by everybody until a probe finds it answering (health.go).

// ListIn is List over the named infras only: a job lists where its nodes run. A name not
// enabled here is a gap.
func (p *Provisioner) ListIn(ctx context.Context, infras []string, selector map[string]string) ([]launcher.Instance, error) {
	start := time.Now()
	answers := make([]chan answer, len(infras))
	for i, name := range infras {
		ch := make(chan answer, 1)
		answers[i] = ch
		prov, ok := p.infras[name]
		switch {
		case !ok:
			// Not enabled now (its setup failed, say): what it holds is unknown, not gone.
			ch <- answer{gaps: []launcher.Gap{{Infra: name, Err: fmt.Errorf("%w: %s is not enabled here", launcher.ErrUnavailable, name)}}}
			continue
		case p.health.Allow(name) != nil:
			ch <- answer{gaps: []launcher.Gap{{Infra: name, Err: p.health.Allow(name)}}}
			continue
		}
		go func() {
			insts, gaps := p.listOne(ctx, name, prov, selector, true)
			ch <- answer{insts, gaps}
		}()
	}
	var out []launcher.Instance
	var gaps []launcher.Gap
	for i, name := range infras {
		a, ok, err := awaitAnswer(ctx, answers[i], start.Add(p.health.listWait(name, p.opts.StraggleFor, p.opts.ListTimeout)))
		switch {
		case err != nil:
			return nil, err
		case !ok:
			gaps = append(gaps, launcher.Gap{Infra: name, Err: fmt.Errorf("%w: %s did not answer within %v (still waiting)",
				launcher.ErrUnavailable, name, time.Since(start).Round(time.Millisecond))})
		default:
			out = append(out, a.insts...)
			gaps = append(gaps, a.gaps...)
		}
	}
	return out, launcher.PartialList(gaps)
}

// answer is one infra's part of a List.
type answer struct {
	insts []launcher.Instance
	gaps  []launcher.Gap
}

// awaitAnswer waits for ch until deadline: the answer and true, or false once the deadline
// passed without one (an answer already there wins over a deadline already past), or ctx's
// error.
func awaitAnswer(ctx context.Context, ch <-chan answer, deadline time.Time) (answer, bool, error) {
	select {
	case a := <-ch:
		return a, true, nil
	default:
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case a := <-ch:
		return a, true, nil
	case <-timer.C:
		return answer{}, false, nil
	case <-ctx.Done():
		return answer{}, false, ctx.Err()
	}
}

// listOne lists one infra within ListTimeout, outliving the caller's wait (not its values) so
// that a hung infra's timeout is always recorded, and records the outcome: the infra answered
// or not, and for each zone or region it reports, whether that part could be read. With skip,
// the parts whose breakers are open are reported as gaps without being asked
// (launcher.WithSkip); a probe asks every part. A provider that panics is a gap.
func (p *Provisioner) listOne(ctx context.Context, name string, prov launcher.Provider, selector map[string]string, skip bool) (insts []launcher.Instance, gaps []launcher.Gap) {
	parent := context.WithoutCancel(ctx)
	if skip {
		parent = launcher.WithSkip(parent, func(region, zone string) error { return p.health.Allow(name, region, zone) })
	}
	cctx, cancel := context.WithTimeout(parent, p.opts.ListTimeout)
	defer cancel()
	began := time.Now()
	insts, err := safeList(cctx, prov, selector)
	err = timedOut(parent, cctx, p.opts.ListTimeout, err)
	gaps, partial := launcher.Partial(err)
	if !partial {
		p.health.Observe(name, "", err)
		return nil, []launcher.Gap{{Infra: name, Err: err}}
	}
	p.health.observeList(name, gaps)
	if len(gaps) == 0 {
		p.health.listed(name, time.Since(began))
	}
	for i := range gaps {
		gaps[i].Infra = name // a provider's gap is always its own
	}
	return insts, gaps
}

// observeList records a List of infra that answered, save for gaps: the infra is up, each
// gap's zone (or region) failed, every other zone known to the breakers answered.
func (h *Health) observeList(infra string, gaps []launcher.Gap) {
	whole := slices.IndexFunc(gaps, func(g launcher.Gap) bool { return g.Zone == "" && g.Region == "" })
	if whole >= 0 {
		h.Observe(infra, "", gaps[whole].Err)
		return
	}
	h.Observe(infra, "", nil)
	failed := map[string]bool{}
	for _, g := range gaps {
		part := g.Zone
		if part == "" {
			part = g.Region
		}
		failed[part] = true
		h.Observe(infra, part, g.Err)
	}
	for _, s := range h.States() {
		if s.Infra == infra && s.Zone != "" && !failed[s.Zone] && s.State != StateUp {
			h.Observe(infra, s.Zone, nil)
		}
	}
}

// safeList is prov.List with a panic turned into an error: a provider's bug must not take the
// controller down from a goroutine no caller recovers.
func safeList(ctx context.Context, prov launcher.Provider, selector map[string]string) (insts []launcher.Instance, err error) {
	defer func() {
		if r := recover(); r != nil {
			insts, err = nil, fmt.Errorf("list panicked: %v", r)
		}
	}()
	return prov.List(ctx, selector)
}
