package store

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/replicas"
	"github.com/google/go-cmp/cmp"
)

func openTemp(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ferry.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func TestServiceRoundTripAndPermissions(t *testing.T) {
	s, path := openTemp(t)
	task := &configs.Task{Name: "chat", Run: "serve", Secrets: map[string]string{"HF_TOKEN": "hf_x"},
		Service: &configs.Service{Port: 8080, ReplicaPolicy: configs.ReplicaPolicy{MinReplicas: 2, MaxReplicas: 2}}}
	if err := s.CreateService(Service{Name: "chat", Version: 1, Task: task, Port: 30001, Status: "CONTROLLER_INIT"}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateService(Service{Name: "chat", Version: 1, Task: task, Port: 30002}); err == nil {
		t.Fatal("duplicate service name accepted")
	}
	if err := s.SetServiceStatus("chat", "READY"); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetService("chat")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(task, got.Task); diff != "" {
		t.Errorf("task (-want +got):\n%s", diff)
	}
	if got.Port != 30001 || got.Status != "READY" || got.Version != 1 {
		t.Errorf("got %+v", got)
	}
	if _, err := s.GetService("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetService(nope) = %v, want ErrNotFound", err)
	}
	if err := s.SetServiceStatus("nope", "READY"); !errors.Is(err, ErrNotFound) {
		t.Errorf("SetServiceStatus(nope) = %v, want ErrNotFound", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("store file mode %o, want 600 (it holds secrets)", perm)
	}
}

func TestReplicaIDsAreNeverReused(t *testing.T) {
	s, _ := openTemp(t)
	if err := s.CreateService(Service{Name: "a", Version: 1, Task: &configs.Task{}, Port: 1}); err != nil {
		t.Fatal(err)
	}
	var ids []int
	for range 3 {
		id, err := s.NextReplicaID("a")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if diff := cmp.Diff([]int{1, 2, 3}, ids); diff != "" {
		t.Errorf("ids (-want +got):\n%s", diff)
	}
	// An adopted replica with a higher id moves the counter past it.
	if err := s.SaveReplica(replicas.Record{Service: "a", ID: 10, Version: 1, Status: replicas.StatusStarting}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteReplica("a", 10); err != nil {
		t.Fatal(err)
	}
	id, err := s.NextReplicaID("a")
	if err != nil {
		t.Fatal(err)
	}
	if id != 11 {
		t.Errorf("after adopting id 10, next id = %d, want 11", id)
	}
	if _, err := s.NextReplicaID("missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("NextReplicaID(missing) = %v, want ErrNotFound", err)
	}
}

func TestReplicaRecords(t *testing.T) {
	s, _ := openTemp(t)
	if err := s.CreateService(Service{Name: "a", Version: 1, Task: &configs.Task{}, Port: 1}); err != nil {
		t.Fatal(err)
	}
	launched := time.UnixMilli(time.Now().UnixMilli())
	r := replicas.Record{Service: "a", ID: 2, Version: 1, Status: replicas.StatusStarting, InstanceID: "local-a-2",
		Endpoint: "127.0.0.1:4000", Infra: "local", LaunchedAt: launched}
	if err := s.SaveReplica(r); err != nil {
		t.Fatal(err)
	}
	r.Status = replicas.StatusReady
	r.ReadyAt = launched.Add(time.Second)
	if err := s.SaveReplica(r); err != nil {
		t.Fatal(err)
	}
	r1 := replicas.Record{Service: "a", ID: 1, Version: 1, Status: replicas.StatusFailed, Reason: "exit status 1"}
	if err := s.SaveReplica(r1); err != nil {
		t.Fatal(err)
	}
	got, err := s.ListReplicas("a")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]replicas.Record{r1, r}, got); diff != "" {
		t.Errorf("replicas (-want +got):\n%s", diff)
	}
	if err := s.DeleteService("a"); err != nil {
		t.Fatal(err)
	}
	got, err = s.ListReplicas("a")
	if err != nil || len(got) != 0 {
		t.Errorf("after DeleteService: %v, %v", got, err)
	}
}

func TestReopenKeepsState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ferry.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateService(Service{Name: "a", Version: 3, Task: &configs.Task{Run: "x"}, Port: 30005, Status: "READY"}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	list, err := s.ListServices()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Port != 30005 || list[0].Version != 3 || list[0].Task.Run != "x" {
		t.Errorf("after reopen: %+v", list)
	}
}

func TestVersionsAndRollouts(t *testing.T) {
	s, path := openTemp(t)
	v1 := &configs.Task{Run: "serve v1", Service: &configs.Service{Port: 8080}}
	v2 := &configs.Task{Run: "serve v2", Service: &configs.Service{Port: 8080}}
	if err := s.CreateService(Service{Name: "chat", Version: 1, Task: v1, Port: 30001, Status: "READY"}); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Rollout("chat"); err != nil || r != nil {
		t.Fatalf("Rollout before any update = %v, %v; want nil, nil", r, err)
	}
	if got, _ := s.GetService("chat"); got.Target != -1 {
		t.Errorf("target before any decision = %d, want -1", got.Target)
	}
	if err := s.SetTarget("chat", 3); err != nil {
		t.Fatal(err)
	}
	started := time.UnixMilli(time.Now().UnixMilli()).UTC()
	r := replicas.Rollout{From: 1, To: 2, Mode: configs.UpdateRolling, State: replicas.RolloutInProgress, FromServed: true,
		Policy: configs.DefaultUpdate(), StartedAt: started, ProgressAt: started, NewReady: 7}
	if err := s.StartUpdate("chat", replicas.Version{Number: 2, Task: v2, LaunchedAs: 2}, r); err != nil {
		t.Fatal(err)
	}
	if err := s.StartUpdate("chat", replicas.Version{Number: 2, Task: v2, LaunchedAs: 2}, r); err == nil {
		t.Error("a second version 2 was accepted")
	}
	svc, err := s.GetService("chat")
	if err != nil {
		t.Fatal(err)
	}
	if svc.Version != 2 || svc.Task.Run != "serve v2" || svc.Target != 3 {
		t.Errorf("service after update start: version %d, run %q, target %d; want 2, serve v2, 3", svc.Version, svc.Task.Run, svc.Target)
	}

	// A rollback makes the old version current again, in the same write.
	r.State = replicas.RolloutRolledBack
	r.Reason = "replica 3 of version 2: FAILED"
	if err := s.SaveRollout("chat", r); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2, err := Open(path) // what a restarted controller reads
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	svc, _ = s2.GetService("chat")
	if svc.Version != 1 || svc.Task.Run != "serve v1" {
		t.Errorf("service after rollback: version %d, run %q; want 1, serve v1", svc.Version, svc.Task.Run)
	}
	got, err := s2.Rollout("chat")
	if err != nil {
		t.Fatal(err)
	}
	want := r
	want.NewReady = 0 // live counts are not stored
	if diff := cmp.Diff(&want, got); diff != "" {
		t.Errorf("rollout (-want +got):\n%s", diff)
	}
	vs, err := s2.Versions("chat")
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 2 || vs[0].Number != 1 || vs[0].LaunchedAs != 1 || vs[1].Task.Run != "serve v2" {
		t.Errorf("versions = %+v", vs)
	}
	if err := s2.DeleteService("chat"); err != nil {
		t.Fatal(err)
	}
	if vs, _ := s2.Versions("chat"); len(vs) != 0 {
		t.Errorf("versions left after delete: %d", len(vs))
	}
	if r, _ := s2.Rollout("chat"); r != nil {
		t.Errorf("rollout left after delete: %+v", r)
	}
}

func TestMigratesStoreWithoutTargetColumn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Exec(`ALTER TABLE services DROP COLUMN target`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(path)
	if err != nil {
		t.Fatalf("open a store from before the target column: %v", err)
	}
	defer s.Close()
	if err := s.SetTarget("x", 1); err != nil {
		t.Fatal(err)
	}
}

func TestJobsRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ferry.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	task := &configs.Task{Name: "train", NumNodes: 2, Run: "train", Secrets: map[string]string{"HF_TOKEN": "hf_x"}}
	j := jobs.Job{Name: "train", Task: task, State: jobs.Pending, Priority: 700, SubmittedAt: time.Now().Truncate(time.Millisecond)}
	id1, err := s.CreateJob(j)
	if err != nil {
		t.Fatal(err)
	}
	id2, err := s.CreateJob(j)
	if err != nil || id2 != id1+1 {
		t.Fatalf("ids %d, %d (%v): want consecutive", id1, id2, err)
	}
	j.ID, j.State, j.Nodes = id1, jobs.Running, []jobs.Node{{Rank: 0, InstanceID: "local-train-1"}, {Rank: 1, InstanceID: "local-train-2"}}
	if err := s.SaveJob(j); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveJob(jobs.Job{ID: 99}); !errors.Is(err, ErrNotFound) {
		t.Errorf("saving an unknown job: %v", err)
	}
	s.Close()
	s, err = Open(path) // a restarted controller
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.ListJobs()
	if err != nil || len(got) != 2 {
		t.Fatalf("ListJobs = %v, %v", got, err)
	}
	if got[0].ID != id1 || got[0].State != jobs.Running || len(got[0].Nodes) != 2 || got[0].Task.Secrets["HF_TOKEN"] != "hf_x" || got[0].Priority != 700 {
		t.Errorf("job after restart: %+v", got[0])
	}
}
