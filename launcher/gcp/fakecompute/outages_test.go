package fakecompute

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/googleapis/gax-go/v2"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"

	"github.com/ferryserve/ferry/launcher/fakefault"
)

// outageEnv is a fake served on loopback with the real REST clients Ferry uses.
type outageEnv struct {
	fake *Server
	url  string
	ic   *compute.InstancesClient
	zc   *compute.ZonesClient
	gc   *compute.GlobalOperationsClient
}

func newOutageEnv(t *testing.T) *outageEnv {
	t.Helper()
	fake := New(Options{Project: "p", Zones: []string{"us-central1-a", "us-central1-b"}, Dir: t.TempDir(), OpDelay: -1})
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	t.Cleanup(fake.Close) // first: it drops requests a hang holds, which srv.Close waits for
	ctx := context.Background()
	copts := []option.ClientOption{option.WithEndpoint(srv.URL), option.WithoutAuthentication()}
	ic, err := compute.NewInstancesRESTClient(ctx, copts...)
	if err != nil {
		t.Fatal(err)
	}
	zc, err := compute.NewZonesRESTClient(ctx, copts...)
	if err != nil {
		t.Fatal(err)
	}
	gc, err := compute.NewGlobalOperationsRESTClient(ctx, copts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ic.Close(); zc.Close(); gc.Close() })
	return &outageEnv{fake: fake, url: srv.URL, ic: ic, zc: zc, gc: gc}
}

// noRetry makes a call once: the clients retry 503 on reads, and these tests read the answer.
var noRetry = gax.WithRetry(nil)

