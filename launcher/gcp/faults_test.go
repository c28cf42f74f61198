package gcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/api/googleapi"
	"google.golang.org/protobuf/proto"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/fakefault"
	"github.com/ferryserve/ferry/launcher/gcp/fakecompute"
)

// Faults: the provider against fakecompute's outage switch, through the real REST clients.
// Whatever GCP does — answer 503, say a zone does not exist, throttle, or hang — a call fails
// within its bound with a typed error, and List returns what the zones that answered hold
// with a gap for each that did not.

// partialGaps asserts err is a partial list and returns its gaps.
func partialGaps(t *testing.T, err error) []launcher.Gap {
	t.Helper()
	gaps, ok := launcher.Partial(err)
	if !ok {
		t.Fatalf("List error %v is not a partial list", err)
	}
	return gaps
}

// zoneGaps is the gaps List should report for zones, without their errors.
func zoneGaps(zones ...string) []launcher.Gap {
	out := make([]launcher.Gap, len(zones))
	for i, z := range zones {
		out[i] = launcher.Gap{Infra: InfraName, Region: regionOf(z), Zone: z}
	}
	return out
}

var ignoreGapErr = cmpopts.IgnoreFields(launcher.Gap{}, "Err")

// checkGaps asserts the gaps are exactly those of zones, each with an error that is want and
// none of notWant; every zone failing (and none for not existing) is one whole-infra gap whose
// error names each zone.
func checkGaps(t *testing.T, gaps []launcher.Gap, zones []string, want error, notWant ...error) {
	t.Helper()
	expect := zoneGaps(zones...)
	if slices.Equal(zones, testZones) && !errors.Is(want, launcher.ErrNotFound) {
		expect = []launcher.Gap{{Infra: InfraName}}
		for _, z := range zones {
			if len(gaps) == 1 && !strings.Contains(gaps[0].Err.Error(), z) {
				t.Errorf("the whole-infra gap does not name %s: %v", z, gaps[0].Err)
			}
		}
	}
	if d := cmp.Diff(expect, gaps, ignoreGapErr); d != "" {
		t.Fatalf("gaps (-want +got):\n%s", d)
	}
	for _, g := range gaps {
		if !errors.Is(g.Err, want) {
			t.Errorf("gap %s: %v, want %v", g.Where(), g.Err, want)
		}
		for _, other := range notWant {
			if errors.Is(g.Err, other) {
				t.Errorf("gap %s: %v is also %v", g.Where(), g.Err, other)
			}
		}
	}
}

func ids(insts []launcher.Instance) []string {
	out := make([]string, len(insts))
	for i, in := range insts {
		out[i] = in.ID
	}
	slices.Sort(out)
	return out
}

// within fails the test if f took longer than limit, and returns what f returned.
func within[T any](t *testing.T, what string, limit time.Duration, f func() (T, error)) (T, error) {
	t.Helper()
	start := time.Now()
	v, err := f()
	if took := time.Since(start); took > limit {
		t.Fatalf("%s took %v, want at most %v", what, took.Round(time.Millisecond), limit)
	}
	return v, err
}

