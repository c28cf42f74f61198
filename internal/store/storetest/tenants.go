package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/tenants"
)

// day is a fixed UTC day for the usage tests, and the ones after it.
var day = tenants.DayOf(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))

func directoryV(version int64, names ...string) tenants.Directory {
	d := tenants.Directory{Version: version, Prices: map[string]tenants.Price{"llama": {InputPerMillion: 0.2, OutputPerMillion: 0.6}},
		Teams: []tenants.Team{{Name: "eng", Limits: tenants.Limits{RequestsPerDay: 1000, BudgetUSD: 12.5, BudgetPeriod: tenants.PeriodMonth}}}}
	for i, n := range names {
		d.Keys = append(d.Keys, tenants.Key{ID: fmt.Sprintf("key_%012d", i), Name: n, Team: "eng", Hash: tenants.HashSecret("fy-" + n),
			Hint: "fy-" + n[:1] + "…", Services: []string{"chat"}, Models: []string{"llama"}, Priority: tenants.PriorityInteractive,
			PriorityHeader: true, Limits: tenants.Limits{RequestsPerMinute: 60, TotalTokensPerDay: 1 << 20},
			ExpiresAt: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), CreatedAt: time.Date(2026, 10, 1, 8, 0, 0, 123000000, time.UTC)})
	}
	return d
}

// testTenantsDirectory: an empty store has the empty directory at version 0; a put must follow
// the stored version exactly (ErrTenantsChanged otherwise, the stored one untouched); every field
// round-trips, across a restart and in a second store.
func testTenantsDirectory(t *testing.T, open Opener) {
	s := open(t)
	got, err := s.Tenants()
	must(t, err)
	if diff := cmp.Diff(tenants.Directory{}, got); diff != "" {
		t.Errorf("directory of an empty store (-want +got):\n%s", diff)
	}
	for _, v := range []int64{0, 2} {
		if err := s.PutTenants(directoryV(v, "alice")); !errors.Is(err, store.ErrTenantsChanged) {
			t.Errorf("put of version %d over none: %v, want ErrTenantsChanged", v, err)
		}
	}
	v1 := directoryV(1, "alice")
	must(t, s.PutTenants(v1))
	if err := s.PutTenants(directoryV(1, "bob")); !errors.Is(err, store.ErrTenantsChanged) {
		t.Errorf("second put of version 1: %v, want ErrTenantsChanged", err)
	}
	if err := s.PutTenants(directoryV(3, "bob")); !errors.Is(err, store.ErrTenantsChanged) {
		t.Errorf("put of version 3 over 1: %v, want ErrTenantsChanged", err)
	}
	got, err = s.Tenants()
	must(t, err)
	if diff := cmp.Diff(v1, got); diff != "" {
		t.Errorf("directory after refused puts (-want +got):\n%s", diff)
	}
	v2 := directoryV(2, "alice", "bob")
	v2.Keys[0].RevokedAt = time.Date(2026, 11, 2, 3, 4, 5, 0, time.UTC)
	must(t, s.PutTenants(v2))

	s.Close()
	s, other := open(t), open(t)
	for name, st := range map[string]store.Store{"reopened": s, "second": other} {
		got, err := st.Tenants()
		must(t, err)
		if diff := cmp.Diff(v2, got); diff != "" {
			t.Errorf("directory in the %s store (-want +got):\n%s", name, diff)
		}
	}
	must(t, other.PutTenants(directoryV(3, "carol")))
	if err := s.PutTenants(directoryV(3, "dave")); !errors.Is(err, store.ErrTenantsChanged) {
		t.Errorf("put of version 3 after the other store's: %v, want ErrTenantsChanged", err)
	}
}

// testTenantsRacingPuts: stores that put the same next version at once: exactly one wins.
func testTenantsRacingPuts(t *testing.T, open Opener) {
	stores := []store.Store{open(t), open(t), open(t)}
	must(t, stores[0].PutTenants(directoryV(1, "alice")))
	for v := int64(2); v <= 4; v++ {
		var wg sync.WaitGroup
		errs := make([]error, len(stores))
		for i, s := range stores {
			wg.Go(func() { errs[i] = s.PutTenants(directoryV(v, fmt.Sprintf("writer%d", i))) })
		}
		wg.Wait()
		won := 0
		for i, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, store.ErrTenantsChanged):
				t.Errorf("version %d, writer %d: %v, want nil or ErrTenantsChanged", v, i, err)
			}
		}
		if won != 1 {
			t.Fatalf("version %d: %d writers won, want 1 (%v)", v, won, errs)
		}
	}
	got, err := stores[1].Tenants()
	must(t, err)
	if got.Version != 4 || len(got.Keys) != 1 {
		t.Errorf("directory after the races: version %d, keys %+v; want version 4 with the winner's key", got.Version, got.Keys)
	}
}

