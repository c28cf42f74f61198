package extmetrics

import (
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

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
