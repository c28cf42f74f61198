package replicas_test

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/replicas"
)

// idleProvider launches nothing and lists nothing: the test drives the manager through
// Notice alone.
type idleProvider struct{}

func (idleProvider) Launch(context.Context, launcher.Spec) (launcher.Instance, error) {
	return launcher.Instance{}, errors.New("no capacity")
}
func (idleProvider) Terminate(context.Context, string) error { return nil }
func (idleProvider) List(context.Context, map[string]string) ([]launcher.Instance, error) {
	return nil, nil
}

// TestManagerKeepsSpotLossesAcrossRestarts: the losses a manager recorded are saved with the
// service in the controller's SQLite store, and a manager restarted over it holds the fallback
// as the first one did, until the hold ends.
func TestManagerKeepsSpotLossesAcrossRestarts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ferry.db")
	task := &configs.Task{Name: "svc", Run: "serve", Resources: configs.Resources{UseSpot: true},
		Service: &configs.Service{Port: 8000, ReplicaPolicy: configs.ReplicaPolicy{MinReplicas: 5, MaxReplicas: 5,
			DynamicOndemandFallback: true}}}
	var (
		mu  sync.Mutex
		now = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advanceTo := func(t time.Time) { mu.Lock(); defer mu.Unlock(); now = t }
	t0 := clock()
	open := func() (*store.SQLite, *replicas.Manager) {
		st, err := store.OpenSQLite(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		m, err := replicas.New(replicas.Config{Service: "svc", Version: 1, Task: task, Provider: idleProvider{}, Store: st, Now: clock})
		if err != nil {
			t.Fatal(err)
		}
		return st, m
	}

	st, m := open()
	if err := st.CreateService(store.Service{Name: "svc", Version: 1, Task: task, Port: 30001, Status: replicas.ServiceReady}); err != nil {
		t.Fatal(err)
	}
	for id := 1; id <= 5; id++ {
		// Replicas 1 to 4 run on spot, 5 on demand.
		rec := replicas.Record{Service: "svc", ID: id, Version: 1, Status: replicas.StatusReady, InstanceID: "i-" + strconv.Itoa(id),
			Infra: "aws", Zone: "us-east-1a", Spot: id < 5, LaunchedAt: t0.Add(-time.Hour)}
		if err := st.SaveReplica(rec); err != nil {
			t.Fatal(err)
		}
	}
	m.Replicas() // loads the records
	// Losses 20, 20 and 30 minutes apart: the fallback is held 20 minutes (policy.Losses).
	for i, at := range []time.Duration{0, 20 * time.Minute, 40 * time.Minute, 70 * time.Minute} {
		advanceTo(t0.Add(at))
		if !m.Notice("i-"+strconv.Itoa(i+1), clock().Add(2*time.Minute)) {
			t.Fatalf("notice of i-%d not claimed", i+1)
		}
	}
	m.Notice("i-5", clock().Add(2*time.Minute)) // on demand: no spot loss
	if got := m.SpotLosses(); got.Zones["us-east-1a"].Count != 4 || !got.Holding(clock()) {
		t.Fatalf("losses %+v: want 4 in us-east-1a, holding", got)
	}

	st.Close()
	advanceTo(t0.Add(80 * time.Minute))
	_, restarted := open()
	got := restarted.SpotLosses()
	if !got.Holding(clock()) || got.Hold(clock()) != 20*time.Minute || got.Zones["us-east-1a"].Count != 4 {
		t.Errorf("restarted manager: losses %+v, hold %v; want holding 20m, 4 losses in us-east-1a", got, got.Hold(clock()))
	}
	if got.Holding(t0.Add(90 * time.Minute)) {
		t.Error("the hold does not end 20 minutes after the last loss")
	}
}

// lossesUnreadable is a store whose saved spot losses cannot be read (corrupt, or written by a
// newer controller).
type lossesUnreadable struct{ *store.SQLite }

func (lossesUnreadable) Losses(string) (replicas.Losses, error) {
	return replicas.Losses{}, errors.New("invalid character in spot_losses_json")
}

// Spot losses only advise the plan: a manager whose saved losses cannot be read still loads
// its replicas, with no history.
func TestManagerStartsWithoutUnreadableLosses(t *testing.T) {
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "ferry.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	task := &configs.Task{Name: "svc", Run: "serve", Resources: configs.Resources{UseSpot: true},
		Service: &configs.Service{Port: 8000, ReplicaPolicy: configs.ReplicaPolicy{MinReplicas: 1, MaxReplicas: 1, DynamicOndemandFallback: true}}}
	if err := st.CreateService(store.Service{Name: "svc", Version: 1, Task: task, Port: 30001, Status: replicas.ServiceReady}); err != nil {
		t.Fatal(err)
	}
	if err := st.SaveReplica(replicas.Record{Service: "svc", ID: 1, Version: 1, Status: replicas.StatusReady, InstanceID: "i-1",
		Infra: "aws", Zone: "us-east-1a", Spot: true, LaunchedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	m, err := replicas.New(replicas.Config{Service: "svc", Version: 1, Task: task, Provider: idleProvider{}, Store: lossesUnreadable{st}})
	if err != nil {
		t.Fatal(err)
	}
	if recs := m.Replicas(); len(recs) != 1 {
		t.Fatalf("%d replicas loaded, want 1", len(recs))
	}
	if l := m.SpotLosses(); !l.Last.IsZero() || len(l.Gaps) != 0 {
		t.Errorf("losses %+v, want none", l)
	}
}