func row(key, team, service, model string, d tenants.Day, n int64) tenants.Row {
	return tenants.Row{KeyID: key, Team: team, Service: service, Model: model, Day: d,
		Totals: tenants.Totals{Requests: n, Errors: n / 10, Input: 100 * n, Output: 30 * n, CostMicros: 7 * n}}
}

// testUsageAddsUp: rows with the same identity add up (a stored row keeps its team), Usage
// filters by day and orders by day, key, service and model, and it all survives a restart.
func testUsageAddsUp(t *testing.T, open Opener) {
	s := open(t)
	got, err := s.Usage(0)
	must(t, err)
	if len(got) != 0 {
		t.Fatalf("usage of an empty store: %+v", got)
	}
	must(t, s.AddUsage(nil))
	must(t, s.AddUsage([]tenants.Row{
		row("key_b", "eng", "chat", "llama", day+1, 5),
		row("key_a", "eng", "chat", "llama", day, 1),
		row("key_a", "", "chat", "llama-8b", day, 2),
		row("key_a", "eng", "embed", "bge", day, 3),
		row("key_c", "", "chat", "llama", day-1, 4),
	}))
	must(t, s.AddUsage([]tenants.Row{
		row("key_a", "ops", "chat", "llama", day, 10), // the stored row keeps eng
		row("key_a", "ops", "chat", "llama-8b", day, 20),
	}))
	want := []tenants.Row{
		row("key_a", "eng", "chat", "llama", day, 11),
		row("key_a", "ops", "chat", "llama-8b", day, 22),
		row("key_a", "eng", "embed", "bge", day, 3),
		row("key_b", "eng", "chat", "llama", day+1, 5),
	}
	want[0].Errors, want[1].Errors = 1, 2 // 1/10 + 10/10 and 2/10 + 20/10
	got, err = s.Usage(day)
	must(t, err)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("usage since %s (-want +got):\n%s", day, diff)
	}
	s.Close()
	s = open(t)
	got, err = s.Usage(day - 1)
	must(t, err)
	want = append([]tenants.Row{row("key_c", "", "chat", "llama", day-1, 4)}, want...)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("usage since %s after a restart (-want +got):\n%s", day-1, diff)
	}
}

// testUsageConcurrentAdds: stores adding to the same rows at once lose nothing; a batch of many
// keys over many days (far more than one object of the Kubernetes store could hold if it were
// one per month) is kept whole.
func testUsageConcurrentAdds(t *testing.T, open Opener) {
	stores := []store.Store{open(t), open(t)}
	const rounds = 5
	var wg sync.WaitGroup
	for _, s := range stores {
		wg.Go(func() {
			for range rounds {
				if err := s.AddUsage([]tenants.Row{row("key_a", "eng", "chat", "llama", day, 1), row("key_b", "", "chat", "llama", day, 2)}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	var many []tenants.Row
	for d := range tenants.Day(3) {
		for k := range 400 {
			many = append(many, row(fmt.Sprintf("key_%03d", k), "team-with-a-long-name", "a-service-name", "organisation/some-model-name-70b", day+10+d, int64(k+1)))
		}
	}
	must(t, stores[0].AddUsage(many))
	// A store reads its own writes at once, and another store's once its cache has them: the
	// Kubernetes store reads a watch that lags on a busy host (1,152 of 1,202 rows once in
	// CI), so the racing adds of the other store may take a moment to show.
	var got []tenants.Row
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		got, err = stores[0].Usage(day)
		must(t, err)
		if len(got) == 2+len(many) && got[0].Requests == 2*rounds && got[1].Requests == 4*rounds || time.Now().After(deadline) {
			break
		}
	}
	if len(got) != 2+len(many) {
		t.Fatalf("%d rows, want %d", len(got), 2+len(many))
	}
	if a, b := got[0], got[1]; a.Requests != 2*rounds || b.Requests != 4*rounds {
		t.Errorf("racing adds: key_a %d requests, key_b %d; want %d and %d", a.Requests, b.Requests, 2*rounds, 4*rounds)
	}
	if diff := cmp.Diff(many, got[2:]); diff != "" {
		t.Errorf("many rows (-want +got):\n%s", diff)
	}
}
