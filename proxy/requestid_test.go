package proxy

import (
	"net/http"
	"strings"
	"testing"
)

// TestClientRequestIDIsBounded: a client's X-Request-Id goes to the replica, the answer and the
// access log only when it is a sane id (at most 128 visible ASCII characters); another one is
// replaced by a generated id. An 8 KiB id used to be forwarded and logged whole.
func TestClientRequestIDIsBounded(t *testing.T) {
	seen := make(chan string, 4)
	u := startUpstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("X-Request-Id")
		okHandler(w, r)
	})
	accessLog, logs := observedAccessLog()
	_, base := startProxy(t, ServiceConfig{AccessLog: accessLog}, backendsOf(u)...)
	tests := map[string]struct {
		id   string
		keep bool
	}{
		"sane":          {id: "req-42_a.b:c", keep: true},
		"at the limit":  {id: strings.Repeat("a", maxClientRequestID), keep: true},
		"7 KiB":         {id: strings.Repeat("a", 7<<10)},
		"with spaces":   {id: "req 42"},
		"non-ASCII":     {id: "req-ünïcode"},
		"just too long": {id: strings.Repeat("a", maxClientRequestID+1)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			logs.TakeAll()
			res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{}`), "X-Request-Id", tc.id)
			if res.status != 200 {
				t.Fatalf("status %d: %s", res.status, res.body)
			}
			upstream := <-seen
			answered := res.header.Get("X-Request-Id")
			lines := waitForLines(t, logs, 1)
			logged, _ := lines[0].ContextMap()["request_id"].(string)
			if tc.keep {
				if upstream != tc.id || answered != tc.id || logged != tc.id {
					t.Errorf("a sane id was replaced: replica %q, answer %q, log %q", upstream, answered, logged)
				}
				return
			}
			if upstream == tc.id || len(upstream) > maxClientRequestID || upstream == "" {
				t.Errorf("the replica got X-Request-Id %q (%d bytes)", upstream[:min(len(upstream), 40)], len(upstream))
			}
			if answered != upstream || logged != upstream {
				t.Errorf("the answer (%q) and the log (%q) do not carry the replica's id %q", answered, logged, upstream)
			}
		})
	}
}
