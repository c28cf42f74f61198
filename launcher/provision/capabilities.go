package provision

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/ferryserve/ferry/launcher"
)

// The Provisioner is one launcher.Provider over every infra, so it offers each optional
// capability its callers look for and hands the call to the infras whose providers have it:
// the one that owns the instance (Locate, LogPath, StreamLogs), or every one (CleanupJob,
// WithdrawQueued: fanOut). capability is the one place a provider is asked for one.
var (
	_ launcher.Locator         = (*Provisioner)(nil)
	_ launcher.LogSource       = (*Provisioner)(nil)
	_ launcher.LogStreamer     = (*Provisioner)(nil)
	_ launcher.JobCleaner      = (*Provisioner)(nil)
	_ launcher.QueueWithdrawer = (*Provisioner)(nil)
)

// capability is infra's provider as the optional capability T; ok is false when it lacks T
// (or infra is not enabled here).
func capability[T any](p *Provisioner, infra string) (c T, ok bool) {
	c, ok = p.infras[infra].(T)
	return c, ok
}

// Locate is where an instance lies, as far as its infra's provider can tell from the id.
func (p *Provisioner) Locate(id string) (region, zone string) {
	name, err := p.ownerName(id)
	if err != nil {
		return "", ""
	}
	return p.locate(name, id)
}

// locate is where an instance of infra lies, as far as its provider can tell from the id.
func (p *Provisioner) locate(infra, id string) (region, zone string) {
	if l, ok := capability[launcher.Locator](p, infra); ok {
		return l.Locate(id)
	}
	return "", ""
}

// LogPath finds an instance's log where its infra keeps one locally.
func (p *Provisioner) LogPath(id string) (string, error) {
	name, err := p.ownerName(id)
	if err != nil {
		return "", err
	}
	if ls, ok := capability[launcher.LogSource](p, name); ok {
		return ls.LogPath(id)
	}
	if h, ok := capability[launcher.LogHinter](p, name); ok {
		return "", fmt.Errorf("%w: %s keeps no local log for %s; read it with: %s", launcher.ErrNotFound, infraOf(id), id, h.LogHint(id))
	}
	return "", fmt.Errorf("%w: %s keeps no local log for %s", launcher.ErrNotFound, infraOf(id), id)
}

// StreamLogs reads an instance's output through its infra's API, for infras that keep it
// there (Kubernetes, clouds); infras with a local file answer through LogPath instead.
func (p *Provisioner) StreamLogs(ctx context.Context, id string, opts launcher.LogOptions, w io.Writer) error {
	name, err := p.ownerName(id)
	if err != nil {
		return err
	}
	ls, ok := capability[launcher.LogStreamer](p, name)
	if !ok {
		return fmt.Errorf("%w: %s cannot stream the output of %s", launcher.ErrNotFound, infraOf(id), id)
	}
	if down := p.health.Allow(name); down != nil {
		return down
	}
	return ls.StreamLogs(ctx, id, opts, w)
}

// CleanupJob asks every infra that keeps something of a job beyond its instances to release
// it, each within CallTimeout; an infra that is down is not asked, and says so in the error.
func (p *Provisioner) CleanupJob(ctx context.Context, job string) error {
	return fanOut(ctx, p, func(ctx context.Context, c launcher.JobCleaner) error { return c.CleanupJob(ctx, job) })
}

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
		c, ok := capability[T](p, name)
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
