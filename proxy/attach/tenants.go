package attach

import (
	"context"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/internal/rpc"
	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/tenants"
)

// Managed keys across proxies. Every proxy process keeps a ledger of its requests (tenants.Ledger)
// and syncs it with the controller's hub every tenantSyncEvery: it sends the use it admitted and
// gets back every other proxy's, so a key's limits hold for the fleet and not per proxy, and it
// gets the directory of keys whenever it changed. While the controller is unreachable the proxy
// keeps its last directory and enforces its share of each per-minute limit (tenants.StaleAfter).

// tenantSyncEvery spaces the syncs: N proxies overshoot a per-minute limit by at most what they
// admit in this time between them.
const tenantSyncEvery = 250 * time.Millisecond

// Tenants is the controller's side of the sync.
type Tenants interface {
	// SyncTenants adds a proxy's use to the hub and answers with the fleet's; it returns the
	// directory too when the proxy's version (have) is not the current one.
	SyncTenants(req tenants.SyncRequest, have int64) (tenants.SyncAnswer, *tenants.Directory, error)
}

// TenantSyncRequest is a proxy's sync: its use, and the directory version it holds.
type TenantSyncRequest struct {
	tenants.SyncRequest
	DirectoryVersion int64 `json:"directory_version"`
}

// TenantSyncAnswer is the controller's: the fleet's use, and the directory when it changed.
type TenantSyncAnswer struct {
	Answer    tenants.SyncAnswer `json:"answer"`
	Directory *tenants.Directory `json:"directory,omitempty"`
}

// TenantRoutes is the sync route, for rpc.NewHandler, behind the attach token like the others.
func TenantRoutes(t Tenants, log *zap.Logger) []rpc.Route {
	return []rpc.Route{{Method: http.MethodPost, Pattern: "/v1/tenants/sync", Scope: rpc.ScopeAttach,
		Handler: func(w http.ResponseWriter, r *http.Request) {
			var req TenantSyncRequest
			if err := rpc.DecodeBody(w, r, 8<<20, &req); err != nil {
				rpc.WriteError(w, log, invalid("decode sync: "+err.Error()))
				return
			}
			if req.Proxy == "" {
				rpc.WriteError(w, log, invalid("proxy must not be empty"))
				return
			}
			ans, dir, err := t.SyncTenants(req.SyncRequest, req.DirectoryVersion)
			if err != nil {
				rpc.WriteError(w, log, err)
				return
			}
			rpc.WriteJSON(w, http.StatusOK, TenantSyncAnswer{Answer: ans, Directory: dir})
		}}}
}

// SyncTenants sends one sync.
func SyncTenants(ctx context.Context, c *rpc.Client, req TenantSyncRequest) (TenantSyncAnswer, error) {
	var ans TenantSyncAnswer
	err := c.Do(ctx, http.MethodPost, "/v1/tenants/sync", req, &ans)
	return ans, err
}

// SyncLoop syncs t's ledger every tenantSyncEvery through sync until ctx ends, installing each
// new directory. A failed sync keeps its use for the next. proxyID names this proxy to the hub.
// synced, when not nil, is called once, after the first sync that succeeded (its directory
// installed).
func SyncLoop(ctx context.Context, t *proxy.Tenancy, proxyID string, sync func(context.Context, TenantSyncRequest) (TenantSyncAnswer, error), synced func(), log *zap.Logger) {
	tick := time.NewTicker(tenantSyncEvery)
	defer tick.Stop()
	var lastWarn time.Time
	for first := true; ; first = false {
		final := false
		if !first { // the first at once: a new proxy learns the keys before its first requests
			select {
			case <-ctx.Done():
				final = true // the use since the last sync still counts
			case <-tick.C:
			}
		}
		req := TenantSyncRequest{SyncRequest: t.Ledger().Take(proxyID), DirectoryVersion: t.Version()}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportTimeout)
		ans, err := sync(sctx, req)
		cancel()
		if final {
			if err != nil {
				log.Warn("managed keys: the last sync failed; its use is lost", zap.Error(err), zap.Int("rows", len(req.Rows)))
			}
			return
		}
		if err != nil {
			t.Ledger().Fail(req.SyncRequest)
			if ctx.Err() == nil && time.Since(lastWarn) >= warnEvery {
				log.Warn("managed keys: sync with the controller failed; enforcing this proxy's share of each limit", zap.Error(err))
				lastWarn = time.Now()
			}
			continue
		}
		if ans.Directory != nil {
			t.SetDirectory(*ans.Directory)
		}
		t.Ledger().Apply(ans.Answer, time.Now())
		if synced != nil {
			synced()
			synced = nil
		}
	}
}

// keySync is an attached proxy's one SyncLoop (its Tenancy is shared by every service it
// serves), through the controller it follows, and the wait for its first sync.
type keySync struct {
	tenancy *proxy.Tenancy // nil: no managed keys, nothing to sync
	ctl     *controllerConn
	id      string
	log     *zap.Logger
	// known is closed at the first sync that succeeded.
	known chan struct{}
}

func newKeySync(t *proxy.Tenancy, ctl *controllerConn, id string, log *zap.Logger) *keySync {
	return &keySync{tenancy: t, ctl: ctl, id: id, log: log, known: make(chan struct{})}
}

// run is SyncLoop until ctx ends, and one sync more; it returns at once without a Tenancy.
func (k *keySync) run(ctx context.Context) {
	if k.tenancy == nil {
		return
	}
	SyncLoop(ctx, k.tenancy, k.id, func(ctx context.Context, req TenantSyncRequest) (TenantSyncAnswer, error) {
		c, _, err := k.ctl.client()
		if err != nil {
			return TenantSyncAnswer{}, err
		}
		return SyncTenants(ctx, c, req) // the watch loop finds another controller on failures
	}, func() { close(k.known) }, k.log)
}

// await waits, at most reportTimeout, until a sync has brought the managed keys: the first
// sync starts with the first poll and usually ends first, but a proxy that served before it
// would answer a managed key 401 meanwhile. A failed sync (a controller that is not the leader,
// with --controller URLs) does not end the wait: the next one, 250 ms on, may bring them. Past
// the wait (the controller not answering syncs) the proxy serves anyway, and learns the keys at
// a later sync.
func (k *keySync) await() {
	if k.tenancy == nil {
		return
	}
	t := time.NewTimer(reportTimeout)
	defer t.Stop()
	select {
	case <-k.known:
	case <-t.C:
		k.log.Warn("serving before the controller sent the managed keys: requests with one get 401 until it does", zap.Duration("waited", reportTimeout))
	}
}
