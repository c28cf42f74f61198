package provision

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/ferryserve/ferry/launcher"
)

// A launch that an infra holds in its queue or for a reservation's window returns
// launcher.ErrQueued from Launch and LaunchGang at once: the remaining placements are not
// tried (the queued one was ranked before them, or they failed already), and the location is
// not blocked. The caller tries again later with the same spec, which the infra recognises.

var _ launcher.QueueWithdrawer = (*Provisioner)(nil)

// WithdrawQueued asks every infra that holds queued requests to drop job's requests that no
// running node of attempt uses.
func (p *Provisioner) WithdrawQueued(ctx context.Context, job string, attempt int) error {
	return fanOut(ctx, p, func(ctx context.Context, w launcher.QueueWithdrawer) error {
		return w.WithdrawQueued(ctx, job, attempt)
	})
}

// fanOut calls fn on every infra whose provider has the optional capability T, in name order,
// each within CallTimeout and charged to its infra's breaker; an infra that is down is not
// asked, and says so in the joined error.
func fanOut[T any](ctx context.Context, p *Provisioner, fn func(context.Context, T) error) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(p.infras)) {
		c, ok := p.infras[name].(T)
		if !ok {
			continue
		}
		err := p.health.Allow(name)
		if err == nil {
			err = p.call(ctx, p.opts.CallTimeout, func(ctx context.Context) error { return fn(ctx, c) })
			p.observeCall(name, "", err)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