// TestClassify: the API's reasons and statuses, and errors that never reached it, map to the
// launcher's typed errors; an infra fault is never taken for a problem with the request.
func TestClassify(t *testing.T) {
	gerr := func(code int, reason string) error {
		e := &googleapi.Error{Code: code, Message: "m"}
		if reason != "" {
			e.Errors = []googleapi.ErrorItem{{Reason: reason, Message: "m"}}
		}
		return e
	}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for name, tc := range map[string]struct {
		err     error
		want    error
		notWant []error
	}{
		"429":                        {gerr(429, ""), launcher.ErrThrottled, []error{launcher.ErrUnavailable}},
		"429 rateLimitExceeded":      {gerr(429, "rateLimitExceeded"), launcher.ErrThrottled, []error{launcher.ErrUnavailable}},
		"403 rateLimitExceeded":      {gerr(403, "rateLimitExceeded"), launcher.ErrThrottled, []error{launcher.ErrUnauthorized}},
		"403 userRateLimitExceeded":  {gerr(403, "userRateLimitExceeded"), launcher.ErrThrottled, []error{launcher.ErrUnauthorized}},
		"503 backendError":           {gerr(503, "backendError"), launcher.ErrUnavailable, []error{launcher.ErrThrottled, launcher.ErrNoCapacity}},
		"500 backendError":           {gerr(500, "backendError"), launcher.ErrUnavailable, nil},
		"500 internalError":          {gerr(500, "internalError"), launcher.ErrUnavailable, nil},
		"502 without a body":         {gerr(502, ""), launcher.ErrUnavailable, nil},
		"504":                        {gerr(504, ""), launcher.ErrUnavailable, nil},
		"503 resourcePoolExhausted":  {gerr(503, "resourcePoolExhausted"), launcher.ErrNoCapacity, []error{launcher.ErrUnavailable}},
		"403 quotaExceeded":          {gerr(403, "quotaExceeded"), launcher.ErrQuota, []error{launcher.ErrUnauthorized, launcher.ErrThrottled}},
		"403 forbidden":              {gerr(403, "forbidden"), launcher.ErrUnauthorized, []error{launcher.ErrUnavailable}},
		"404 notFound":               {gerr(404, "notFound"), launcher.ErrNotFound, []error{launcher.ErrUnavailable}},
		"connection refused":         {fmt.Errorf("Get %q: %w", "http://x", refused), launcher.ErrUnavailable, nil},
		"request timeout":            {&RequestTimeoutError{Method: "GET", URL: "http://x", Timeout: time.Second}, context.DeadlineExceeded, nil},
		"caller's deadline":          {context.DeadlineExceeded, launcher.ErrUnavailable, nil},
		"unexpected EOF":             {io.ErrUnexpectedEOF, launcher.ErrUnavailable, nil},
		"caller's cancel is nothing": {context.Canceled, context.Canceled, []error{launcher.ErrUnavailable, launcher.ErrThrottled}},
	} {
		t.Run(name, func(t *testing.T) {
			got := classify(tc.err, "list instances in us-central1-a")
			if !errors.Is(got, tc.want) {
				t.Fatalf("classify(%v) = %v, want %v", tc.err, got, tc.want)
			}
			for _, other := range tc.notWant {
				if errors.Is(got, other) {
					t.Fatalf("classify(%v) = %v, also %v", tc.err, got, other)
				}
			}
			if !errors.Is(got, tc.err) && !errors.As(got, new(*googleapi.Error)) {
				t.Fatalf("classify lost the original error: %v", got)
			}
		})
	}
	failed := &computepb.Operation{Name: proto.String("op-1"), Status: computepb.Operation_DONE.Enum(), HttpErrorStatusCode: proto.Int32(503),
		Error: &computepb.Error{Errors: []*computepb.Errors{{Code: proto.String("SOMETHING_NEW"), Message: proto.String("m")}}}}
	if err := operationError(failed); !errors.Is(err, launcher.ErrUnavailable) {
		t.Fatalf("an operation that failed with 503 and an unknown code: %v, want ErrUnavailable", err)
	}
}

// TestFaultUnavailableEverywhere: with GCP answering every call 503, List returns at once with
// every zone a gap (the SDK's retries bounded), and Launch, Terminate and Check fail as
// unavailable.
func TestFaultUnavailableEverywhere(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	before, err := e.prov.Launch(ctx, spec("before", launcher.Placement{InstanceType: "n1-standard-4"}))
	if err != nil {
		t.Fatal(err)
	}
	e.fake.Outages().Set(fakefault.Fault{Status: 503})

	list, err := within(t, "List", 20*time.Second, func() ([]launcher.Instance, error) { return e.prov.List(ctx, nil) })
	checkGaps(t, partialGaps(t, err), testZones, launcher.ErrUnavailable, launcher.ErrThrottled, launcher.ErrNotFound)
	if len(list) != 0 {
		t.Fatalf("List read %v from zones that all failed", ids(list))
	}

	_, err = within(t, "Launch", 20*time.Second, func() (launcher.Instance, error) {
		return e.prov.Launch(ctx, spec("during", launcher.Placement{Zone: "us-east1-b", InstanceType: "n1-standard-4"}))
	})
	checkError(t, err, launcher.ErrUnavailable)
	got := e.requests.count("GET zones/us-central1-a/instances/" + before.Name)
	_, err = within(t, "Terminate", 20*time.Second, func() (struct{}, error) { return struct{}{}, e.prov.Terminate(ctx, before.ID) })
	checkError(t, err, launcher.ErrUnavailable)
	// Terminate reads the VM first (a job node gets its grace), which the SDK retries on 503:
	// it tried, and no more than MaxAttempts times.
	if n := e.requests.count("GET zones/us-central1-a/instances/"+before.Name) - got; n != DefaultMaxAttempts {
		t.Fatalf("Terminate read the VM %d times, want the SDK's retries bounded to %d attempts", n, DefaultMaxAttempts)
	}
	_, err = within(t, "Check", 20*time.Second, func() (struct{}, error) { return struct{}{}, e.prov.Check(ctx) })
	checkError(t, err, launcher.ErrUnavailable)
	for _, z := range testZones {
		if !strings.Contains(err.Error(), "gcp/"+z) {
			t.Errorf("Check's error does not name %s: %v", z, err)
		}
	}
}

