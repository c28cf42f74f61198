package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/internal/sourcecheck"
)

// TestAdminToken: with a token, /metrics answers only to "Authorization: Bearer TOKEN" (the
// scheme in any case), with a Bearer challenge otherwise; /healthz stays open.
func TestAdminToken(t *testing.T) {
	const token = "metrics-token-0123456789"
	_, reg := newTestMetrics(t)
	admin := httptest.NewServer(AdminHandler(reg, token, nil))
	t.Cleanup(admin.Close)
	c := newClient(t)
	tests := map[string]struct {
		path       string
		auth       string
		wantStatus int
	}{
		"no token":              {path: "/metrics", wantStatus: http.StatusUnauthorized},
		"wrong token":           {path: "/metrics", auth: "Bearer metrics-token-0123456780", wantStatus: http.StatusUnauthorized},
		"token prefix":          {path: "/metrics", auth: "Bearer " + token[:10], wantStatus: http.StatusUnauthorized},
		"token with a suffix":   {path: "/metrics", auth: "Bearer " + token + "x", wantStatus: http.StatusUnauthorized},
		"basic scheme":          {path: "/metrics", auth: "Basic " + token, wantStatus: http.StatusUnauthorized},
		"bare token":            {path: "/metrics", auth: token, wantStatus: http.StatusUnauthorized},
		"empty bearer":          {path: "/metrics", auth: "Bearer ", wantStatus: http.StatusUnauthorized},
		"bearer":                {path: "/metrics", auth: "Bearer " + token, wantStatus: http.StatusOK},
		"scheme is case-blind":  {path: "/metrics", auth: "bearer " + token, wantStatus: http.StatusOK},
		"healthz without token": {path: "/healthz", wantStatus: http.StatusOK},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var headers []string
			if tc.auth != "" {
				headers = []string{"Authorization", tc.auth}
			}
			res := do(t, c, http.MethodGet, admin.URL+tc.path, nil, headers...)
			if res.status != tc.wantStatus {
				t.Fatalf("GET %s with %q: %d, want %d", tc.path, tc.auth, res.status, tc.wantStatus)
			}
			if res.status == http.StatusUnauthorized {
				if got := res.header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
					t.Errorf("WWW-Authenticate = %q", got)
				}
				if strings.Contains(res.body, "go_goroutines") || strings.Contains(res.body, token) {
					t.Errorf("401 body leaks: %q", res.body)
				}
			}
		})
	}
}

// TestSecretComparesAreConstantTime guards the shape of the API key and admin token checks,
// which no timing test can pin down reliably: crypto/subtle over every hash, never == or
// bytes.Equal, so the time taken says nothing about which key, or how much of one, matched.
func TestSecretComparesAreConstantTime(t *testing.T) {
	sourcecheck.ConstantTimeCompare(t, "auth.go", "match")
	sourcecheck.ConstantTimeCompare(t, "admin.go", "requireBearer")
}

// /readyz follows a Readiness: starting, ready, draining; without one it is always ready.
func TestAdminReadiness(t *testing.T) {
	reg, _, err := NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	ready := new(Readiness)
	admin := httptest.NewServer(AdminHandler(reg, "secret-token-0123456789", ready))
	defer admin.Close()
	always := httptest.NewServer(AdminHandler(reg, "", nil))
	defer always.Close()
	check := func(url string, wantCode int, wantBody string) {
		t.Helper()
		resp, err := http.Get(url + "/readyz") // open, like /healthz: probes send no token
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != wantCode || string(body) != wantBody {
			t.Errorf("/readyz: %d %q, want %d %q", resp.StatusCode, body, wantCode, wantBody)
		}
	}
	check(admin.URL, http.StatusServiceUnavailable, "starting\n")
	ready.Ready()
	check(admin.URL, http.StatusOK, "ready\n")
	ready.Drain()
	check(admin.URL, http.StatusServiceUnavailable, "draining\n")
	ready.Ready() // never ready again once draining
	check(admin.URL, http.StatusServiceUnavailable, "draining\n")
	check(always.URL, http.StatusOK, "ready\n")
}
