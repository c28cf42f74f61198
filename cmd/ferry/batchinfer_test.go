package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestBatchInferPriority: batch-infer's requests ask for the batch class unless --priority says
// otherwise, and a 503's Retry-After is waited out before the retry.
func TestBatchInferPriority(t *testing.T) {
	for name, tc := range map[string]struct {
		priority, want string
	}{
		"default":     {"batch", "batch"},
		"sheddable":   {"sheddable", "batch"},
		"interactive": {"interactive", "interactive"},
	} {
		t.Run(name, func(t *testing.T) {
			var mu sync.Mutex
			var got []string
			var shed bool
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				got = append(got, r.Header.Get("X-Ferry-Priority"))
				if !shed {
					shed = true
					w.Header().Set("Retry-After", "1")
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"ok"}}]}`)
			}))
			defer srv.Close()
			dir := t.TempDir()
			in, out := filepath.Join(dir, "in.txt"), filepath.Join(dir, "out.jsonl")
			if err := os.WriteFile(in, []byte("hello\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			f := batchFlags{endpoint: srv.URL, input: in, output: out, model: "m", priority: tc.priority,
				concurrency: 1, maxTokens: 8, timeout: 10 * time.Second}
			if err := batchInfer(context.Background(), f, io.Discard); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 2 || got[0] != tc.want || got[1] != tc.want {
				t.Errorf("x-ferry-priority of the requests = %q, want %q twice (a retry after the 503)", got, tc.want)
			}
		})
	}
	if err := batchInfer(context.Background(), batchFlags{endpoint: "http://x", input: "i", output: "o", priority: "urgent"}, io.Discard); err == nil {
		t.Error("--priority urgent was accepted")
	}
}
