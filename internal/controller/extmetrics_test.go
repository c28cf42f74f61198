package controller

import (
	"context"
	"net/http"
	"net/http/httptest"
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
	client := testcluster.Shared(t).Client()
	ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "extmetrics-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const token = "controller-token-for-the-leader"
	leaderAPI := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != ProxyLoadPath || r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "unexpected "+r.URL.Path, http.StatusUnauthorized)
			return
		}
		api.WriteJSON(w, http.StatusOK, []ProxyLoad{{Service: "chat", InFlight: 7}, {Service: "code", InFlight: 0}})
	}))
	defer leaderAPI.Close()

	elector, err := leader.New(leader.Config{Client: client.CoordinationV1(), Namespace: ns.Name, Name: "ferry-controller",
		Identity: "follower", RetryPeriod: time.Nanosecond, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	source := externalMetricsSource{c: New(Options{Elector: elector, Logger: zap.NewNop()}), token: token}
	if _, err := source.ExternalMetric(ctx, MetricProxyRequestsInFlight); err == nil {
		t.Error("with no Lease, the follower reported a load")
	}

	holder, duration, now := "leader", int32(15), metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "ferry-controller", Annotations: map[string]string{leader.AnnotationURL: leaderAPI.URL}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &duration, RenewTime: &now, AcquireTime: &now},
	}
	if _, err := client.CoordinationV1().Leases(ns.Name).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := source.ExternalMetric(ctx, MetricProxyRequestsInFlight)
	if err != nil {
		t.Fatal(err)
	}
	want := []extmetrics.Sample{{Labels: map[string]string{"service": "chat"}, Value: 7}, {Labels: map[string]string{"service": "code"}, Value: 0}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the follower's samples (-want +got):\n%s", diff)
	}
}
