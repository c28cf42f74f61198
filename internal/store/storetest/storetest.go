// Package storetest is the contract every store.Store keeps, as one table of tests that
// internal/store runs against SQLite and internal/store/kubestore against a real API server.
package storetest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/replicas"
	"github.com/google/go-cmp/cmp"
)

// Opener opens a store on one backend's state; calling it again opens another store on the same
// state, as a restarted (or a second) controller would. The stores it opens are closed when the
// test ends; closing one earlier is allowed.
type Opener func(t *testing.T) store.Store

// Fresh makes empty state for one test and returns its Opener.
type Fresh func(t *testing.T) Opener

// Tests is the contract, keyed by name.
var Tests = []struct {
	Name string
	Run  func(t *testing.T, open Opener)
}{
	{"ServiceRoundTrip", testServiceRoundTrip},
	{"ReplicaIDsAreNeverReused", testReplicaIDsAreNeverReused},
	{"ReplicaIDsUniqueAcrossStores", testReplicaIDsUniqueAcrossStores},
	{"ReplicaRecords", testReplicaRecords},
	{"ReopenKeepsState", testReopenKeepsState},
	{"VersionsAndRollouts", testVersionsAndRollouts},
	{"SpotLosses", testSpotLosses},
	{"JobsRoundTrip", testJobsRoundTrip},
	{"JobIDsUniqueAcrossStores", testJobIDsUniqueAcrossStores},
	{"LeftoversLedger", testLeftoversLedger},
	{"LeftoverWithoutKeyRefused", testLeftoverWithoutKeyRefused},
	{"ReplicaOfMissingServiceRefused", testReplicaOfMissingServiceRefused},
	{"RacingWritesAndDeletes", testRacingWritesAndDeletes},
	{"TenantsDirectory", testTenantsDirectory},
	{"TenantsRacingPuts", testTenantsRacingPuts},
	{"UsageAddsUp", testUsageAddsUp},
	{"UsageConcurrentAdds", testUsageConcurrentAdds},
}

// Run runs every test of the contract on fresh state from fresh.
func Run(t *testing.T, fresh Fresh) {
	for _, tc := range Tests {
		t.Run(tc.Name, func(t *testing.T) { tc.Run(t, fresh(t)) })
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func testServiceRoundTrip(t *testing.T, open Opener) {
	s := open(t)
	task := &configs.Task{Name: "chat", Run: "serve", Secrets: map[string]string{"HF_TOKEN": "hf_x"},
		Envs:    map[string]string{"MODEL": "m"},
		Service: &configs.Service{Port: 8080, ReplicaPolicy: configs.ReplicaPolicy{MinReplicas: 2, MaxReplicas: 2}}}
	must(t, s.CreateService(store.Service{Name: "chat", Version: 1, Task: task, Port: 30001, Status: "CONTROLLER_INIT"}))
	if err := s.CreateService(store.Service{Name: "chat", Version: 1, Task: task, Port: 30002}); err == nil {
		t.Fatal("duplicate service name accepted")
	}
	must(t, s.SetServiceStatus("chat", "READY"))
	got, err := s.GetService("chat")
	must(t, err)
	if diff := cmp.Diff(task, got.Task); diff != "" {
		t.Errorf("task (-want +got):\n%s", diff)
	}
	if got.Port != 30001 || got.Status != "READY" || got.Version != 1 || got.Target != -1 {
		t.Errorf("got %+v", got)
	}
	if got.CreatedAt.IsZero() || got.UpdatedAt.Before(got.CreatedAt) {
		t.Errorf("created %v, updated %v", got.CreatedAt, got.UpdatedAt)
	}
	if _, err := s.GetService("nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetService(nope) = %v, want ErrNotFound", err)
	}
	if err := s.SetServiceStatus("nope", "READY"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("SetServiceStatus(nope) = %v, want ErrNotFound", err)
	}
	must(t, s.CreateService(store.Service{Name: "aaa", Version: 1, Task: &configs.Task{}, Port: 30003}))
	list, err := s.ListServices()
	must(t, err)
	if len(list) != 2 || list[0].Name != "aaa" || list[1].Name != "chat" {
		t.Errorf("ListServices = %+v, want aaa, chat", list)
	}
}

func testReplicaIDsAreNeverReused(t *testing.T, open Opener) {
	s := open(t)
	must(t, s.CreateService(store.Service{Name: "a", Version: 1, Task: &configs.Task{}, Port: 1}))
	var ids []int
	for range 3 {
		id, err := s.NextReplicaIDs("a", 1)
		must(t, err)
		ids = append(ids, id)
	}
	if diff := cmp.Diff([]int{1, 2, 3}, ids); diff != "" {
		t.Errorf("ids (-want +got):\n%s", diff)
	}
	// An adopted replica with a higher id moves the counter past it.
	must(t, s.SaveReplica(replicas.Record{Service: "a", ID: 10, Version: 1, Status: replicas.StatusStarting}))
	must(t, s.DeleteReplica("a", 10))
	id, err := s.NextReplicaIDs("a", 1)
	must(t, err)
	if id != 11 {
		t.Errorf("after adopting id 10, next id = %d, want 11", id)
	}
	if _, err := s.NextReplicaIDs("missing", 1); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("NextReplicaIDs(missing, 1) = %v, want ErrNotFound", err)
	}
	// Several at once: one write moves the counter past all of them.
	first, err := s.NextReplicaIDs("a", 4)
	must(t, err)
	after, err := s.NextReplicaIDs("a", 1)
	must(t, err)
	if first != 12 || after != 16 {
		t.Errorf("NextReplicaIDs(a, 4) = %d, then NextReplicaIDs(a, 1) = %d; want 12 (12 to 15), then 16", first, after)
	}
	if _, err := s.NextReplicaIDs("a", 0); err == nil {
		t.Error("NextReplicaIDs(a, 0) handed out ids, want an error")
	}
}