// TestFaultZoneNotFound: a zone that answers 404 (one the project does not have, or a fault)
// is a gap that says it holds nothing (ErrNotFound); the other zones are listed.
func TestFaultZoneNotFound(t *testing.T) {
	zones := append(slices.Clone(testZones), "us-west1-a") // the fake does not serve us-west1-a
	e := newEnv(t, fakecompute.Options{}, Options{Zones: zones})
	ctx := testCtx(t)
	var want []string
	for _, z := range []string{"us-central1-a", "us-east1-b"} {
		in, err := e.prov.Launch(ctx, spec("in-"+z, launcher.Placement{Zone: z, InstanceType: "n1-standard-4"}))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, in.ID)
	}
	e.fake.Outages().Set(fakefault.Fault{Status: 404, Zone: "us-central1-b"})

	list, err := e.prov.List(ctx, nil)
	checkGaps(t, partialGaps(t, err), []string{"us-central1-b", "us-west1-a"}, launcher.ErrNotFound, launcher.ErrUnavailable)
	if d := cmp.Diff(want, ids(list)); d != "" {
		t.Fatalf("the zones that answered (-want +got):\n%s", d)
	}
	err = e.prov.Check(ctx)
	if !errors.Is(err, launcher.ErrNotFound) || errors.Is(err, launcher.ErrUnavailable) ||
		!strings.Contains(err.Error(), "2 of 4 zones") || !strings.Contains(err.Error(), "gcp/us-central1-b") || !strings.Contains(err.Error(), "gcp/us-west1-a") {
		t.Fatalf("Check = %v, want the two zones named, not found", err)
	}
}

// TestFaultThrottled: throttling is ErrThrottled (the breakers back off), never unavailable
// or a permission problem, and it costs only the zone it is in.
func TestFaultThrottled(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	in, err := e.prov.Launch(ctx, spec("listed", launcher.Placement{Zone: "us-central1-a", InstanceType: "n1-standard-4"}))
	if err != nil {
		t.Fatal(err)
	}
	e.fake.Outages().Set(fakefault.Fault{Throttle: true, Zone: "us-east1-b"})
	list, err := e.prov.List(ctx, nil)
	checkGaps(t, partialGaps(t, err), []string{"us-east1-b"}, launcher.ErrThrottled, launcher.ErrUnavailable)
	if d := cmp.Diff([]string{in.ID}, ids(list)); d != "" {
		t.Fatalf("the zones that answered (-want +got):\n%s", d)
	}
	_, err = e.prov.Launch(ctx, spec("throttled", launcher.Placement{Zone: "us-east1-b", InstanceType: "n1-standard-4"}))
	checkError(t, err, launcher.ErrThrottled)
	if err := e.prov.Check(ctx); !errors.Is(err, launcher.ErrThrottled) || !strings.Contains(err.Error(), "gcp/us-east1-b") {
		t.Fatalf("Check = %v, want us-east1-b throttled", err)
	}

	// A 403 whose reason is a rate limit is throttling, not a permission problem.
	e.fake.Outages().Set(fakefault.Fault{Status: 403, Code: "userRateLimitExceeded"})
	_, err = e.prov.List(ctx, nil)
	checkGaps(t, partialGaps(t, err), testZones, launcher.ErrThrottled, launcher.ErrUnauthorized)
}