// list lists the instances of zone, once.
func (e *outageEnv) list(ctx context.Context, zone string) error {
	it := e.ic.List(ctx, &computepb.ListInstancesRequest{Project: "p", Zone: zone}, noRetry)
	for {
		_, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// envelope is what the client read of Google's error envelope: code, first reason, status.
func envelope(t *testing.T, err error) (int, string, string) {
	t.Helper()
	var gerr *googleapi.Error
	if !errors.As(err, &gerr) {
		t.Fatalf("error %v (%T) is not a *googleapi.Error", err, err)
	}
	var body struct {
		Error struct {
			Status string `json:"status"`
		} `json:"error"`
	}
	if jerr := json.Unmarshal([]byte(gerr.Body), &body); jerr != nil {
		t.Fatalf("body %q: %v", gerr.Body, jerr)
	}
	reason := ""
	if len(gerr.Errors) > 0 {
		reason = gerr.Errors[0].Reason
	}
	return gerr.Code, reason, body.Error.Status
}

// TestOutageErrors: each kind of fault answers as Compute Engine does, in Google's envelope,
// which the real client reads into a *googleapi.Error with its reason.
func TestOutageErrors(t *testing.T) {
	for spec, want := range map[string]struct {
		code           int
		reason, status string
	}{
		"throttle":                       {429, "rateLimitExceeded", "RESOURCE_EXHAUSTED"},
		"503":                            {503, "backendError", "UNAVAILABLE"},
		"500":                            {500, "backendError", "INTERNAL"},
		"504":                            {504, "backendError", "DEADLINE_EXCEEDED"},
		"404,zone=us-central1-a":         {404, "notFound", "NOT_FOUND"},
		"403":                            {403, "forbidden", "PERMISSION_DENIED"},
		"403,code=userRateLimitExceeded": {403, "userRateLimitExceeded", "PERMISSION_DENIED"},
	} {
		t.Run(spec, func(t *testing.T) {
			e := newOutageEnv(t)
			f, err := fakefault.Parse(spec)
			if err != nil {
				t.Fatal(err)
			}
			e.fake.Outages().Set(f)
			err = e.list(context.Background(), "us-central1-a")
			code, reason, status := envelope(t, err)
			if code != want.code || reason != want.reason || status != want.status {
				t.Fatalf("got %d %s %s, want %d %s %s (%v)", code, reason, status, want.code, want.reason, want.status, err)
			}
			if !strings.Contains(err.Error(), "instances.list") {
				t.Errorf("the error does not say it was injected on instances.list: %v", err)
			}
		})
	}
}

// TestOutageScope: a fault takes only the operations and zones it names; global operations
// and other zones answer, and a VM's metadata server is never faulted.
func TestOutageScope(t *testing.T) {
	e := newOutageEnv(t)
	ctx := context.Background()
	e.fake.Outages().Set(fakefault.Fault{Status: 503, Zone: "us-central1-b", Ops: []string{OpInstancesList, OpInstancesInsert}})
	if code, _, _ := envelope(t, e.list(ctx, "us-central1-b")); code != 503 {
		t.Fatalf("instances.list in the faulted zone: %d, want 503", code)
	}
	if err := e.list(ctx, "us-central1-a"); err != nil {
		t.Fatalf("instances.list in another zone: %v", err)
	}
	_, err := e.ic.Insert(ctx, &computepb.InsertInstanceRequest{Project: "p", Zone: "us-central1-b", InstanceResource: vmResource("vm-1")})
	if code, _, _ := envelope(t, err); code != 503 {
		t.Fatalf("instances.insert in the faulted zone: %d, want 503", code)
	}
	_, err = e.ic.Get(ctx, &computepb.GetInstanceRequest{Project: "p", Zone: "us-central1-b", Instance: "vm-1"}, noRetry)
	if code, reason, _ := envelope(t, err); code != 404 || reason != "notFound" {
		t.Fatalf("instances.get (not faulted) of a VM the fault kept from being made: %d %s, want 404 notFound", code, reason)
	}
	if _, err := e.zc.Get(ctx, &computepb.GetZoneRequest{Project: "p", Zone: "us-central1-b"}, noRetry); err != nil {
		t.Fatalf("zones.get (not faulted): %v", err)
	}

	// A fault limited to a zone never takes a global operation; one limited to nothing does.
	_, err = e.gc.Get(ctx, &computepb.GetGlobalOperationRequest{Project: "p", Operation: "nope"}, noRetry)
	if code, _, _ := envelope(t, err); code != 404 {
		t.Fatalf("globalOperations.get under a zone's fault: %d, want the fake's own 404", code)
	}
	e.fake.Outages().Set(fakefault.Fault{Status: 503})
	_, err = e.gc.Get(ctx, &computepb.GetGlobalOperationRequest{Project: "p", Operation: "nope"}, noRetry)
	if code, _, _ := envelope(t, err); code != 503 {
		t.Fatalf("globalOperations.get under a fault everywhere: %d, want 503", code)
	}

	// The metadata server still answers in its own way (403 without Metadata-Flavor).
	resp, err := http.Get(e.url + metadataPrefix + "us-central1-a/vm-1/computeMetadata/v1/instance/preempted")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("metadata server under a fault everywhere: %d, want its own 403", resp.StatusCode)
	}
}

// TestOutageHang: a hung request gets no answer until the client gives up (its deadline cuts
// it), the hang is cleared (it is then served), or the fake closes (the connection drops).
func TestOutageHang(t *testing.T) {
	e := newOutageEnv(t)
	e.fake.Outages().Set(fakefault.Fault{Hang: true, Zone: "us-central1-a"})

	// instances.get: the REST clients' List requests do not carry their ctx (only an HTTP
	// client's own timeout cuts them, which is why Ferry's provider sets one).
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	start := time.Now()
	_, err := e.ic.Get(ctx, &computepb.GetInstanceRequest{Project: "p", Zone: "us-central1-a", Instance: "vm-1"}, noRetry)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a hung get: %v, want the client's deadline", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the client's deadline cut the call after %v", took)
	}
	if err := e.list(context.Background(), "us-central1-b"); err != nil {
		t.Fatalf("another zone during the hang: %v", err)
	}

	answered := make(chan error, 1)
	go func() { answered <- e.list(context.Background(), "us-central1-a") }()
	select {
	case err := <-answered:
		t.Fatalf("a hung list answered before the hang was cleared: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	e.fake.Outages().Clear()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("a hung list released by Clear: %v, want it served", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Clear did not release the hung list")
	}

	// A hung insert whose client gave up is not served when the hang ends: nobody would know
	// of its VM.
	e.fake.Outages().Set(fakefault.Fault{Hang: true, Ops: []string{OpInstancesInsert}})
	ictx, icancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err = e.ic.Insert(ictx, &computepb.InsertInstanceRequest{Project: "p", Zone: "us-central1-a", InstanceResource: vmResource("orphan")})
	icancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a hung insert: %v, want the client's deadline", err)
	}
	for deadline := time.Now().Add(10 * time.Second); e.fake.Outages().Held() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the fake still holds the insert its client gave up")
		}
	}
	e.fake.Outages().Clear()
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if _, _, ok := e.fake.Instance("orphan"); ok {
			t.Fatal("a hung insert was served after its client had gone")
		}
	}

	e.fake.Outages().Set(fakefault.Fault{Hang: true})
	go func() { answered <- e.list(context.Background(), "us-central1-a") }()
	select {
	case err := <-answered:
		t.Fatalf("a hung list answered before the fake closed: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	e.fake.Close()
	select {
	case err := <-answered:
		if err == nil {
			t.Fatal("a hung list dropped by Close got an answer")
		}
		var gerr *googleapi.Error
		if errors.As(err, &gerr) {
			t.Fatalf("a hung list dropped by Close got an HTTP answer: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not drop the hung list")
	}
}

// TestOutageDelayAndRecovery: a slow endpoint answers, late; a fault with For ends by itself.
func TestOutageDelayAndRecovery(t *testing.T) {
	e := newOutageEnv(t)
	ctx := context.Background()
	e.fake.Outages().Set(fakefault.Fault{Delay: 300 * time.Millisecond})
	start := time.Now()
	if err := e.list(ctx, "us-central1-a"); err != nil {
		t.Fatalf("a slow list: %v", err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("a slow list answered after %v, want at least 300ms", took)
	}

	e.fake.Outages().Set(fakefault.Fault{Status: 503, For: 500 * time.Millisecond})
	if code, _, _ := envelope(t, e.list(ctx, "us-central1-a")); code != 503 {
		t.Fatalf("during the outage: %d, want 503", code)
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.list(ctx, "us-central1-a") != nil {
		if time.Now().After(deadline) {
			t.Fatal("the outage did not end after its For")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := e.ic.Insert(ctx, &computepb.InsertInstanceRequest{Project: "p", Zone: "us-central1-a",
		InstanceResource: &computepb.Instance{Name: proto.String("vm-2"), MachineType: proto.String("zones/us-central1-a/machineTypes/e2-small")}}); err != nil {
		t.Fatalf("insert after the outage: %v", err)
	}
}
