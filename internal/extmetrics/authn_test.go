package extmetrics

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/internal/testhttp"
)

// TestExtraFromHeaders: the aggregator's X-Remote-Extra-<key> headers become the user's extra,
// the key lowercased and percent-unescaped, values kept in order.
func TestExtraFromHeaders(t *testing.T) {
	h := http.Header{}
	h.Add("X-Remote-Extra-Scopes", "a")
	h.Add("X-Remote-Extra-Scopes", "b")
	h.Add("X-Remote-Extra-Example.com%2fteam", "ml")
	h.Add("X-Remote-User", "alice")
	got := extraFromHeaders(h, []string{"X-Remote-Extra-"})
	want := map[string][]string{"scopes": {"a", "b"}, "example.com/team": {"ml"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("extra (-want +got):\n%s", diff)
	}
}

// TestParseRequestHeaderRefuses: a ConfigMap that cannot authenticate anyone is an error that
// says why, never a configuration that lets requests through.
func TestParseRequestHeaderRefuses(t *testing.T) {
	certFile, _ := testhttp.WriteSelfSignedFor(t, t.TempDir())
	pem, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	ca := string(pem)
	for name, tc := range map[string]struct {
		data map[string]string
		want string
	}{
		"no aggregation layer": {map[string]string{"client-ca-file": ca}, "no requestheader-client-ca-file"},
		"not PEM":              {map[string]string{"requestheader-client-ca-file": "junk"}, "holds no PEM certificate"},
		"a list not JSON": {map[string]string{"requestheader-client-ca-file": ca, "requestheader-username-headers": "X-Remote-User"},
			"requestheader-username-headers \"X-Remote-User\": want a JSON array"},
		"no user header": {map[string]string{"requestheader-client-ca-file": ca}, "no requestheader-username-headers"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseRequestHeader(tc.data)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestRequestHeaderWithoutAccess: a controller that may not read the API server's
// request-header ConfigMap (no RoleBinding to extension-apiserver-authentication-reader)
// refuses every request, saying which ConfigMap it could not read; one that read it once keeps
// that configuration while a refresh fails, so a blip of the API server does not turn the HPA's
// reads away.
func TestRequestHeaderWithoutAccess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := testcluster.Shared(t)
	cfg := rest.CopyConfig(c.RESTConfig())
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:ferry:without-the-reader-role"}
	denied, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodGet, "/apis/external.metrics.k8s.io/v1beta1", nil)

	a := NewRequestHeader(denied, 0)
	err = a.Load(ctx)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), AuthConfigMapNamespace+"/"+AuthConfigMapName) {
		t.Fatalf("Load without access: %v, want forbidden, naming the ConfigMap", err)
	}
	if _, aerr := a.Authenticate(req); aerr == nil || aerr.Error() != err.Error() {
		t.Errorf("Authenticate before any load: %v, want the load's error %q", aerr, err)
	}

	b := NewRequestHeader(c.Client(), 0)
	if err := b.Load(ctx); err != nil {
		t.Fatal(err)
	}
	b.client = denied // the RoleBinding removed, or the API server unreachable, later
	if err := b.Load(ctx); !apierrors.IsForbidden(err) {
		t.Fatalf("a refresh without access: %v, want forbidden", err)
	}
	if _, aerr := b.Authenticate(req); aerr == nil || !strings.Contains(aerr.Error(), "no client certificate") {
		t.Errorf("Authenticate after a failed refresh: %v, want the configuration loaded before to judge it (no client certificate)", aerr)
	}
}