// testReplicaIDsUniqueAcrossStores allocates from two stores on the same state at once, as two
// controllers racing through a failover would: no id may come out twice.
func testReplicaIDsUniqueAcrossStores(t *testing.T, open Opener) {
	a, b := open(t), open(t)
	must(t, a.CreateService(store.Service{Name: "a", Version: 1, Task: &configs.Task{}, Port: 1}))
	ids := allocateConcurrently(t, func(i int) (int64, error) {
		s := a
		if i%2 == 1 {
			s = b
		}
		id, err := s.NextReplicaIDs("a", 1)
		return int64(id), err
	})
	checkDistinct(t, ids, 1)
}

func allocateConcurrently(t *testing.T, next func(i int) (int64, error)) []int64 {
	t.Helper()
	const n = 10
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		ids  []int64
		errs []error
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := next(i)
			mu.Lock()
			defer mu.Unlock()
			ids, errs = append(ids, id), append(errs, err)
		}()
	}
	wg.Wait()
	must(t, errors.Join(errs...))
	return ids
}

// checkDistinct wants ids to be exactly first, first+1, … in some order.
func checkDistinct(t *testing.T, ids []int64, first int64) {
	t.Helper()
	seen := map[int64]bool{}
	for _, id := range ids {
		if seen[id] {
			t.Errorf("id %d handed out twice: %v", id, ids)
		}
		seen[id] = true
	}
	for id := first; id < first+int64(len(ids)); id++ {
		if !seen[id] {
			t.Errorf("id %d never handed out (gap): %v", id, ids)
		}
	}
}

func testReplicaRecords(t *testing.T, open Opener) {
	s := open(t)
	must(t, s.CreateService(store.Service{Name: "a", Version: 1, Task: &configs.Task{}, Port: 1}))
	launched := time.UnixMilli(time.Now().UnixMilli())
	r := replicas.Record{Service: "a", ID: 2, Version: 1, Status: replicas.StatusStarting, InstanceID: "local-a-2",
		Endpoint: "127.0.0.1:4000", Infra: "local", Zone: "z1", Spot: true, Price: 1.25, Resources: "1x T4", LaunchedAt: launched}
	must(t, s.SaveReplica(r))
	r.Status = replicas.StatusReady
	r.ReadyAt = launched.Add(time.Second)
	must(t, s.SaveReplica(r))
	r1 := replicas.Record{Service: "a", ID: 1, Version: 1, Status: replicas.StatusFailed, Reason: "exit status 1"}
	must(t, s.SaveReplica(r1))
	got, err := s.ListReplicas("a")
	must(t, err)
	if diff := cmp.Diff([]replicas.Record{r1, r}, got); diff != "" {
		t.Errorf("replicas (-want +got):\n%s", diff)
	}
	must(t, s.DeleteReplica("a", 1))
	got, err = s.ListReplicas("a")
	must(t, err)
	if diff := cmp.Diff([]replicas.Record{r}, got); diff != "" {
		t.Errorf("replicas after delete (-want +got):\n%s", diff)
	}
	must(t, s.DeleteService("a"))
	got, err = s.ListReplicas("a")
	if err != nil || len(got) != 0 {
		t.Errorf("after DeleteService: %v, %v", got, err)
	}
}

func testReopenKeepsState(t *testing.T, open Opener) {
	s := open(t)
	must(t, s.CreateService(store.Service{Name: "a", Version: 3, Task: &configs.Task{Run: "x"}, Port: 30005, Status: "READY"}))
	s.Close()
	s = open(t)
	list, err := s.ListServices()
	must(t, err)
	if len(list) != 1 || list[0].Port != 30005 || list[0].Version != 3 || list[0].Task.Run != "x" {
		t.Errorf("after reopen: %+v", list)
	}
}

