package proxy

import (
	"net/http"
	"strings"
	"testing"
)

// TestStreamClosedBetweenChunksEndsWithErrorEvent: a replica that dies between two SSE events
// closes its connection cleanly (FIN) at a chunk boundary, which fasthttp reads as the end of
// the body. The client must still get the error event, not a stream that just stops.
func TestStreamClosedBetweenChunksEndsWithErrorEvent(t *testing.T) {
	dies := startUpstream(t, "dies", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		sseEvent(w, `{"choices":[{"delta":{"content":"Hel"}}]}`)
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			panic(err)
		}
		_ = buf.Flush()
		_ = conn.Close() // a FIN after a whole chunk, as when the kernel closes a killed process's socket
	})
	svc, base := startProxy(t, ServiceConfig{}, backendsOf(dies)...)
	_, r := openStream(t, newClient(t), base+"/v1/chat/completions")
	if got := readEvent(t, r); !strings.Contains(got, "Hel") {
		t.Fatalf("first event = %q", got)
	}
	expectStreamErrorEvent(t, r)
	waitFor(t, "in-flight back to 0", func() bool { return svc.InFlight() == 0 })
}

// TestStreamEndingNormallyIsNotCut: a chunked stream that ends with its last chunk, on a
// connection the replica then closes, is whole.
func TestStreamEndingNormallyIsNotCut(t *testing.T) {
	ok := startUpstream(t, "ok", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Connection", "close")
		sseEvent(w, `{"choices":[{"delta":{"content":"Hel"}}]}`)
		sseEvent(w, "[DONE]")
	})
	_, base := startProxy(t, ServiceConfig{}, backendsOf(ok)...)
	for range 3 {
		res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{"stream":true}`))
		if res.status != 200 || !strings.HasSuffix(res.body, "data: [DONE]\n\n") || strings.Contains(res.body, "error") {
			t.Fatalf("status %d, body %q: want the whole stream and no error event", res.status, res.body)
		}
	}
}
