package proxy

import (
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestModelsBodyIsBounded: a replica's /v1/models answer is read up to maxModelsBody, not
// whatever the replica sends (it used to be read whole, so a broken or hostile replica could make
// the proxy buffer any amount).
func TestModelsBodyIsBounded(t *testing.T) {
	const huge = 16 << 20
	var written atomic.Int64
	done := make(chan struct{}, 1)
	u := startUpstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" {
			okHandler(w, r)
			return
		}
		defer func() { done <- struct{}{} }()
		w.Header().Set("Content-Type", "application/json")
		head := `{"object":"list","data":[{"id":"big-model","object":"model"}],"pad":"`
		n, _ := w.Write([]byte(head))
		written.Add(int64(n))
		pad := []byte(strings.Repeat("x", 64<<10))
		for written.Load() < huge {
			n, err := w.Write(pad)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
		n, _ = w.Write([]byte(`"}`))
		written.Add(int64(n))
	})
	svc, _ := startProxy(t, ServiceConfig{Name: "a"}, backendsOf(u)...)
	svc.watchModels(func() {})
	select {
	case <-done:
	case <-time.After(waitTimeout):
		t.Fatal("the proxy never asked the replica for its models")
	}
	time.Sleep(100 * time.Millisecond) // what parsing a whole answer would take
	if slices.Contains(svc.Models(), "big-model") {
		t.Errorf("the proxy took a %d MiB /v1/models answer (models %v)", written.Load()>>20, svc.Models())
	}
	if written.Load() >= huge {
		t.Errorf("the replica wrote all %d MiB of its answer; the proxy should have stopped reading", written.Load()>>20)
	}
}
