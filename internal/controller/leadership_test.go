package controller

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/testhttp"
)

// TestForwarderPinsTheSharedCertificate: a follower forwards to the leader over HTTPS when the
// leader presents the certificate every controller shares (compared whole, not by name), and
// refuses a leader presenting another.
func TestForwarderPinsTheSharedCertificate(t *testing.T) {
	certFile, keyFile := testhttp.WriteSelfSigned(t, t.TempDir())
	otherCert, otherKey := testhttp.WriteSelfSigned(t, t.TempDir())
	for name, tc := range map[string]struct {
		cert, key string
		want      int
	}{
		"the shared certificate": {certFile, keyFile, http.StatusOK},
		"another certificate":    {otherCert, otherKey, http.StatusBadGateway},
	} {
		t.Run(name, func(t *testing.T) {
			pair, err := tls.LoadX509KeyPair(tc.cert, tc.key)
			if err != nil {
				t.Fatal(err)
			}
			leader := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, "leader saw "+r.URL.Path)
			}))
			leader.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
			leader.StartTLS()
			defer leader.Close()
			target, err := url.Parse(leader.URL)
			if err != nil {
				t.Fatal(err)
			}
			c := New(Options{APITLSCert: certFile, Logger: zap.NewNop()})
			req := httptest.NewRequest(http.MethodGet, "/v1/services", nil)
			rec := httptest.NewRecorder()
			c.forwarder().ServeHTTP(rec, req.WithContext(context.WithValue(req.Context(), leaderURLKey{}, target)))
			if rec.Code != tc.want {
				t.Fatalf("HTTP %d (%s), want %d", rec.Code, rec.Body, tc.want)
			}
			if tc.want == http.StatusOK && rec.Body.String() != "leader saw /v1/services" {
				t.Fatalf("body %q", rec.Body)
			}
		})
	}
}

// TestFollowerRoutes: a follower answers its own status, stop and logs, forwards the rest, and
// never forwards an attached proxy's feed.
func TestFollowerRoutes(t *testing.T) {
	tests := map[string]struct{ local, feed bool }{
		"/v1/controller":                 {local: true},
		"/v1/controller/stop":            {local: true},
		"/v1/controller/logs":            {local: true},
		"/v1/services":                   {},
		"/v1/jobs":                       {},
		"/v1/services/a/replicaset":      {feed: true},
		"/v1/services/a/proxyload":       {feed: true},
		"/v1/attach/services":            {feed: true},
		"/v1/attach/load":                {}, // a follower's external metrics ask the leader
		"/v1/services/a/replicas/1/logs": {},
	}
	for path, tc := range tests {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		if got := followerLocal(r); got != tc.local {
			t.Errorf("followerLocal(%s) = %v, want %v", path, got, tc.local)
		}
		if got := attachFeed(r); got != tc.feed {
			t.Errorf("attachFeed(%s) = %v, want %v", path, got, tc.feed)
		}
	}
}

// TestFollowerRefusesPlainHTTPOffLoopback: a follower forwards a request with its
// Authorization header to an http:// leader only on loopback. To a leader whose Lease names an
// http:// URL at another address it answers 503 leader_not_tls, and the leader never sees the
// token; http on loopback still forwards (https anywhere: TestLeaderURLSafe and
// TestForwarderPinsTheSharedCertificate).
func TestFollowerRefusesPlainHTTPOffLoopback(t *testing.T) {
	const token = "controller-token-0123456789abcdef"
	hostIP := nonLoopbackIP(t)
	tests := map[string]struct {
		listen   string
		wantCode int
		wantSeen bool
	}{
		"http on loopback":          {listen: "127.0.0.1:0", wantCode: http.StatusOK, wantSeen: true},
		"http off loopback":         {listen: net.JoinHostPort(hostIP, "0"), wantCode: http.StatusServiceUnavailable},
		"http on localhost by name": {listen: "localhost:0", wantCode: http.StatusOK, wantSeen: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var seen atomic.Bool
			ln, err := net.Listen("tcp", tc.listen)
			if err != nil {
				t.Fatal(err)
			}
			leader := &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				seen.Store(r.Header.Get("Authorization") != "")
				_, _ = io.WriteString(w, "leader saw "+r.URL.Path)
			})}}
			leader.Start()
			defer leader.Close()
			leaderURL := leader.URL
			if strings.HasPrefix(tc.listen, "localhost:") {
				leaderURL = fmt.Sprintf("http://localhost:%d", ln.Addr().(*net.TCPAddr).Port)
			}
			target, err := url.Parse(leaderURL)
			if err != nil {
				t.Fatal(err)
			}
			core, logs := observer.New(zap.WarnLevel)
			c := New(Options{Logger: zap.New(core)})
			req := httptest.NewRequest(http.MethodGet, "/v1/services", nil)
			req.Header.Set("Authorization", "Bearer "+token)
			rec := httptest.NewRecorder()
			c.forwarder().ServeHTTP(rec, req.WithContext(context.WithValue(req.Context(), leaderURLKey{}, target)))
			if rec.Code != tc.wantCode || seen.Load() != tc.wantSeen {
				t.Fatalf("forward to %s: HTTP %d (%s), leader saw the token %v; want %d, %v", leaderURL, rec.Code, rec.Body, seen.Load(), tc.wantCode, tc.wantSeen)
			}
			if tc.wantCode == http.StatusServiceUnavailable {
				var body api.ErrorBody
				if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error.Code != "leader_not_tls" || !strings.Contains(body.Error.Message, "--api-tls-cert") {
					t.Errorf("refusal body %s (%v), want leader_not_tls naming --api-tls-cert", rec.Body, err)
				}
				if logs.FilterMessage("not forwarding to the leader").Len() != 1 {
					t.Errorf("the refusal was not logged: %v", logs.All())
				}
				for _, e := range logs.All() {
					if strings.Contains(fmt.Sprint(e.ContextMap()), token) {
						t.Errorf("the token reached the log: %v", e.ContextMap())
					}
				}
			}
		})
	}
}

// nonLoopbackIP is an IPv4 address of this machine other than loopback, for a leader that a
// follower would reach over a network.
func nonLoopbackIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	t.Fatal("this machine has no IPv4 address off loopback, which the test needs for a leader on a network")
	return ""
}

// TestLeaderURLSafe: https anywhere, http only to a loopback IP or localhost.
func TestLeaderURLSafe(t *testing.T) {
	tests := map[string]bool{
		"https://10.0.0.5:8443":      true,
		"https://ferry.example:8443": true,
		"http://127.0.0.1:8080":      true,
		"http://[::1]:8080":          true,
		"http://LOCALHOST:8080":      true,
		"http://10.0.0.5:8080":       false,
		"http://ferry.example:8080":  false,
		"http://127.0.0.1.nip.io":    false,
		"ftp://127.0.0.1":            false,
	}
	for raw, wantOK := range tests {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if err := leaderURLSafe(u); (err == nil) != wantOK {
			t.Errorf("leaderURLSafe(%s) = %v, want ok %v", raw, err, wantOK)
		}
	}
}
