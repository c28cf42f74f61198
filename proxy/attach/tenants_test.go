package attach

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/tenants"
)

// TestSyncLoopCarriesUseAndTheDirectory: the loop installs the controller's directory at once,
// sends the ledger's use, resends it after a failed sync, and syncs once more when it stops.
func TestSyncLoopCarriesUseAndTheDirectory(t *testing.T) {
	hub := tenants.NewHub(1)
	dir := tenants.Directory{Version: 3, Keys: []tenants.Key{{ID: "key_1", Name: "one", Hash: tenants.HashSecret("fy-secret")}}}
	var fail atomic.Bool
	sync := func(_ context.Context, req TenantSyncRequest) (TenantSyncAnswer, error) {
		if fail.Load() {
			return TenantSyncAnswer{}, errors.New("controller away")
		}
		ans := TenantSyncAnswer{Answer: hub.Sync(req.SyncRequest, time.Now())}
		if req.DirectoryVersion != dir.Version {
			ans.Directory = &dir
		}
		return ans, nil
	}
	tn := proxy.NewTenancy(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		SyncLoop(ctx, tn, "p1", sync, zap.NewNop())
	}()
	deadline := time.Now().Add(5 * time.Second)
	for tn.Version() != 3 {
		if time.Now().After(deadline) {
			t.Fatal("the directory never arrived")
		}
		time.Sleep(10 * time.Millisecond)
	}
	fail.Store(true)
	k := &dir.Keys[0]
	for range 3 {
		_, tk := tn.Ledger().Admit(k, nil, "svc", "m", tenants.Price{}, 10, time.Now())
		tn.Ledger().Settle(&tk, 10, 1, false, time.Now())
	}
	time.Sleep(3 * tenantSyncEvery) // failed syncs keep the rows
	fail.Store(false)
	_, tk := tn.Ledger().Admit(k, nil, "svc", "m", tenants.Price{}, 10, time.Now())
	tn.Ledger().Settle(&tk, 10, 1, false, time.Now())
	cancel() // the last request's use goes in the final sync, if not before
	<-done
	var got tenants.Totals
	for _, r := range hub.TakeDirty() {
		got.Requests += r.Requests
		got.Output += r.Output
	}
	if got.Requests != 4 || got.Output != 4 {
		t.Fatalf("the hub counted %+v, want 4 requests with 4 output tokens", got)
	}
}
