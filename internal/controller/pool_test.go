package controller

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/replicas"
)

// A prefill pool's records live with the service's under negated ids: ids never repeat across
// the pools, each manager lists only its own, and they go when the service goes.
func TestPoolRecordsBesideTheService(t *testing.T) {
	st, err := store.OpenSQLite(filepath.Join(t.TempDir(), "ferry.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	task := &configs.Task{Run: "serve", Service: &configs.Service{}}
	if err := st.CreateService(store.Service{Name: "pd", Version: 1, Task: task, Port: 30001, Status: "READY", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	pool, decode := poolStore{inner: st, service: "pd"}, decodeStore{st}
	ids := map[int]bool{}
	for _, s := range []replicas.Store{decode, pool, decode, pool} {
		name := "pd"
		if _, isPool := s.(poolStore); isPool {
			name = poolName("pd")
		}
		id, err := s.NextReplicaIDs(name, 1)
		if err != nil {
			t.Fatal(err)
		}
		if ids[id] {
			t.Fatalf("id %d handed out twice across the pools", id)
		}
		ids[id] = true
		if err := s.SaveReplica(replicas.Record{Service: name, ID: id, Version: 1, Status: replicas.StatusReady}); err != nil {
			t.Fatal(err)
		}
	}
	own, err := decode.ListReplicas("pd")
	if err != nil || len(own) != 2 || own[0].ID != 1 || own[1].ID != 3 {
		t.Fatalf("decode records %+v (%v), want ids 1 and 3", own, err)
	}
	pooled, err := pool.ListReplicas(poolName("pd"))
	if err != nil || len(pooled) != 2 || pooled[0].Service != "pd-prefill" {
		t.Fatalf("pool records %+v (%v), want 2 named pd-prefill", pooled, err)
	}
	if err := pool.DeleteReplica(poolName("pd"), pooled[0].ID); err != nil {
		t.Fatal(err)
	}
	if left, _ := pool.ListReplicas(poolName("pd")); len(left) != 1 {
		t.Fatalf("after a delete: %+v", left)
	}
	if err := st.DeleteService("pd"); err != nil {
		t.Fatal(err)
	}
	if left, _ := st.ListReplicas("pd"); len(left) != 0 {
		t.Fatalf("records outlived their service: %+v", left)
	}
}

func TestPoolNamesDoNotCollide(t *testing.T) {
	c := &Controller{services: map[string]*service{
		"chat": {name: "chat", pool: &pool{name: poolName("chat")}},
		"api":  {name: "api"},
	}}
	for name, wantErr := range map[string]bool{"chat-prefill": true, "api": false, "other": false} {
		if err := c.poolNameTaken(name); (err != nil) != wantErr {
			t.Errorf("%s: %v", name, err)
		}
	}
	c.services["x-prefill"] = &service{name: "x-prefill"}
	if err := c.poolNameTaken("x"); err == nil {
		t.Error("x: its pool would be named as service x-prefill")
	}
}
