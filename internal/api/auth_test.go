package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/ferryserve/ferry/internal/home"
)

// countingBackend answers every route and counts the calls that reached it.
type countingBackend struct {
	calls   atomic.Int64
	logPath string
}

func (b *countingBackend) hit() { b.calls.Add(1) }

func (b *countingBackend) CreateService(context.Context, CreateServiceRequest) (ServiceStatus, error) {
	b.hit()
	return ServiceStatus{}, nil
}
func (b *countingBackend) Services([]string) ([]ServiceStatus, error) { b.hit(); return nil, nil }
func (b *countingBackend) DeleteService(context.Context, string) (DeleteServiceResult, error) {
	b.hit()
	return DeleteServiceResult{}, nil
}
func (b *countingBackend) UpdateService(context.Context, string, UpdateServiceRequest) (ServiceStatus, error) {
	b.hit()
	return ServiceStatus{}, nil
}
func (b *countingBackend) ReplicaLogPath(string, int) (string, error) { b.hit(); return b.logPath, nil }
func (b *countingBackend) ControllerLogPath() string                  { b.hit(); return b.logPath }
func (b *countingBackend) Status() ControllerStatus                   { b.hit(); return ControllerStatus{} }
func (b *countingBackend) Infras() InfraHealth                        { b.hit(); return InfraHealth{} }
func (b *countingBackend) Stop()                                      { b.hit() }

var _ Backend = (*countingBackend)(nil)

// extraRoutes stand for the routes another package adds (proxy/attach's two, whose paths they
// take); they count as the backend's calls.
func (b *countingBackend) extraRoutes() []Route {
	hit := func(w http.ResponseWriter, _ *http.Request) { b.hit(); w.WriteHeader(http.StatusNoContent) }
	return []Route{
		{Method: http.MethodGet, Pattern: "/v1/services/{name}/replicaset", Handler: hit, Scope: ScopeAttach},
		{Method: http.MethodPost, Pattern: "/v1/services/{name}/proxyload", Handler: hit, Scope: ScopeAttach},
	}
}

// TestEveryRouteRequiresToken sends every route of the API (the list NewHandler serves, so a
// route added later is covered) with no token, a wrong one, another FERRY_HOME's, and other
// near misses: each gets 401 and reaches nothing. Only the token itself gets through.
func TestEveryRouteRequiresToken(t *testing.T) {
	homeA, homeB := home.Home{Dir: t.TempDir()}, home.Home{Dir: t.TempDir()}
	token, err := homeA.Token()
	if err != nil {
		t.Fatal(err)
	}
	otherToken, err := homeB.Token()
	if err != nil {
		t.Fatal(err)
	}
	if token == otherToken {
		t.Fatal("two FERRY_HOMEs got the same token")
	}
	logPath := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(logPath, []byte("line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := &countingBackend{logPath: logPath}
	srv := httptest.NewServer(NewHandler(b, Tokens{Full: token}, zaptest.NewLogger(t), b.extraRoutes()...)) // loopback
	t.Cleanup(srv.Close)

	refused := map[string]func(*http.Request){
		"no token":              func(*http.Request) {},
		"wrong token":           func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+strings.Repeat("0", len(token))) },
		"other home's token":    func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+otherToken) },
		"token prefix":          func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token[:len(token)-1]) },
		"token with a suffix":   func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token+"0") },
		"token without scheme":  func(r *http.Request) { r.Header.Set("Authorization", token) },
		"basic auth":            func(r *http.Request) { r.SetBasicAuth("ferry", token) },
		"token in the query":    func(r *http.Request) { r.URL.RawQuery = "token=" + token + "&access_token=" + token },
		"token in another head": func(r *http.Request) { r.Header.Set("X-Ferry-Token", token) },
	}
	type target struct{ method, path string }
	var targets []target
	for _, r := range (&server{}).routes(b.extraRoutes()) {
		path := strings.NewReplacer("{name}", "llama", "{id}", "1").Replace(r.Pattern)
		targets = append(targets, target{r.Method, path})
	}
	if len(targets) < 10 {
		t.Fatalf("only %d routes listed", len(targets))
	}
	// A path no route serves is refused too, so the API's shape cannot be probed without the
	// token.
	targets = append(targets, target{http.MethodGet, "/v1/nonexistent"}, target{http.MethodGet, "/"})

	send := func(tg target, edit func(*http.Request)) (int, string) {
		req, err := http.NewRequest(tg.method, srv.URL+tg.path, strings.NewReader(`{"proxy_id":"p"}`))
		if err != nil {
			t.Fatal(err)
		}
		edit(req)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body.Error.Code
	}
	for _, tg := range targets {
		for name, edit := range refused {
			if code, kind := send(tg, edit); code != http.StatusUnauthorized || kind != "unauthorized" {
				t.Errorf("%s %s with %s: HTTP %d %q, want 401 unauthorized", tg.method, tg.path, name, code, kind)
			}
		}
	}
	if n := b.calls.Load(); n != 0 {
		t.Fatalf("%d refused requests reached the controller", n)
	}
	for _, tg := range targets[:len(targets)-2] {
		code, _ := send(tg, func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token) })
		if code == http.StatusUnauthorized {
			t.Errorf("%s %s with the token: 401", tg.method, tg.path)
		}
	}
	if b.calls.Load() == 0 {
		t.Error("no request with the token reached the controller")
	}
}

