package controller

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/launcher"
)

// TestStartMetrics covers the metrics listener's address rules: off, a free address, the default
// address taken (run without it, warned) and a chosen address taken (fail).
func TestStartMetrics(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	// The default address is taken by this test, or already by someone else: either way in use.
	if ln, err := net.Listen("tcp", DefaultMetricsAddr); err == nil {
		defer ln.Close()
	} else if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("taking %s: %v", DefaultMetricsAddr, err)
	}

	tests := map[string]struct {
		addr        string
		wantServing bool
		wantWarning bool
		wantErr     string
	}{
		"empty":              {addr: ""},
		"off":                {addr: ListenerOff},
		"free address":       {addr: "127.0.0.1:0", wantServing: true},
		"default taken":      {addr: DefaultMetricsAddr, wantWarning: true},
		"chosen taken":       {addr: taken.Addr().String(), wantErr: "metrics listen on " + taken.Addr().String()},
		"chosen unparseable": {addr: "127.0.0.1", wantErr: "metrics listen on 127.0.0.1"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			c := New(Options{MetricsAddr: tc.addr, Logger: zap.New(core)})
			if err := c.initMetrics(); err != nil {
				t.Fatal(err)
			}
			err := c.startMetrics()
			defer c.stopMetrics()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("startMetrics error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if warned := logs.FilterMessageSnippet("metrics address in use").Len() > 0; warned != tc.wantWarning {
				t.Errorf("warned %v, want %v", warned, tc.wantWarning)
			}
			url := c.Status().Metrics
			if !tc.wantServing {
				if url != "" {
					t.Errorf("status shows metrics at %q, want none", url)
				}
				return
			}
			if !strings.HasPrefix(url, "http://127.0.0.1:") || !strings.HasSuffix(url, "/metrics") {
				t.Fatalf("status shows metrics at %q", url)
			}
			client := &http.Client{Timeout: 5 * time.Second}
			resp, err := client.Get(url)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "\ngo_goroutines ") {
				t.Errorf("GET %s: %d\n%s", url, resp.StatusCode, body)
			}
		})
	}
}

// TestStopMetricsClosesListener: once the controller stops, its metrics address is free again.
func TestStopMetricsClosesListener(t *testing.T) {
	c := New(Options{MetricsAddr: "127.0.0.1:0"})
	if err := c.initMetrics(); err != nil {
		t.Fatal(err)
	}
	if err := c.startMetrics(); err != nil {
		t.Fatal(err)
	}
	c.stopMetrics()
	ln, err := net.Listen("tcp", c.metricsAddr)
	if err != nil {
		t.Fatalf("metrics address still bound after stopMetrics: %v", err)
	}
	ln.Close()
}

// TestMetricsToken: with MetricsToken the controller's /metrics needs it as a bearer token,
// while /healthz stays open for liveness probes.
func TestMetricsToken(t *testing.T) {
	const token = "controller-metrics-token-0123"
	c := New(Options{MetricsAddr: "127.0.0.1:0", MetricsToken: token})
	if err := c.initMetrics(); err != nil {
		t.Fatal(err)
	}
	if err := c.startMetrics(); err != nil {
		t.Fatal(err)
	}
	defer c.stopMetrics()
	client := &http.Client{Timeout: 5 * time.Second}
	get := func(path, auth string) int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+c.metricsAddr+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		path, auth string
		want       int
	}{
		{"/metrics", "", http.StatusUnauthorized},
		{"/metrics", "Bearer wrong-token-0123456789", http.StatusUnauthorized},
		{"/metrics", "Bearer " + token, http.StatusOK},
		{"/healthz", "", http.StatusOK},
	} {
		if got := get(tc.path, tc.auth); got != tc.want {
			t.Errorf("GET %s with %q: %d, want %d", tc.path, tc.auth, got, tc.want)
		}
	}
}

// TestMetricsTokenInHome: with no MetricsToken, a metrics.token in FERRY_HOME protects
// /metrics (the controller the CLI starts gets no flag); a file others may read is tightened to
// 0600, and a short or malformed token stops the controller rather than leave /metrics open.
func TestMetricsTokenInHome(t *testing.T) {
	const token = "home-metrics-token-0123456789"
	tests := map[string]struct {
		content  string // "" writes no file
		mode     os.FileMode
		wantErr  string
		wantOpen bool
	}{
		"no file":         {wantOpen: true},
		"a token":         {content: token + "\n", mode: 0o600},
		"others may read": {content: token, mode: 0o644},
		"short":           {content: "abc123", mode: 0o600, wantErr: "at least 16 characters"},
		"two tokens":      {content: token + " " + token, mode: 0o600, wantErr: "without whitespace"},
		"empty":           {content: "\n", mode: 0o600, wantErr: "at least 16 characters"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := home.Home{Dir: dir}.MetricsTokenPath()
			if tc.content != "" {
				if err := os.WriteFile(path, []byte(tc.content), tc.mode); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(path, tc.mode); err != nil { // past the umask
					t.Fatal(err)
				}
			}
			c := New(Options{MetricsAddr: "127.0.0.1:0", Home: home.Home{Dir: dir}})
			if err := c.initMetrics(); err != nil {
				t.Fatal(err)
			}
			err := c.startMetrics()
			defer c.stopMetrics()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), tc.content) {
					t.Fatalf("startMetrics error = %v, want %q without the file's content", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]int{"": http.StatusUnauthorized, "Bearer " + token: http.StatusOK}
			if tc.wantOpen {
				want[""] = http.StatusOK
			}
			for auth, code := range want {
				if got := getStatus(t, "http://"+c.metricsAddr+"/metrics", auth); got != code {
					t.Errorf("GET /metrics with %q: %d, want %d", auth, got, code)
				}
			}
			if info, err := os.Stat(path); err == nil && info.Mode().Perm() != 0o600 {
				t.Errorf("%s is %v, want 0600", path, info.Mode().Perm())
			}
		})
	}
}

