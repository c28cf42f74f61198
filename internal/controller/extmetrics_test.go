package controller

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/extmetrics"
	"github.com/ferryserve/ferry/internal/leader"
	"github.com/ferryserve/ferry/internal/testcluster"
)

// TestFollowerExternalMetricsAskTheLeader: a follower's external metric is what the leader
// named on the Lease answers at ProxyLoadPath, asked with the controller token; with no leader
// on the Lease the read fails (the API answers 503) rather than report no load.
func TestFollowerExternalMetricsAskTheLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leaderAPI := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != ProxyLoadPath || r.Header.Get("Authorization") != "Bearer "+leaderToken {
			http.Error(w, "unexpected "+r.URL.Path, http.StatusUnauthorized)
			return
		}
		api.WriteJSON(w, http.StatusOK, []ProxyLoad{{Service: "chat", InFlight: 7}, {Service: "code", InFlight: 0}})
	}))
	defer leaderAPI.Close()

	source, putLease := followerSource(ctx, t)
	if _, err := source.ExternalMetric(ctx, MetricProxyRequestsInFlight); err == nil {
		t.Error("with no Lease, the follower reported a load")
	}
	putLease(leaderAPI.URL)
	got, err := source.ExternalMetric(ctx, MetricProxyRequestsInFlight)
	if err != nil {
		t.Fatal(err)
	}
	want := []extmetrics.Sample{{Labels: map[string]string{"service": "chat"}, Value: 7}, {Labels: map[string]string{"service": "code"}, Value: 0}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the follower's samples (-want +got):\n%s", diff)
	}
}

// TestFollowerExternalMetricsWhenTheLeaderFails: a leader that is gone, errs, answers junk or
// hangs fails the follower's metric read, promptly and saying why, and never reads as no load
// (an HPA told "0" would scale the proxies in; told nothing, it keeps them).
func TestFollowerExternalMetricsWhenTheLeaderFails(t *testing.T) {
	defer func(d time.Duration) { leaderLoadTimeout = d }(leaderLoadTimeout)
	leaderLoadTimeout = 300 * time.Millisecond
	hung := make(chan struct{})
	defer close(hung)
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	for name, tc := range map[string]struct {
		url  func(t *testing.T) string
		want string
	}{
		"gone": {url: func(*testing.T) string { return gone.URL }, want: "ask the leader"},
		"erring": {url: serving(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "store unavailable", http.StatusInternalServerError)
		}), want: "500 Internal Server Error: store unavailable"},
		"junk": {url: serving(func(w http.ResponseWriter, _ *http.Request) {
			w.Write([]byte("<html>a proxy in the way</html>"))
		}), want: "the leader's " + ProxyLoadPath},
		"hung": {url: serving(func(_ http.ResponseWriter, r *http.Request) {
			select {
			case <-hung:
			case <-r.Context().Done():
			}
		}), want: "context deadline exceeded"},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			source, putLease := followerSource(ctx, t)
			putLease(tc.url(t))
			began := time.Now()
			got, err := source.ExternalMetric(ctx, MetricProxyRequestsInFlight)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ExternalMetric = %v, %v; want an error containing %q", got, err, tc.want)
			}
			// Unbounded, the hung leader would hold the read for the test's minute; reading the
			// Lease the first time takes seconds on a busy host.
			if took := time.Since(began); took > 30*time.Second {
				t.Errorf("the read took %v, bounded by %v", took, leaderLoadTimeout)
			}
		})
	}
}

const leaderToken = "controller-token-for-the-leader"

// serving returns a url maker for a test server that answers with h.
func serving(h http.HandlerFunc) func(t *testing.T) string {
	return func(t *testing.T) string {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return srv.URL
	}
}

// followerSource is the external metrics source of a follower in a namespace of its own, and a
// function that puts a Lease there naming a leader at url.
func followerSource(ctx context.Context, t *testing.T) (externalMetricsSource, func(url string)) {
	t.Helper()
	client := testcluster.Shared(t).Client()
	ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "extmetrics-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	elector, err := leader.New(leader.Config{Client: client.CoordinationV1(), Namespace: ns.Name, Name: "ferry-controller",
		Identity: "follower", RetryPeriod: time.Nanosecond, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	source := externalMetricsSource{c: New(Options{Elector: elector, Logger: zap.NewNop()}), token: leaderToken}
	return source, func(url string) {
		t.Helper()
		holder, duration, now := "leader", int32(15), metav1.NewMicroTime(time.Now())
		lease := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: "ferry-controller", Annotations: map[string]string{leader.AnnotationURL: url}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &duration, RenewTime: &now, AcquireTime: &now},
		}
		if _, err := client.CoordinationV1().Leases(ns.Name).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}