// TestAttachTokenOnlyFollows: the attach token, which attached proxies hold, reaches the two
// attach routes and nothing else: every other route (creating a service first among them,
// whose `run` would execute anything) answers 403 and reaches nothing. The controller token
// still reaches every route, the attach ones included.
func TestAttachTokenOnlyFollows(t *testing.T) {
	const full, attach = "full-t0ken-0123456789abcdef", "attach-t0ken-0123456789abcdef"
	b := &countingBackend{logPath: filepath.Join(t.TempDir(), "log")}
	if err := os.WriteFile(b.logPath, []byte("line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := NewHandler(b, Tokens{Full: full, Attach: attach}, zaptest.NewLogger(t), b.extraRoutes()...)
	send := func(r Route, token string) int {
		path := strings.NewReplacer("{name}", "llama", "{id}", "1").Replace(r.Pattern)
		req := httptest.NewRequest(r.Method, path, strings.NewReader(`{"proxy_id":"p"}`))
		req.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	attachRoutes := 0
	for _, r := range (&server{}).routes(b.extraRoutes()) {
		before := b.calls.Load()
		code := send(r, attach)
		switch {
		case r.Scope == ScopeAttach:
			attachRoutes++
			if code == http.StatusUnauthorized || code == http.StatusForbidden || b.calls.Load() == before {
				t.Errorf("%s %s with the attach token: HTTP %d, want it served", r.Method, r.Pattern, code)
			}
		case code != http.StatusForbidden || b.calls.Load() != before:
			t.Errorf("%s %s with the attach token: HTTP %d (reached the controller: %v), want 403", r.Method, r.Pattern, code, b.calls.Load() != before)
		}
		before = b.calls.Load()
		if code := send(r, full); code == http.StatusUnauthorized || code == http.StatusForbidden || b.calls.Load() == before {
			t.Errorf("%s %s with the controller token: HTTP %d, want it served", r.Method, r.Pattern, code)
		}
	}
	if attachRoutes != 2 {
		t.Fatalf("%d attach routes, want 2", attachRoutes)
	}
}

// TestEmptyTokenRefusesEverything: a controller that somehow has no token must not read
// "Bearer " (or nothing) as a match. The handler is called directly, so the header reaches it
// exactly as written.
func TestEmptyTokenRefusesEverything(t *testing.T) {
	b := &countingBackend{}
	h := NewHandler(b, Tokens{}, zaptest.NewLogger(t), b.extraRoutes()...)
	for _, auth := range []string{"", "Bearer", "Bearer ", "Bearer  "} {
		req := httptest.NewRequest(http.MethodGet, "/v1/services", nil)
		if auth != "" {
			req.Header["Authorization"] = []string{auth}
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusUnauthorized {
			t.Errorf("empty server token, Authorization %q: HTTP %d, want 401", auth, w.Code)
		}
	}
	if b.calls.Load() != 0 {
		t.Error("a request reached the controller")
	}
}
