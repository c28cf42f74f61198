package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/tenants"
)

// The tenants' side of the controller (issue 41): it owns the directory of API keys, teams and
// prices (kept in the store, versioned, handed to whoever subscribes with OnTenants: the
// proxies) and one tenants.Hub, which every proxy syncs its use with and whose new rows the
// leader persists every two seconds and at shutdown. No secret passes through here: the API
// makes a key's secret and answers it, the directory has its hash.

// defaultUsagePersist is how often the hub's new usage rows are written to the store.
const defaultUsagePersist = 2 * time.Second

// tenantState is the directory as last kept, its subscribers, and the hub.
type tenantState struct {
	hub *tenants.Hub
	// edit serialises this controller's directory writes.
	edit sync.Mutex
	// deliver serialises calls to subscribers, so that each sees the versions in order.
	deliver sync.Mutex
	mu      sync.Mutex // guards dir and subs; never held while a subscriber runs
	dir     tenants.Directory
	subs    []func(tenants.Directory)
}

func newTenantState(epoch time.Time) *tenantState {
	return &tenantState{hub: tenants.NewHub(epoch.UnixNano())}
}

// TenantHub is the hub that proxies (the controller's own and attached ones) sync their use
// with: it makes per-key and per-team limits global, and gathers the usage the leader
// persists.
func (c *Controller) TenantHub() *tenants.Hub { return c.tenantState.hub }

// OnTenants calls fn with the current directory right away, and again with every new version,
// in order, one call at a time. fn must not modify the directory (it is shared), block for
// long, or call OnTenants.
func (c *Controller) OnTenants(fn func(tenants.Directory)) {
	ts := c.tenantState
	ts.deliver.Lock()
	defer ts.deliver.Unlock()
	ts.mu.Lock()
	ts.subs = append(ts.subs, fn)
	d := ts.dir
	ts.mu.Unlock()
	fn(d)
}

// publish makes d the current directory and tells every subscriber; an older version than the
// current one is ignored.
func (ts *tenantState) publish(d tenants.Directory) {
	ts.deliver.Lock()
	defer ts.deliver.Unlock()
	ts.mu.Lock()
	if d.Version < ts.dir.Version {
		ts.mu.Unlock()
		return
	}
	ts.dir = d
	subs := slices.Clone(ts.subs)
	ts.mu.Unlock()
	for _, fn := range subs {
		fn(d)
	}
}

// startTenants loads the directory and every usage row (the hub's day, month and all-time
// counts: a restarted leader keeps enforcing daily limits and budgets), then persists the hub's
// new rows every interval until ctx ends. Only the leader runs it (lead).
func (c *Controller) startTenants(ctx context.Context) error {
	d, err := c.store.Tenants()
	if err != nil {
		return fmt.Errorf("load the tenants directory: %w", err)
	}
	rows, err := c.store.Usage(0)
	if err != nil {
		return fmt.Errorf("load the usage: %w", err)
	}
	c.tenantState.hub.Load(rows, time.Now())
	c.tenantState.publish(d)
	c.log.Info("tenants loaded", zap.Int64("version", d.Version), zap.Int("keys", len(d.Keys)), zap.Int("usage_rows", len(rows)))
	interval := c.opts.UsagePersistInterval
	if interval <= 0 {
		interval = defaultUsagePersist
	}
	c.spawn(&c.wg, "usage persist loop", func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return // shutdown persists the last rows, once the proxies have stopped
			case <-t.C:
				c.persistUsage()
			}
		}
	})
	return nil
}

// persistUsage writes the rows the hub gathered since the last call; rows the store did not
// take go back to the hub, to be added at the next call.
func (c *Controller) persistUsage() {
	hub := c.tenantState.hub
	rows := hub.TakeDirty()
	if len(rows) == 0 {
		return
	}
	if c.store == nil { // a follower's hub hears no proxy; should it, the leader counts
		hub.Restore(rows)
		return
	}
	err := c.store.AddUsage(rows)
	if err == nil {
		return
	}
	unsaved := rows
	var partial *store.UnsavedUsageError
	if errors.As(err, &partial) {
		unsaved = partial.Rows
	}
	hub.Restore(unsaved)
	c.log.Warn("persist usage: kept in memory, to be written at the next try", zap.Int("rows", len(unsaved)), zap.Error(err))
}

var _ api.TenantBackend = (*Controller)(nil)

// Tenants implements api.TenantBackend: the directory as last kept.
func (c *Controller) Tenants() (tenants.Directory, error) {
	ts := c.tenantState
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.dir, nil
}

// EditTenants implements api.TenantBackend: edit runs on a copy of the stored directory, kept
// as the next version if the stored one is still the version it read; when another writer got
// there first (a controller across a failover), it reads again and edits once more.
func (c *Controller) EditTenants(edit func(*tenants.Directory) error) (tenants.Directory, error) {
	ts := c.tenantState
	ts.edit.Lock()
	defer ts.edit.Unlock()
	for attempt := 0; ; attempt++ {
		cur, err := c.store.Tenants()
		if err != nil {
			return tenants.Directory{}, err
		}
		next := cloneDirectory(cur)
		if err := edit(&next); err != nil {
			return tenants.Directory{}, err
		}
		next.Version = cur.Version + 1
		err = c.store.PutTenants(next)
		if errors.Is(err, store.ErrTenantsChanged) && attempt == 0 {
			continue
		}
		if errors.Is(err, store.ErrTenantsChanged) {
			return tenants.Directory{}, &api.Error{Kind: api.ErrConflict, Msg: "the keys directory changed twice under this change; try again (" + err.Error() + ")"}
		}
		if err != nil {
			return tenants.Directory{}, err
		}
		ts.publish(next)
		return next, nil
	}
}

// UsageRows implements api.TenantBackend: the hub's rows are persisted first, so that the
// answer holds every request the proxies reported.
func (c *Controller) UsageRows(since tenants.Day) ([]tenants.Row, error) {
	c.persistUsage()
	return c.store.Usage(since)
}

// cloneDirectory copies what an edit changes in place: the key and team lists and the prices.
// A key's scope lists are replaced by edits, never changed in place, and are shared.
func cloneDirectory(d tenants.Directory) tenants.Directory {
	d.Keys = slices.Clone(d.Keys)
	d.Teams = slices.Clone(d.Teams)
	d.Prices = maps.Clone(d.Prices)
	return d
}