// TestFaultHangCutByRequestTimeout: an endpoint that accepts requests and never answers costs
// each call one RequestTimeout: List returns with every zone a gap (a deadline, which opens
// the provisioner's breaker at once), Launch, Terminate and Check fail unavailable — even a
// launch already waiting for its VM — and nothing is left behind.
func TestFaultHangCutByRequestTimeout(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{RequestTimeout: time.Second})
	ctx := testCtx(t)
	before, err := e.prov.Launch(ctx, spec("before", launcher.Placement{InstanceType: "n1-standard-4"}))
	if err != nil {
		t.Fatal(err)
	}

	e.fake.Outages().Set(fakefault.Fault{Hang: true})
	list, err := within(t, "List", 10*time.Second, func() ([]launcher.Instance, error) { return e.prov.List(ctx, nil) })
	gaps := partialGaps(t, err)
	checkGaps(t, gaps, testZones, launcher.ErrUnavailable)
	for _, g := range gaps {
		if !errors.Is(g.Err, context.DeadlineExceeded) || !isRequestTimeout(g.Err) {
			t.Errorf("gap %s: %v, want the request's own deadline", g.Where(), g.Err)
		}
	}
	if len(list) != 0 {
		t.Fatalf("List read %v from zones that all hung", ids(list))
	}
	_, err = within(t, "Launch", 15*time.Second, func() (launcher.Instance, error) {
		return e.prov.Launch(ctx, spec("hung", launcher.Placement{Zone: "us-east1-b", InstanceType: "n1-standard-4"}))
	})
	checkError(t, err, launcher.ErrUnavailable)
	_, err = within(t, "Terminate", 15*time.Second, func() (struct{}, error) { return struct{}{}, e.prov.Terminate(ctx, before.ID) })
	checkError(t, err, launcher.ErrUnavailable)
	_, err = within(t, "Check", 10*time.Second, func() (struct{}, error) { return struct{}{}, e.prov.Check(ctx) })
	checkError(t, err, launcher.ErrUnavailable)

	// Every cut request has reached the fake (so the hung insert above is never served).
	waitFor(t, "the fake to let go of the cut requests", func() bool { return e.fake.Outages().Held() == 0 })

	// The insert is accepted, then its operation hangs: the launch fails within a few request
	// timeouts, and deletes what it may have made.
	e.fake.Outages().Set(fakefault.Fault{Hang: true, Ops: []string{fakecompute.OpZoneOperationsWait, fakecompute.OpZoneOperationsGet}})
	_, err = within(t, "Launch waiting for its VM", 20*time.Second, func() (launcher.Instance, error) {
		return e.prov.Launch(ctx, spec("waiting", launcher.Placement{Zone: "us-central1-b", InstanceType: "n1-standard-4"}))
	})
	checkError(t, err, launcher.ErrUnavailable)
	e.fake.Outages().Clear()
	waitFor(t, "the hung launch's VM deleted", func() bool {
		list, err := e.prov.List(ctx, map[string]string{launcher.LabelReplicaID: "waiting"})
		return err == nil && len(list) == 0
	})
	if list, err := e.prov.List(ctx, nil); err != nil || !slices.Equal(ids(list), []string{before.ID}) {
		t.Fatalf("after the hang: %v, %v; want %s alone", ids(list), err, before.ID)
	}
}

// TestFaultListReturnsWhenCtxEnds: a List whose ctx ends before a hung zone answered returns
// then (not at RequestTimeout) with the other zones' VMs and the hung zone a gap.
func TestFaultListReturnsWhenCtxEnds(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{}) // RequestTimeout: the default 30 s
	ctx := testCtx(t)
	var want []string
	for _, z := range []string{"us-central1-a", "us-east1-b"} {
		in, err := e.prov.Launch(ctx, spec("in-"+z, launcher.Placement{Zone: z, InstanceType: "n1-standard-4"}))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, in.ID)
	}
	e.fake.Outages().Set(fakefault.Fault{Hang: true, Zone: "us-central1-b"})
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	list, err := within(t, "List", 10*time.Second, func() ([]launcher.Instance, error) { return e.prov.List(lctx, nil) })
	checkGaps(t, partialGaps(t, err), []string{"us-central1-b"}, launcher.ErrUnavailable)
	if d := cmp.Diff(want, ids(list)); d != "" {
		t.Fatalf("the zones that answered (-want +got):\n%s", d)
	}
}

// TestFaultRecovers: a cloud that recovers (a fault with For) is listed whole again, and
// launches go on.
func TestFaultRecovers(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	in, err := e.prov.Launch(ctx, spec("before", launcher.Placement{InstanceType: "n1-standard-4"}))
	if err != nil {
		t.Fatal(err)
	}
	e.fake.Outages().Set(fakefault.Fault{Status: 503, For: 2 * time.Second})
	_, err = e.prov.List(ctx, nil)
	checkGaps(t, partialGaps(t, err), testZones, launcher.ErrUnavailable)
	waitFor(t, "a complete list", func() bool {
		list, err := e.prov.List(ctx, nil)
		return err == nil && slices.Equal(ids(list), []string{in.ID})
	})
	if err := e.prov.Check(ctx); err != nil {
		t.Fatalf("Check after the outage: %v", err)
	}
	if _, err := e.prov.Launch(ctx, spec("after", launcher.Placement{InstanceType: "n1-standard-4"})); err != nil {
		t.Fatalf("Launch after the outage: %v", err)
	}
}
