package launcher

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestRouteSource(t *testing.T) {
	for ip, want := range map[string]string{"127.0.0.1": "127.0.0.1/32", "::ffff:127.0.0.1": "127.0.0.1/32"} {
		got, err := RouteSource(ip)
		if err != nil || got.String() != want {
			t.Errorf("RouteSource(%s) = %v, %v; want %s", ip, got, err, want)
		}
	}
	if _, err := RouteSource("not-an-ip"); err == nil {
		t.Error("RouteSource(not-an-ip): want an error")
	}
}

// TestIngressAdoption: each key is ensured once; a key that failed is tried again only after
// Retry; instances not running, without an endpoint or skipped by key are never ensured.
func TestIngressAdoption(t *testing.T) {
	a := IngressAdoption{Retry: time.Hour}
	insts := []Instance{
		{ID: "a", State: StateRunning, Endpoint: "10.0.0.1:8000", Region: "r1"},
		{ID: "b", State: StateRunning, Endpoint: "10.0.0.2:8000", Region: "r1"}, // same key as a
		{ID: "c", State: StateRunning, Endpoint: "10.0.0.3:9000", Region: "r2"},
		{ID: "d", State: StatePending, Endpoint: "10.0.0.4:8000", Region: "r1"},
		{ID: "e", State: StateRunning, Region: "r1"},
		{ID: "f", State: StateRunning, Endpoint: "10.0.0.6:8000", Region: "nowhere"},
	}
	var ensured, failed []string
	fail := map[string]bool{"r2/9000": true}
	key := func(in Instance, port int) (string, bool) {
		return fmt.Sprintf("%s/%d", in.Region, port), in.Region != "nowhere"
	}
	ensure := func(in Instance, host string, port int) error {
		ensured = append(ensured, in.ID+"@"+host)
		if fail[fmt.Sprintf("%s/%d", in.Region, port)] {
			return errors.New("throttled")
		}
		return nil
	}
	onFail := func(in Instance, _ int, err error) { failed = append(failed, in.ID+": "+err.Error()) }
	a.Adopt(insts, key, ensure, onFail)
	a.Adopt(insts, key, ensure, onFail)
	if want := []string{"a@10.0.0.1", "c@10.0.0.3"}; !slices.Equal(ensured, want) {
		t.Errorf("ensured %v, want %v (each key once, the failed one not again within Retry)", ensured, want)
	}
	if want := []string{"c: throttled"}; !slices.Equal(failed, want) {
		t.Errorf("failed %v, want %v", failed, want)
	}
	a.Retry = time.Nanosecond
	a.Adopt(insts, key, ensure, onFail) // the failed key's retry time has passed
	if len(ensured) != 3 || ensured[2] != "c@10.0.0.3" {
		t.Errorf("after Retry: ensured %v, want c again", ensured)
	}
}

// TestClusterInfo: SKYPILOT_CLUSTER_INFO in SkyPilot's shape, the cloud as SkyPilot names it,
// Kubernetes' region its context, and a missing region or zone null.
func TestClusterInfo(t *testing.T) {
	for _, tc := range []struct {
		pl   Placement
		want string
	}{
		{Placement{Infra: "aws", Region: "us-east-1", Zone: "us-east-1a"}, `{"cluster_name":"chat-2","cloud":"AWS","region":"us-east-1","zone":"us-east-1a"}`},
		{Placement{Infra: "gcp", Region: "us-central1", Zone: "us-central1-b"}, `{"cluster_name":"chat-2","cloud":"GCP","region":"us-central1","zone":"us-central1-b"}`},
		{Placement{Infra: "kubernetes/kind-ferry"}, `{"cluster_name":"chat-2","cloud":"Kubernetes","region":"kind-ferry","zone":null}`},
		{Placement{Infra: "local"}, `{"cluster_name":"chat-2","cloud":"Local","region":null,"zone":null}`},
	} {
		if got := ClusterInfo(Spec{Name: "chat-2-x", Cluster: "chat-2"}, tc.pl); got != tc.want {
			t.Errorf("ClusterInfo at %+v = %s, want %s", tc.pl, got, tc.want)
		}
	}
}

// TestSetDefault: zero and negative numbers and the empty string take the default; a set value
// stays.
func TestSetDefault(t *testing.T) {
	d, n, s := time.Duration(0), -3, ""
	SetDefault(&d, time.Minute)
	SetDefault(&n, 5)
	SetDefault(&s, "ferry")
	if d != time.Minute || n != 5 || s != "ferry" {
		t.Errorf("unset values: %v %d %q, want the defaults", d, n, s)
	}
	d, n, s = time.Second, 2, "mine"
	SetDefault(&d, time.Minute)
	SetDefault(&n, 5)
	SetDefault(&s, "ferry")
	if d != time.Second || n != 2 || s != "mine" {
		t.Errorf("set values changed: %v %d %q", d, n, s)
	}
}
