package proxy

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestAuthFailuresAreRateLimited: an address that keeps presenting wrong keys gets 429 with
// Retry-After, its connection closed, once past a burst of 401s, while a valid key from the
// same address still passes. 401s used to be answered without limit.
func TestAuthFailuresAreRateLimited(t *testing.T) {
	const good = "sk-ferry-0123456789abcdef"
	u := startUpstream(t, "a", okHandler)
	_, base := startProxy(t, ServiceConfig{APIKeyHashes: []string{hashKey(good)}}, backendsOf(u)...)
	addr := strings.TrimPrefix(base, "http://")
	var unauthorized, limited int
	for range authFailureBurst + 10 {
		conn, br := headersOnly(t, addr, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-ferry-guess-000000000\r\nContent-Length: 2\r\n\r\n{}")
		resp := answerWithin(t, conn, br, 5*time.Second)
		_ = conn.Close()
		switch resp.StatusCode {
		case http.StatusUnauthorized:
			unauthorized++
		case http.StatusTooManyRequests:
			limited++
			if resp.Header.Get("Retry-After") == "" || !resp.Close {
				t.Errorf("429 with Retry-After %q, close %v", resp.Header.Get("Retry-After"), resp.Close)
			}
		default:
			t.Fatalf("a wrong key got %d", resp.StatusCode)
		}
	}
	if unauthorized > authFailureBurst+1 || limited == 0 {
		t.Errorf("%d answered 401 and %d 429; want at most a burst of %d 401s", unauthorized, limited, authFailureBurst)
	}
	res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{}`), "Authorization", "Bearer sk-ferry-guess-000000000")
	if e := decodeError(t, res.body); res.status != 429 || e.Error.Type != "rate_limit_error" {
		t.Errorf("a wrong key past the burst: %d %+v", res.status, e)
	}
	if res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{}`), "Authorization", "Bearer "+good); res.status != 200 {
		t.Errorf("the right key from the same address: %d %s", res.status, res.body)
	}
}

// TestAuthFailuresDoNotCrowdOutAccessLog: 401s are sampled apart from the other access log
// lines, so a flood of wrong keys cannot use up the second's budget of lines and hide the
// requests that were served. They used to share it.
func TestAuthFailuresDoNotCrowdOutAccessLog(t *testing.T) {
	const good = "sk-ferry-0123456789abcdef"
	u := startUpstream(t, "a", okHandler)
	accessLog, logs := observedAccessLog()
	_, base := startProxy(t, ServiceConfig{APIKeyHashes: []string{hashKey(good)}, AccessLog: accessLog}, backendsOf(u)...)
	var wg sync.WaitGroup
	for range 8 {
		c := newClient(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range accessLogFirst/4 + 1 {
				req, _ := http.NewRequest(http.MethodGet, base+"/v1/models", nil)
				if resp, err := c.Do(req); err == nil {
					resp.Body.Close()
				}
			}
		}()
	}
	wg.Wait()
	res := do(t, newClient(t), http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{}`), "Authorization", "Bearer "+good, "X-Request-Id", "the-served-one")
	if res.status != 200 {
		t.Fatalf("the keyed request: %d %s", res.status, res.body)
	}
	waitFor(t, "the keyed request's line", func() bool {
		for _, e := range logs.All() {
			if e.ContextMap()["request_id"] == "the-served-one" {
				return true
			}
		}
		return false
	})
}
