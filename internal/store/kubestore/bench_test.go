package kubestore_test

import (
	"context"
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/internal/store/kubestore"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/replicas"
)

// BenchmarkKubeWrites: what the replica manager's writes cost on the API server; a write
// returns once the store's own cache shows it.
func BenchmarkKubeWrites(b *testing.B) {
	c := testcluster.Shared(b)
	st, err := kubestore.Open(context.Background(), kubestore.Options{Config: c.RESTConfig(), Namespace: newNamespace(b, c),
		Fence: func() (int64, bool) { return 1, true }, Holder: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	if err := st.CreateService(store.Service{Name: "bench", Version: 1, Task: &configs.Task{Run: "x"}, Port: 1}); err != nil {
		b.Fatal(err)
	}
	b.Run("SaveReplica", func(b *testing.B) {
		b.ReportAllocs()
		r := replicas.Record{Service: "bench", ID: 1, Version: 1, Status: replicas.StatusStarting}
		for i := range b.N {
			r.Reason = string(rune('a' + i%26))
			if err := st.SaveReplica(r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("NextReplicaID", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, err := st.NextReplicaIDs("bench", 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ListReplicas", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, err := st.ListReplicas("bench"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkKubeReads: a read of a service with its full task (the status loop's and the
// replica manager's), from the cache; the task's secret values are unsealed on each read.
func BenchmarkKubeReads(b *testing.B) {
	c := testcluster.Shared(b)
	st, err := kubestore.Open(context.Background(), kubestore.Options{Config: c.RESTConfig(), Namespace: newNamespace(b, c),
		Fence: func() (int64, bool) { return 1, true }, Holder: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	task := &configs.Task{Run: "vllm serve", Envs: map[string]string{"MODEL": "m", "HF_TOKEN": "hf_x"}, Secrets: map[string]string{"API_KEY": "k"}}
	if err := st.CreateService(store.Service{Name: "bench", Version: 1, Task: task, Port: 1}); err != nil {
		b.Fatal(err)
	}
	b.Run("GetService", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, err := st.GetService("bench"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