// getStatus is the status of GET url with the Authorization header auth ("" for none).
func getStatus(t *testing.T, url, auth string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestInfraMetrics: the infra series follow the breakers through a scripted outage of gcp
// (three refused calls open its breaker, a zone that does not exist opens the zone's),
// throttling on aws (still up: it answers), leftovers on gcp, and gcp's recovery; the error
// counters only grow. They are scraped through the collector the controller registers.
func TestInfraMetrics(t *testing.T) {
	clock := &scriptedClock{now: time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)}
	c := New(Options{})
	if err := c.initMetrics(); err != nil {
		t.Fatal(err)
	}
	c.provider = newHealthProvisioner(t, clock)
	if err := c.registry.Register(fleetCollector{c}); err != nil {
		t.Fatal(err)
	}
	names := []string{"ferry_infra_up", "ferry_infra_errors_total", "ferry_infra_leftovers"}
	expect := func(step, body string) {
		t.Helper()
		head := `# HELP ferry_infra_errors_total Failed calls to an infra by class: timeout, unavailable, throttled, unauthorized, not_found, capacity, quota, invalid, other.
# TYPE ferry_infra_errors_total counter
# HELP ferry_infra_leftovers Instances (or selectors over an infra that could not be listed) that a teardown could not stop, which Ferry stops when the infra answers again.
# TYPE ferry_infra_leftovers gauge
# HELP ferry_infra_up Whether calls to an infra (zone "") or to one of its zones or regions go: 1 up or throttled, 0 down (its breaker open).
# TYPE ferry_infra_up gauge
`
		if err := testutil.GatherAndCompare(c.registry, strings.NewReader(head+body), names...); err != nil {
			t.Errorf("%s: %v", step, err)
		}
	}

	expect("every infra known, none failed", `ferry_infra_leftovers{infra="aws"} 0
ferry_infra_leftovers{infra="gcp"} 0
ferry_infra_leftovers{infra="local"} 0
ferry_infra_up{infra="aws",zone=""} 1
ferry_infra_up{infra="gcp",zone=""} 1
ferry_infra_up{infra="local",zone=""} 1
`)

	h := c.provider.Health()
	refused := fmt.Errorf("%w: connection refused", launcher.ErrUnavailable)
	clock.Add(time.Second)
	for range 3 {
		h.Observe("gcp", "", refused)
		h.Observe("gcp", "us-central1-f", fmt.Errorf("zone us-central1-f: %w", launcher.ErrNotFound))
	}
	h.Observe("aws", "", fmt.Errorf("%w: RequestLimitExceeded", launcher.ErrThrottled))
	for _, id := range []string{"gcp/us-central1-a/chat-1", "gcp/us-central1-a/chat-2"} {
		if err := c.provider.LeaveBehind(launcher.Leftover{Infra: "gcp", InstanceID: id, Owner: "service chat"}); err != nil {
			t.Fatal(err)
		}
	}
	expect("gcp down, aws throttled, two left on gcp", `ferry_infra_errors_total{class="not_found",infra="gcp"} 3
ferry_infra_errors_total{class="throttled",infra="aws"} 1
ferry_infra_errors_total{class="unavailable",infra="gcp"} 3
ferry_infra_leftovers{infra="aws"} 0
ferry_infra_leftovers{infra="gcp"} 2
ferry_infra_leftovers{infra="local"} 0
ferry_infra_up{infra="aws",zone=""} 1
ferry_infra_up{infra="gcp",zone=""} 0
ferry_infra_up{infra="gcp",zone="us-central1-f"} 0
ferry_infra_up{infra="local",zone=""} 1
`)

	clock.Add(10 * time.Second)
	h.Observe("gcp", "", nil) // a probe answered
	expect("gcp answers again", `ferry_infra_errors_total{class="not_found",infra="gcp"} 3
ferry_infra_errors_total{class="throttled",infra="aws"} 1
ferry_infra_errors_total{class="unavailable",infra="gcp"} 3
ferry_infra_leftovers{infra="aws"} 0
ferry_infra_leftovers{infra="gcp"} 2
ferry_infra_leftovers{infra="local"} 0
ferry_infra_up{infra="aws",zone=""} 1
ferry_infra_up{infra="gcp",zone=""} 1
ferry_infra_up{infra="gcp",zone="us-central1-f"} 0
ferry_infra_up{infra="local",zone=""} 1
`)
}