func testVersionsAndRollouts(t *testing.T, open Opener) {
	s := open(t)
	v1 := &configs.Task{Run: "serve v1", Service: &configs.Service{Port: 8080}}
	v2 := &configs.Task{Run: "serve v2", Secrets: map[string]string{"K": "v2-secret"}, Service: &configs.Service{Port: 8080}}
	must(t, s.CreateService(store.Service{Name: "chat", Version: 1, Task: v1, Port: 30001, Status: "READY"}))
	if r, err := s.Rollout("chat"); err != nil || r != nil {
		t.Fatalf("Rollout before any update = %v, %v; want nil, nil", r, err)
	}
	must(t, s.SetTarget("chat", 3))
	started := time.UnixMilli(time.Now().UnixMilli()).UTC()
	r := replicas.Rollout{From: 1, To: 2, Mode: configs.UpdateRolling, State: replicas.RolloutInProgress, FromServed: true,
		Policy: configs.DefaultUpdate(), StartedAt: started, ProgressAt: started, NewReady: 7}
	must(t, s.StartUpdate("chat", replicas.Version{Number: 2, Task: v2, LaunchedAs: 2}, r))
	if err := s.StartUpdate("chat", replicas.Version{Number: 2, Task: v2, LaunchedAs: 2}, r); err == nil {
		t.Error("a second version 2 was accepted")
	}
	svc, err := s.GetService("chat")
	must(t, err)
	if svc.Version != 2 || svc.Task.Run != "serve v2" || svc.Task.Secrets["K"] != "v2-secret" || svc.Target != 3 {
		t.Errorf("service after update start: version %d, run %q, target %d; want 2, serve v2, 3", svc.Version, svc.Task.Run, svc.Target)
	}

	// A rollback makes the old version current again, in the same write.
	r.State = replicas.RolloutRolledBack
	r.Reason = "replica 3 of version 2: FAILED"
	must(t, s.SaveRollout("chat", r))
	if err := s.SaveRollout("chat", replicas.Rollout{From: 1, To: 9, State: replicas.RolloutInProgress}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("rollout to an unknown version: %v, want ErrNotFound", err)
	}
	s.Close()
	checkRolledBack(t, open(t), r) // what a restarted controller reads
}

func checkRolledBack(t *testing.T, s store.Store, r replicas.Rollout) {
	svc, _ := s.GetService("chat")
	if svc.Version != 1 || svc.Task.Run != "serve v1" {
		t.Errorf("service after rollback: version %d, run %q; want 1, serve v1", svc.Version, svc.Task.Run)
	}
	got, err := s.Rollout("chat")
	must(t, err)
	want := r
	want.NewReady = 0 // live counts are not stored
	if diff := cmp.Diff(&want, got); diff != "" {
		t.Errorf("rollout (-want +got):\n%s", diff)
	}
	vs, err := s.Versions("chat")
	must(t, err)
	if len(vs) != 2 || vs[0].Number != 1 || vs[0].LaunchedAs != 1 || vs[1].Task.Run != "serve v2" || vs[1].Task.Secrets["K"] != "v2-secret" {
		t.Errorf("versions = %+v", vs)
	}
	must(t, s.DeleteService("chat"))
	if vs, _ := s.Versions("chat"); len(vs) != 0 {
		t.Errorf("versions left after delete: %d", len(vs))
	}
	if r, _ := s.Rollout("chat"); r != nil {
		t.Errorf("rollout left after delete: %+v", r)
	}
	// The name can be used again, with its history started afresh.
	must(t, s.CreateService(store.Service{Name: "chat", Version: 1, Task: &configs.Task{Run: "again"}, Port: 30001}))
	if vs, _ := s.Versions("chat"); len(vs) != 1 || vs[0].Task.Run != "again" {
		t.Errorf("versions of the re-created service = %+v", vs)
	}
}

