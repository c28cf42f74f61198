package controller

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/tenants"
)

// flakyStore fails AddUsage as told, and runs beforePut ahead of each PutTenants.
type flakyStore struct {
	store.Store
	mu        sync.Mutex
	failAdds  int  // AddUsage calls to fail
	partial   bool // fail them part-way: the first row written, the rest named unsaved
	beforePut func()
}

func (s *flakyStore) AddUsage(rows []tenants.Row) error {
	s.mu.Lock()
	fail := s.failAdds > 0
	s.failAdds--
	s.mu.Unlock()
	switch {
	case fail && s.partial:
		if err := s.Store.AddUsage(rows[:1]); err != nil {
			return err
		}
		return &store.UnsavedUsageError{Rows: rows[1:], Err: errors.New("conflict after conflict")}
	case fail:
		return errors.New("store down")
	}
	return s.Store.AddUsage(rows)
}

func (s *flakyStore) PutTenants(d tenants.Directory) error {
	if s.beforePut != nil {
		s.beforePut()
	}
	return s.Store.PutTenants(d)
}

func openSQLite(t *testing.T, path string) *store.SQLite {
	t.Helper()
	s, err := store.OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// leadingTenants is a controller whose tenants side leads on st, persisting every 10 ms.
func leadingTenants(t *testing.T, st store.Store) (*Controller, context.CancelFunc) {
	t.Helper()
	c := New(Options{Logger: zaptest.NewLogger(t), UsagePersistInterval: 10 * time.Millisecond})
	c.store = st
	ctx, cancel := context.WithCancel(context.Background())
	if err := c.startTenants(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); c.wg.Wait() })
	return c, cancel
}

// TestOnTenantsSeesEveryVersionInOrder: a subscriber hears the directory at once (empty before
// the leader loads it), then the stored one, then each edit's.
func TestOnTenantsSeesEveryVersionInOrder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ferry.db")
	st := openSQLite(t, path)
	if err := st.PutTenants(tenants.Directory{Version: 1, Teams: []tenants.Team{{Name: "eng"}}}); err != nil {
		t.Fatal(err)
	}
	c := New(Options{Logger: zaptest.NewLogger(t)})
	var mu sync.Mutex
	var seen []int64
	c.OnTenants(func(d tenants.Directory) { mu.Lock(); seen = append(seen, d.Version); mu.Unlock() })
	c.store = st
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); c.wg.Wait() }()
	if err := c.startTenants(ctx); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := c.EditTenants(func(d *tenants.Directory) error { d.Teams[0].Limits.RequestsPerDay++; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.EditTenants(func(*tenants.Directory) error { return api.ErrInvalid }); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("a refused edit: %v, want its error", err)
	}
	var late []int64
	c.OnTenants(func(d tenants.Directory) { late = append(late, d.Version) })
	mu.Lock()
	defer mu.Unlock()
	if want := []int64{0, 1, 2, 3, 4}; !slices.Equal(seen, want) || !slices.Equal(late, []int64{4}) {
		t.Errorf("versions seen %v and by a late subscriber %v; want %v and [4]", seen, late, want)
	}
	d, _ := st.Tenants()
	if d.Version != 4 || d.Teams[0].Limits.RequestsPerDay != 3 {
		t.Errorf("stored %+v, want version 4 with 3 requests a day", d)
	}
}

// TestEditTenantsRetriesOnceAfterAnotherWriter: when another writer keeps a version between the
// read and the put, the edit is made again on the newer directory; a second time, it is a
// conflict for the caller.
func TestEditTenantsRetriesOnceAfterAnotherWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ferry.db")
	other := openSQLite(t, path)
	st := &flakyStore{Store: openSQLite(t, path)}
	c, _ := leadingTenants(t, st)
	races := 1
	st.beforePut = func() {
		if races > 0 {
			races--
			d, _ := other.Tenants()
			d.Version++
			d.Teams = append(d.Teams, tenants.Team{Name: "theirs"})
			if err := other.PutTenants(d); err != nil {
				t.Error(err)
			}
		}
	}
	d, err := c.EditTenants(func(d *tenants.Directory) error { d.Teams = append(d.Teams, tenants.Team{Name: "ours"}); return nil })
	if err != nil || d.Version != 2 || len(d.Teams) != 2 {
		t.Fatalf("edit after another writer: %+v, %v; want version 2 with both teams", d, err)
	}
	races = 2
	if _, err := c.EditTenants(func(*tenants.Directory) error { return nil }); !errors.Is(err, api.ErrConflict) {
		t.Errorf("edit beaten twice: %v, want ErrConflict", err)
	}
}

// TestUsagePersistsAndSurvivesFailures: rows synced to the hub reach the store; a store that
// fails keeps them in the hub for the next try, and one that fails part-way gets only the rows
// it did not write again: the totals come out exact.
func TestUsagePersistsAndSurvivesFailures(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ferry.db")
	st := &flakyStore{Store: openSQLite(t, path), failAdds: 2}
	c, _ := leadingTenants(t, st)
	now := time.Now()
	day := tenants.DayOf(now)
	sync := func(key string, n int64) {
		c.TenantHub().Sync(tenants.SyncRequest{Proxy: "p1", Rows: []tenants.Row{{KeyID: key, Service: "chat", Model: "m", Day: day,
			Totals: tenants.Totals{Requests: n, Input: 10 * n}}}}, now)
	}
	sync("key_a", 1)
	sync("key_b", 2)
	waitRows(t, st, day, map[string]int64{"key_a": 1, "key_b": 2})

	st.mu.Lock()
	st.failAdds, st.partial = 1, true
	st.mu.Unlock()
	sync("key_a", 10)
	sync("key_b", 20)
	waitRows(t, st, day, map[string]int64{"key_a": 11, "key_b": 22})
	sync("key_c", 5)
	if rows, err := c.UsageRows(day); err != nil || len(rows) != 3 {
		t.Errorf("UsageRows right after a sync: %+v, %v; want key_c's row persisted first", rows, err)
	}

	// A restarted leader loads what was persisted: its hub counts today's use.
	c2, _ := leadingTenants(t, st)
	ans := c2.TenantHub().Sync(tenants.SyncRequest{Proxy: "p2"}, now)
	i := slices.IndexFunc(ans.Accounts, func(g tenants.Global) bool { return g.Account == tenants.KeyAccount("key_b") })
	if i < 0 || ans.Accounts[i].DayUsed.Requests != 22 {
		t.Errorf("after a restart the hub's accounts are %+v; want key_b with 22 requests today", ans.Accounts)
	}
}

// waitRows waits until the store holds want requests per key on day.
func waitRows(t *testing.T, st store.Store, day tenants.Day, want map[string]int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rows, err := st.Usage(day)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, r := range rows {
			got[r.KeyID] += r.Requests
		}
		ok := len(got) == len(want)
		for k, n := range want {
			ok = ok && got[k] == n
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stored requests %v, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
