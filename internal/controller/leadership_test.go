package controller

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"go.uber.org/zap"

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
