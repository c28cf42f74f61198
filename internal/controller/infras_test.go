package controller

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/provision"
	"github.com/ferryserve/ferry/replicas"
)

// idleProvider is an infra that holds nothing and is never called: the tests drive its
// breaker by hand.
type idleProvider struct{}

func (idleProvider) Launch(context.Context, launcher.Spec) (launcher.Instance, error) {
	return launcher.Instance{}, launcher.ErrNoCapacity
}
func (idleProvider) Terminate(context.Context, string) error { return nil }
func (idleProvider) List(context.Context, map[string]string) ([]launcher.Instance, error) {
	return nil, nil
}

// scriptedClock is a clock the test moves by hand.
type scriptedClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *scriptedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *scriptedClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// newHealthProvisioner is a provisioner over local, aws and gcp whose breakers run on clock.
func newHealthProvisioner(t *testing.T, clock *scriptedClock) *provision.Provisioner {
	t.Helper()
	p, err := provision.New(provision.Options{
		Infras: []provision.Infra{{Name: "aws", Provider: idleProvider{}}, {Name: "gcp", Provider: idleProvider{}}, {Name: "local", Provider: idleProvider{}}},
		Planner: provision.PlannerFunc(func(context.Context, configs.Resources) ([]launcher.Placement, error) {
			return nil, nil
		}),
		Health: provision.NewHealth(provision.HealthOptions{Now: clock.Now}),
		Now:    clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestInfrasView: the controller's /v1/infras view is the breakers, the errors counted by
// infra then class, and the leftovers, as a scripted outage and recovery change them; a
// controller that does not lead (no provisioner) knows nothing.
func TestInfrasView(t *testing.T) {
	start := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	clock := &scriptedClock{now: start}
	c := New(Options{})
	if got := c.Infras(); len(got.States)+len(got.Errors)+len(got.Leftovers) != 0 {
		t.Fatalf("a controller without a provisioner shows %+v", got)
	}
	c.provider = newHealthProvisioner(t, clock)
	h := c.provider.Health()

	refused := fmt.Errorf("%w: dial tcp 127.0.0.1:9: connect: connection refused", launcher.ErrUnavailable)
	clock.Add(time.Second)
	for range 3 {
		h.Observe("gcp", "", refused)
	}
	h.Observe("local", "", nil)
	h.Observe("aws", "", fmt.Errorf("%w: RequestLimitExceeded", launcher.ErrThrottled))
	if err := c.provider.LeaveBehind(launcher.Leftover{Infra: "gcp", InstanceID: "gcp/us-central1-a/chat-2", Owner: "service chat", Reason: refused.Error()}); err != nil {
		t.Fatal(err)
	}

	got := c.Infras()
	down := start.Add(time.Second)
	wantStates := []launcher.InfraState{
		{Infra: "aws", State: launcher.InfraThrottled, Since: down, LastClass: provision.ClassThrottled, LastError: "throttled: RequestLimitExceeded"},
		{Infra: "gcp", State: launcher.InfraDown, Since: down, Failures: 3, LastClass: provision.ClassUnavailable, LastError: refused.Error()},
		{Infra: "local", State: launcher.InfraUp, Since: start},
	}
	if diff := cmp.Diff(wantStates, got.States, cmp.Comparer(func(a, b time.Time) bool { return a.Equal(b) }),
		cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".RetryAt" }, cmp.Ignore())); diff != "" {
		t.Errorf("states (-want +got):\n%s", diff)
	}
	wantErrors := []api.InfraErrors{{Infra: "aws", Class: provision.ClassThrottled, Count: 1}, {Infra: "gcp", Class: provision.ClassUnavailable, Count: 3}}
	if diff := cmp.Diff(wantErrors, got.Errors); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
	if len(got.Leftovers) != 1 || got.Leftovers[0].InstanceID != "gcp/us-central1-a/chat-2" || got.Leftovers[0].Key == "" || !got.Leftovers[0].Since.Equal(down) {
		t.Errorf("leftovers = %+v, want the one instance, keyed, since the outage", got.Leftovers)
	}
}

// TestServiceInfras: a service's status shows the breakers of the infras its live replicas are
// on and of those its listing could not read, with only the zones that are not up.
func TestServiceInfras(t *testing.T) {
	up := func(infra, zone string) launcher.InfraState {
		return launcher.InfraState{Infra: infra, Zone: zone, State: launcher.InfraUp}
	}
	down := func(infra, zone string) launcher.InfraState {
		return launcher.InfraState{Infra: infra, Zone: zone, State: launcher.InfraDown, Failures: 3, LastError: "refused"}
	}
	states := []launcher.InfraState{down("aws", ""), down("aws", "us-east-2"), up("gcp", ""), up("gcp", "us-central1-a"),
		down("gcp", "us-central1-f"), up("kubernetes/prod", ""), up("local", "")}
	tests := map[string]struct {
		recs []replicas.Record
		gaps []launcher.Gap
		want []launcher.InfraState
	}{
		"no replicas, nothing unread": {},
		"replicas on local only": {
			recs: []replicas.Record{{ID: 1, Infra: "local", Status: replicas.StatusReady}},
			want: []launcher.InfraState{up("local", "")},
		},
		"gcp replica: its infra and its zone that is down, not the one that is up": {
			recs: []replicas.Record{{ID: 1, Infra: "gcp", Zone: "us-central1-a", Status: replicas.StatusReady}},
			want: []launcher.InfraState{up("gcp", ""), down("gcp", "us-central1-f")},
		},
		"terminal replicas do not count": {
			recs: []replicas.Record{{ID: 1, Infra: "gcp", Status: replicas.StatusFailed}, {ID: 2, Infra: "local", Status: replicas.StatusStarting}},
			want: []launcher.InfraState{up("local", "")},
		},
		"an infra the listing could not read": {
			recs: []replicas.Record{{ID: 1, Infra: "local", Status: replicas.StatusReady}},
			gaps: []launcher.Gap{{Infra: "aws", Region: "us-east-2", Err: launcher.ErrUnavailable}},
			want: []launcher.InfraState{down("aws", ""), down("aws", "us-east-2"), up("local", "")},
		},
		"an infra with no breaker (disabled since)": {
			recs: []replicas.Record{{ID: 1, Infra: "kubernetes/old", Status: replicas.StatusReady}},
			want: []launcher.InfraState{up("kubernetes/old", "")},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, serviceInfras(states, tc.recs, tc.gaps)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
