package replicasim

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// benchConfig has no simulated delay, so the benchmark measures the simulator's own cost per
// request: the overhead it adds to every Ferry benchmark that runs on top of it.
func benchConfig() Config {
	cfg := DefaultConfig()
	cfg.TTFT, cfg.PrefillPerToken, cfg.ITL, cfg.ITLPerSeq = 0, 0, 0, 0
	cfg.MaxNumSeqs = 1024
	return cfg
}

var benchBody = []byte(`{"model":"ferry-sim","messages":[{"role":"system","content":"` +
	strings.Repeat("You are a helpful assistant. ", 20) + `"},{"role":"user","content":"Tell me about ferries."}],"max_tokens":64}`)

func BenchmarkChatNonStream(b *testing.B) {
	b.Run("handler", func(b *testing.B) {
		h := NewServer(benchConfig()).Handler()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(benchBody))
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
			}
		})
	})
	b.Run("loopback", func(b *testing.B) {
		_, base := startServer(b, benchConfig())
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}}
		url := base + "/v1/chat/completions"
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := client.Post(url, "application/json", bytes.NewReader(benchBody))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	})
}