func testJobsRoundTrip(t *testing.T, open Opener) {
	s := open(t)
	task := &configs.Task{Name: "train", NumNodes: 2, Run: "train", Secrets: map[string]string{"HF_TOKEN": "hf_x"}}
	j := jobs.Job{Name: "train", Task: task, State: jobs.Pending, Priority: 700, SubmittedAt: time.Now().Truncate(time.Millisecond)}
	id1, err := s.CreateJob(j)
	must(t, err)
	id2, err := s.CreateJob(j)
	if err != nil || id2 != id1+1 {
		t.Fatalf("ids %d, %d (%v): want consecutive", id1, id2, err)
	}
	j.ID, j.State, j.Nodes = id1, jobs.Running, []jobs.Node{{Rank: 0, InstanceID: "local-train-1"}, {Rank: 1, InstanceID: "local-train-2"}}
	must(t, s.SaveJob(j))
	if err := s.SaveJob(jobs.Job{ID: 99}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("saving an unknown job: %v", err)
	}
	s.Close()
	s = open(t) // a restarted controller
	got, err := s.ListJobs()
	if err != nil || len(got) != 2 {
		t.Fatalf("ListJobs = %v, %v", got, err)
	}
	if got[0].ID != id1 || got[0].State != jobs.Running || len(got[0].Nodes) != 2 || got[0].Task.Secrets["HF_TOKEN"] != "hf_x" || got[0].Priority != 700 {
		t.Errorf("job after restart: %+v", got[0])
	}
	if got[1].ID != id2 || got[1].State != jobs.Pending {
		t.Errorf("second job after restart: %+v", got[1])
	}
}

func testJobIDsUniqueAcrossStores(t *testing.T, open Opener) {
	a, b := open(t), open(t)
	ids := allocateConcurrently(t, func(i int) (int64, error) {
		s := a
		if i%2 == 1 {
			s = b
		}
		return s.CreateJob(jobs.Job{Name: "j", Task: &configs.Task{Run: "x"}, State: jobs.Pending})
	})
	checkDistinct(t, ids, 1)
}

// testReplicaOfMissingServiceRefused: a replica record needs its service. A status write that
// comes after DeleteService (a replica's last transition racing the delete) must not bring a
// record back, which the next service of that name would then adopt; and deleting what is
// gone already is success.
func testReplicaOfMissingServiceRefused(t *testing.T, open Opener) {
	s := open(t)
	rec := replicas.Record{Service: "gone", ID: 1, Version: 1, Status: replicas.StatusReady}
	if err := s.SaveReplica(rec); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("SaveReplica of a service never created: %v, want ErrNotFound", err)
	}
	must(t, s.CreateService(store.Service{Name: "gone", Version: 1, Task: &configs.Task{}, Port: 1}))
	must(t, s.SaveReplica(rec))
	must(t, s.DeleteService("gone"))
	rec.Status = replicas.StatusShuttingDown
	if err := s.SaveReplica(rec); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("SaveReplica after DeleteService: %v, want ErrNotFound", err)
	}
	if _, err := s.NextReplicaIDs("gone", 1); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("NextReplicaID after DeleteService: %v, want ErrNotFound", err)
	}
	must(t, s.DeleteReplica("gone", 1))
	must(t, s.DeleteService("gone"))
	must(t, s.DeleteLeftover("never-put"))
	s.Close()
	s = open(t) // what the next controller reads
	if got, err := s.ListReplicas("gone"); err != nil || len(got) != 0 {
		t.Errorf("records of the deleted service: %+v, %v; want none", got, err)
	}
	must(t, s.CreateService(store.Service{Name: "gone", Version: 1, Task: &configs.Task{}, Port: 1}))
	if got, err := s.ListReplicas("gone"); err != nil || len(got) != 0 {
		t.Errorf("a new service of the same name starts with records %+v, %v; want none", got, err)
	}
}

// testSpotLosses: a service's spot losses and zone ceilings survive a reopen and go with the service; a service
// that is gone has none to save.
func testSpotLosses(t *testing.T, open Opener) {
	s := open(t)
	must(t, s.CreateService(store.Service{Name: "chat", Version: 1, Task: &configs.Task{}, Port: 30001}))
	if l, err := s.Losses("chat"); err != nil || !l.Last.IsZero() || len(l.Gaps) != 0 {
		t.Fatalf("losses of a new service: %+v, %v", l, err)
	}
	var want replicas.Losses
	t0 := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	for i := range 4 {
		want.Lost(t0.Add(time.Duration(i)*20*time.Minute), "us-east-1a")
	}
	want.Capped(t0.Add(time.Hour), "us-east-1a", 3) // a zone's ceiling keeps its spare across a restart
	must(t, s.SaveLosses("chat", want))
	got, err := open(t).Losses("chat")
	must(t, err)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("losses after a reopen (-want +got):\n%s", diff)
	}
	must(t, s.DeleteService("chat"))
	must(t, s.CreateService(store.Service{Name: "chat", Version: 1, Task: &configs.Task{}, Port: 30001}))
	if l, err := s.Losses("chat"); err != nil || !l.Last.IsZero() {
		t.Errorf("a service re-created under the name has losses %+v, %v", l, err)
	}
	if err := s.SaveLosses("nope", want); err != nil {
		t.Errorf("SaveLosses of a missing service: %v", err)
	}
}
