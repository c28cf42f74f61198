package replicas

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/configs"
)

// seenRequest is what a probe target saw.
type seenRequest struct {
	Method, Path, ContentType, Auth, Body, Host string
}

func TestProbeReplica(t *testing.T) {
	tests := map[string]struct {
		probe    configs.Probe
		status   int
		delay    time.Duration
		wantSeen seenRequest
		wantErr  string
	}{
		"GET the path": {
			probe:    configs.Probe{Path: "/health", TimeoutSeconds: 5},
			status:   http.StatusOK,
			wantSeen: seenRequest{Method: "GET", Path: "/health"},
		},
		"empty path is /": {
			probe:    configs.Probe{},
			status:   http.StatusOK,
			wantSeen: seenRequest{Method: "GET", Path: "/"},
		},
		"post_data makes a JSON POST with headers": {
			probe: configs.Probe{Path: "/v1/completions", TimeoutSeconds: 5, PostData: `{"prompt":"hi","max_tokens":1}`,
				Headers: map[string]string{"Authorization": "Bearer tok", "Host": "example.internal"}},
			status: http.StatusOK,
			wantSeen: seenRequest{Method: "POST", Path: "/v1/completions", ContentType: "application/json",
				Auth: "Bearer tok", Body: `{"prompt":"hi","max_tokens":1}`, Host: "example.internal"},
		},
		"only 200 is ready": {
			probe:    configs.Probe{Path: "/", TimeoutSeconds: 5},
			status:   http.StatusNoContent,
			wantSeen: seenRequest{Method: "GET", Path: "/"},
			wantErr:  "GET /: HTTP 204",
		},
		"server error": {
			probe:    configs.Probe{Path: "/", TimeoutSeconds: 5},
			status:   http.StatusServiceUnavailable,
			wantSeen: seenRequest{Method: "GET", Path: "/"},
			wantErr:  "HTTP 503",
		},
		"timeout": {
			probe:    configs.Probe{Path: "/slow", TimeoutSeconds: 1},
			status:   http.StatusOK,
			delay:    3 * time.Second,
			wantSeen: seenRequest{Method: "GET", Path: "/slow"},
			wantErr:  "no response within 1s",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			seen := make(chan seenRequest, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				s := seenRequest{Method: r.Method, Path: r.URL.Path, ContentType: r.Header.Get("Content-Type"),
					Auth: r.Header.Get("Authorization"), Body: string(body)}
				if !strings.HasPrefix(r.Host, "127.0.0.1:") {
					s.Host = r.Host // overridden by a Host probe header
				}
				seen <- s
				select {
				case <-time.After(tc.delay):
				case <-r.Context().Done():
				}
				w.WriteHeader(tc.status)
			}))
			defer srv.Close()
			start := time.Now()
			err := probeReplica(context.Background(), newProbeClient(), srv.Listener.Addr().String(), tc.probe)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("probe error = %v, want ready", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("probe error = %v, want one containing %q", err, tc.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "tok") {
				t.Errorf("probe error %q leaks a header value", err)
			}
			if tc.delay > 0 && time.Since(start) >= tc.delay {
				t.Errorf("probe took %v, the timeout did not cut it short", time.Since(start))
			}
			if diff := cmp.Diff(tc.wantSeen, <-seen); diff != "" {
				t.Errorf("request mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestProbeConnectionRefused(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := srv.Listener.Addr().String()
	srv.Close()
	if err := probeReplica(context.Background(), newProbeClient(), addr, configs.Probe{Path: "/"}); err == nil {
		t.Fatal("probe of a closed port succeeded")
	}
}

func TestNextProbeDelay(t *testing.T) {
	interval := 2 * time.Second
	var got []time.Duration
	d := time.Duration(0)
	for range 6 {
		d = nextProbeDelay(d, interval, false)
		got = append(got, d)
	}
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 2 * time.Second, 2 * time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("startup delays mismatch (-want +got):\n%s", diff)
	}
	if got := nextProbeDelay(250*time.Millisecond, interval, true); got != interval {
		t.Errorf("after ready = %v, want %v", got, interval)
	}
}
