package controller

import (
	"context"
	"time"

	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/proxy/attach"
	"github.com/ferryserve/ferry/tenants"
)

// The controller's own proxies (every service's and the gateway's) share one proxy.Tenancy: the
// managed keys of the directory and one ledger, synced with the hub in process as attached
// proxies sync theirs over the attach route (proxy/attach/tenants.go).

// tenancyProxyID names the controller's own proxies to the hub.
const tenancyProxyID = "controller"

// SyncTenants implements attach.Tenants: a proxy's use goes into the hub, the fleet's comes
// back, with the directory when the proxy's version is not the current one.
func (c *Controller) SyncTenants(req tenants.SyncRequest, have int64) (tenants.SyncAnswer, *tenants.Directory, error) {
	ans := c.TenantHub().Sync(req, time.Now())
	c.usageMetrics.add(req.Rows)
	d, err := c.Tenants()
	if err != nil || d.Version == have {
		return ans, nil, err
	}
	return ans, &d, nil
}

var _ attach.Tenants = (*Controller)(nil)

// startTenancy gives the controller's proxies every new directory at once and syncs their
// ledger with the hub until ctx ends (after startTenants has loaded both).
func (c *Controller) startTenancy(ctx context.Context) {
	c.OnTenants(c.tenancy.SetDirectory)
	c.spawn(&c.wg, "tenant sync loop", func() {
		attach.SyncLoop(ctx, c.tenancy, tenancyProxyID, c.syncOwn, nil, c.log.Named("tenants"))
	})
}

func (c *Controller) syncOwn(_ context.Context, req attach.TenantSyncRequest) (attach.TenantSyncAnswer, error) {
	ans, dir, err := c.SyncTenants(req.SyncRequest, req.DirectoryVersion)
	return attach.TenantSyncAnswer{Answer: ans, Directory: dir}, err
}

// flushTenancy moves what the controller's proxies charged since their last sync into the hub:
// at shutdown, once they have drained, so that persistUsage writes all of it.
func (c *Controller) flushTenancy() {
	l := c.tenancy.Ledger()
	ans, _, _ := c.SyncTenants(l.Take(tenancyProxyID), -1)
	l.Apply(ans, time.Now())
}

// newTenancy is the controller's proxies' shared Tenancy.
func newTenancy() *proxy.Tenancy { return proxy.NewTenancy(nil) }
