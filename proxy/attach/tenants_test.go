package attach

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/internal/rpc"
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
		SyncLoop(ctx, tn, "p1", sync, nil, zap.NewNop())
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

// slowTenants answers a sync only after delay, with one managed key.
type slowTenants struct {
	delay time.Duration
	dir   tenants.Directory
}

func (s slowTenants) SyncTenants(_ tenants.SyncRequest, have int64) (tenants.SyncAnswer, *tenants.Directory, error) {
	time.Sleep(s.delay)
	if have == s.dir.Version {
		return tenants.SyncAnswer{}, nil, nil
	}
	return tenants.SyncAnswer{}, &s.dir, nil
}

// TestAttachedProxyReadyKnowsTheKeys: an attached proxy turns ready, and serves, only once its
// first sync has brought the managed keys, though the controller answers the sync well after the
// replica set: a client that sends a managed key as soon as the proxy is ready is not told 401.
func TestAttachedProxyReadyKnowsTheKeys(t *testing.T) {
	log := zaptest.NewLogger(t)
	llama := &fakeService{entered: make(chan uint64, 1)}
	find := func(name string) (Service, error) { return llama, nil }
	secret := "fy-0123456789abcdefghijklmnopqrstuvwxyzABCD"
	dir := tenants.Directory{Version: 1, Keys: []tenants.Key{{ID: "key_1", Name: "one", Hash: tenants.HashSecret(secret)}}}
	routes := append(Routes(find, log), TenantRoutes(slowTenants{delay: 600 * time.Millisecond, dir: dir}, log)...)
	srv := httptest.NewServer(rpc.NewHandler(rpc.Tokens{Full: attachToken}, routes))
	t.Cleanup(srv.Close)
	h := home.Home{Dir: t.TempDir()}
	if err := os.WriteFile(h.ProxyTokenPath(), []byte(attachToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	llama.feed.Publish(nil) // a replica set (empty) the first poll answers at once

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ready := new(proxy.Readiness)
	f := NewFollower(FollowerConfig{Service: "llama", Listener: ln, Home: h, Controllers: []string{srv.URL}, Readiness: ready, Logger: log, DrainTimeout: 5 * time.Second,
		Base: proxy.ServiceConfig{Name: "llama", Logger: log, Tenancy: proxy.NewTenancy(nil)}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})
	start := time.Now()
	for !ready.IsReady() {
		if time.Since(start) > 10*time.Second {
			t.Fatal("the proxy never turned ready")
		}
		time.Sleep(time.Millisecond)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`))
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("ready after %v; a managed key's first request: %d %s", time.Since(start).Round(time.Millisecond), resp.StatusCode, body)
	if resp.StatusCode == http.StatusUnauthorized {
		t.Fatalf("a managed key was refused (401) by a proxy that said it was ready: %s", body)
	}
}
