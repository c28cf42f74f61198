package gcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"
	"google.golang.org/api/googleapi"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/gcp/fakecompute"
	"github.com/ferryserve/ferry/launcher/internal/vmjobtest"
)

const project = "ferry-test"

var testZones = []string{"us-central1-a", "us-central1-b", "us-east1-b"}

// TestMain builds the ferry binary and puts it on PATH, so a fake VM's startup script can run
// `ferry replica-sim` as a real replica would.
func TestMain(m *testing.M) {
	if os.Getenv(vmjobtest.EnvGangNode) != "" {
		os.Exit(vmjobtest.GangNode())
	}
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "ferry-gcp-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		build := exec.Command("go", "build", "-o", filepath.Join(dir, "ferry"), "./cmd/ferry")
		build.Dir = filepath.Join("..", "..")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build ferry:", err)
			return 1
		}
		os.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
		return m.Run()
	}())
}

type env struct {
	fake *fakecompute.Server
	url  string
	prov *Provider
	// requests counts the API requests the fake was sent, by method and path.
	requests *requestCounter
}

// newEnv starts a fake Compute API and a provider aimed at it (the test's logger unless popts
// has one).
func newEnv(t *testing.T, fopts fakecompute.Options, popts Options) *env {
	t.Helper()
	fopts.Project = project
	fopts.Zones = testZones
	fopts.Dir = t.TempDir()
	fake := fakecompute.New(fopts)
	counter := &requestCounter{next: fake, n: map[string]int{}}
	srv := httptest.NewServer(counter)
	t.Cleanup(srv.Close)
	t.Cleanup(fake.Close) // first: it drops the requests a hang holds, which srv.Close waits for
	popts.Project = project
	popts.Endpoint = srv.URL
	if popts.Zones == nil {
		popts.Zones = testZones
	}
	popts.PollInterval = 10 * time.Millisecond
	popts.NoticeInterval = 20 * time.Millisecond
	popts.LaunchTimeout = 30 * time.Second
	if popts.Logger == nil {
		popts.Logger = zaptest.NewLogger(t)
	}
	prov, err := New(context.Background(), popts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prov.Close)
	return &env{fake: fake, url: srv.URL, prov: prov, requests: counter}
}

// requestCounter counts the requests it passes on, by "METHOD PATH".
type requestCounter struct {
	next http.Handler
	mu   sync.Mutex
	n    map[string]int
}

func (c *requestCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	c.n[r.Method+" "+r.URL.Path]++
	c.mu.Unlock()
	c.next.ServeHTTP(w, r)
}

// count is how many requests were sent as "METHOD PATH", the path under the project.
func (c *requestCounter) count(methodPath string) int {
	method, path, _ := strings.Cut(methodPath, " ")
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[method+" /compute/v1/projects/"+project+"/"+path]
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func spec(name string, pl launcher.Placement) launcher.Spec {
	pl.Infra = InfraName
	if pl.Zone == "" {
		pl.Zone = "us-central1-a"
	}
	return launcher.Spec{
		Name:      name,
		Labels:    map[string]string{launcher.LabelService: "chat", launcher.LabelVersion: "1", launcher.LabelReplicaID: name},
		Run:       "exec sleep 300",
		Port:      18080,
		Placement: pl,
	}
}

// waitFor polls cond until it holds or the deadline passes (observed state, not a sleep).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

func TestLaunchServesAndTerminates(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	s := spec("chat-1", launcher.Placement{InstanceType: "g2-standard-4", Accelerator: "L4", AcceleratorCount: 1, PricePerHour: 0.70683})
	s.Run = "exec ferry replica-sim"
	s.Envs = map[string]string{"HF_TOKEN": "secret value with 'quotes'"}
	inst, err := e.prov.Launch(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(inst.ID, "gcp/us-central1-a/chat-1-") || inst.State != launcher.StateRunning ||
		!strings.HasPrefix(inst.Endpoint, "127.66.") || !strings.HasSuffix(inst.Endpoint, ":18080") ||
		inst.PricePerHour != 0.70683 || inst.Spot || inst.Region != "us-central1" {
		t.Fatalf("instance = %+v", inst)
	}
	healthy := func() bool {
		resp, err := http.Get("http://" + inst.Endpoint + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	waitFor(t, "the replica's /health", healthy)

	vm, _, ok := e.fake.Instance(inst.Name)
	if !ok {
		t.Fatal("fake has no instance")
	}
	if got := vm.GetScheduling().GetOnHostMaintenance(); got != "TERMINATE" {
		t.Errorf("onHostMaintenance = %q, want TERMINATE for a g2 (GPU) machine", got)
	}
	if len(vm.GetGuestAccelerators()) != 0 {
		t.Errorf("g2 has built-in GPUs, got guestAccelerators %v", vm.GetGuestAccelerators())
	}
	script := metadataValue(vm, metaStartup)
	for _, want := range []string{`export HF_TOKEN='secret value with '\''quotes'\'''`, "export FERRY_PORT=18080", "export FERRY_HOST=${FERRY_HOST:-0.0.0.0}", "exec ferry replica-sim"} {
		if !strings.Contains(script, want) {
			t.Errorf("startup script lacks %q:\n%s", want, script)
		}
	}
	fw, ok := e.fake.Firewall("ferry-allow-18080")
	if !ok || fw.GetAllowed()[0].GetPorts()[0] != "18080" || fw.GetTargetTags()[0] != "ferry-port-18080" {
		t.Fatalf("firewall = %v", fw)
	}
	// A second launch on the same port reuses the rule.
	if _, err := e.prov.Launch(ctx, spec("chat-2", launcher.Placement{InstanceType: "n1-standard-4"})); err != nil {
		t.Fatal(err)
	}

	if err := e.prov.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replica to stop serving", func() bool { return !healthy() })
	if err := e.prov.Terminate(ctx, inst.ID); err != nil {
		t.Errorf("terminate of a deleted VM = %v, want nil", err)
	}
	if err := e.prov.Terminate(ctx, "gcp/us-central1-a/never-was"); err != nil {
		t.Errorf("terminate of an unknown VM = %v, want nil", err)
	}
	if err := e.prov.Terminate(ctx, "aws/i-123"); !errors.Is(err, launcher.ErrNotFound) {
		t.Errorf("terminate of a foreign id = %v, want ErrNotFound", err)
	}
	list, err := e.prov.List(ctx, map[string]string{launcher.LabelReplicaID: "chat-1"})
	if err != nil || len(list) != 0 {
		t.Fatalf("List after terminate = %v, %v", list, err)
	}
}

func TestPlacements(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	accel := func(zone, typ string, n int32) string {
		return fmt.Sprintf("zones/%s/acceleratorTypes/%s×%d", zone, typ, n)
	}
	tests := []struct {
		name          string
		placement     launcher.Placement
		wantAccels    []string
		wantMachine   string
		wantHostMaint string
		wantModel     string
		wantAction    string
		wantRestart   bool
	}{
		{name: "a2 built-in A100", placement: launcher.Placement{InstanceType: "a2-highgpu-1g", Accelerator: "A100", AcceleratorCount: 1},
			wantMachine: "a2-highgpu-1g", wantHostMaint: "TERMINATE", wantRestart: true},
		{name: "composed n1 + T4x2", placement: launcher.Placement{Zone: "us-central1-b", InstanceType: "n1-standard-8", Accelerator: "T4", AcceleratorCount: 2},
			wantMachine: "n1-standard-8", wantAccels: []string{accel("us-central1-b", "nvidia-tesla-t4", 2)}, wantHostMaint: "TERMINATE", wantRestart: true},
		{name: "composed n1 + V100 spot", placement: launcher.Placement{InstanceType: "n1-highmem-8", Accelerator: "V100", AcceleratorCount: 1, Spot: true},
			wantMachine: "n1-highmem-8", wantAccels: []string{accel("us-central1-a", "nvidia-tesla-v100", 1)}, wantHostMaint: "TERMINATE", wantModel: "SPOT", wantAction: "STOP"},
		{name: "cpu only", placement: launcher.Placement{InstanceType: "n1-standard-4"},
			wantMachine: "n1-standard-4", wantHostMaint: "MIGRATE", wantRestart: true},
		{name: "region only picks an allowed zone", placement: launcher.Placement{Region: "us-east1", InstanceType: "g2-standard-8", Accelerator: "L4", AcceleratorCount: 1, Spot: true},
			wantMachine: "g2-standard-8", wantHostMaint: "TERMINATE", wantModel: "SPOT", wantAction: "STOP"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := spec(fmt.Sprintf("p-%d", i), tt.placement)
			if tt.placement.Zone == "" && tt.placement.Region != "" {
				s.Placement.Zone = ""
			}
			inst, err := e.prov.Launch(ctx, s)
			if err != nil {
				t.Fatal(err)
			}
			if inst.Spot != tt.placement.Spot {
				t.Errorf("Spot = %v", inst.Spot)
			}
			if tt.placement.Region != "" && inst.Region != tt.placement.Region {
				t.Errorf("Region = %q, want %q", inst.Region, tt.placement.Region)
			}
			vm, zone, _ := e.fake.Instance(inst.Name)
			var accels []string
			for _, a := range vm.GetGuestAccelerators() {
				accels = append(accels, fmt.Sprintf("%s×%d", a.GetAcceleratorType(), a.GetAcceleratorCount()))
			}
			sch := vm.GetScheduling()
			got := []any{lastSegment(vm.GetMachineType()), accels, sch.GetOnHostMaintenance(), sch.GetProvisioningModel(), sch.GetInstanceTerminationAction(), sch.GetAutomaticRestart(), zone}
			want := []any{tt.wantMachine, tt.wantAccels, tt.wantHostMaint, tt.wantModel, tt.wantAction, tt.wantRestart, inst.Zone}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("VM (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLabelsAndList(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	a := spec("chat-1", launcher.Placement{InstanceType: "n1-standard-4"})
	a.Labels["team"] = "ML.Research_1"
	b := spec("code-1", launcher.Placement{Zone: "us-east1-b", InstanceType: "n1-standard-4", Spot: true})
	b.Labels[launcher.LabelService] = "code"
	ia, err := e.prov.Launch(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	ib, err := e.prov.Launch(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	vm, _, _ := e.fake.Instance(ia.Name)
	wantGCP := map[string]string{"ferry-service": "chat", "ferry-version": "1", "ferry-replica-id": "chat-1",
		"ferry-managed": "true", "team": "_4d_4c_2e_52esearch_5f1"}
	if diff := cmp.Diff(wantGCP, vm.GetLabels()); diff != "" {
		t.Errorf("GCP labels (-want +got):\n%s", diff)
	}

	all, err := e.prov.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 {
		t.Fatalf("List(nil) = %d instances, want 2", len(all))
	}
	chat, err := e.prov.List(ctx, map[string]string{launcher.LabelService: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	wantLabels := map[string]string{launcher.LabelService: "chat", launcher.LabelVersion: "1", launcher.LabelReplicaID: "chat-1",
		launcher.LabelOwner: "true", "team": "ML.Research_1"}
	if len(chat) != 1 || chat[0].ID != ia.ID || chat[0].State != launcher.StateRunning || chat[0].Endpoint != ia.Endpoint {
		t.Fatalf("List(chat) = %+v, want %s", chat, ia.ID)
	}
	if diff := cmp.Diff(wantLabels, chat[0].Labels); diff != "" {
		t.Errorf("decoded labels (-want +got):\n%s", diff)
	}
	code, err := e.prov.List(ctx, map[string]string{launcher.LabelService: "code"})
	if err != nil || len(code) != 1 || code[0].ID != ib.ID || !code[0].Spot || code[0].Zone != "us-east1-b" {
		t.Fatalf("List(code) = %+v, %v", code, err)
	}
	none, err := e.prov.List(ctx, map[string]string{"team": "other"})
	if err != nil || len(none) != 0 {
		t.Fatalf("List(team=other) = %+v, %v", none, err)
	}
}

func TestLabelEncodingRoundTrips(t *testing.T) {
	for _, k := range []string{"ferry.service", "ferry.replica-id", "ferry-x", "team", "A.b_c", "ferry.", "héllo"} {
		enc := encodeLabelKey(k)
		dec, err := decodeLabelKey(enc)
		if err != nil || dec != k {
			t.Errorf("key %q → %q → %q, %v", k, enc, dec, err)
		}
		if v := escapeLabel(k); strings.Trim(v, "abcdefghijklmnopqrstuvwxyz0123456789_-") != "" {
			t.Errorf("escaped %q = %q has characters GCP refuses", k, v)
		}
		if dv, _ := unescapeLabel(escapeLabel(k)); dv != k {
			t.Errorf("value %q round trip = %q", k, dv)
		}
	}
	if got := encodeLabelKey("ferry.service"); got != "ferry-service" {
		t.Errorf("ferry.service → %q, want ferry-service", got)
	}
}

func TestTypedErrors(t *testing.T) {
	type result struct {
		want      error
		opError   bool // an *OperationError is in the chain
		httpError int  // the *googleapi.Error's code, 0 for none
	}
	tests := []struct {
		name  string
		fault fakecompute.Fault
		want  result
	}{
		{"op ZONE_RESOURCE_POOL_EXHAUSTED", fakecompute.Fault{Code: fakecompute.CodeZoneResourcePoolExhausted}, result{launcher.ErrNoCapacity, true, 0}},
		{"op ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", fakecompute.Fault{Code: fakecompute.CodeZoneResourcePoolExhaustedWithDetails}, result{launcher.ErrNoCapacity, true, 0}},
		{"op QUOTA_EXCEEDED", fakecompute.Fault{Code: fakecompute.CodeQuotaExceeded}, result{launcher.ErrQuota, true, 0}},
		{"op UNSUPPORTED_OPERATION", fakecompute.Fault{Code: fakecompute.CodeUnsupportedOperation}, result{launcher.ErrInvalid, true, 0}},
		{"http 503 resourcePoolExhausted", fakecompute.Fault{Code: fakecompute.CodeZoneResourcePoolExhausted, HTTP: true}, result{launcher.ErrNoCapacity, false, 503}},
		{"http 403 quotaExceeded", fakecompute.Fault{Code: fakecompute.CodeQuotaExceeded, HTTP: true}, result{launcher.ErrQuota, false, 403}},
		{"http 400 unsupportedOperation", fakecompute.Fault{Code: fakecompute.CodeUnsupportedOperation, HTTP: true}, result{launcher.ErrInvalid, false, 400}},
		{"http 403 forbidden", fakecompute.Fault{Code: "PERMISSION_DENIED", HTTP: true}, result{launcher.ErrUnauthorized, false, 403}},
		{"http 400 invalid", fakecompute.Fault{Code: "INVALID", HTTP: true}, result{launcher.ErrInvalid, false, 400}},
	}
	for _, delay := range []time.Duration{fakecompute.DefaultOpDelay, -1} {
		e := newEnv(t, fakecompute.Options{OpDelay: delay}, Options{})
		for i, tt := range tests {
			t.Run(fmt.Sprintf("%s/opdelay=%v", tt.name, delay), func(t *testing.T) {
				ctx := testCtx(t)
				e.fake.InjectFault("us-central1-b", fakecompute.Fault{Code: tt.fault.Code, HTTP: tt.fault.HTTP, Times: 1})
				_, err := e.prov.Launch(ctx, spec(fmt.Sprintf("e-%d", i), launcher.Placement{Zone: "us-central1-b", InstanceType: "n1-standard-4"}))
				checkError(t, err, tt.want.want)
				if got := errors.As(err, new(*OperationError)); got != tt.want.opError {
					t.Errorf("OperationError in chain = %v, want %v: %v", got, tt.want.opError, err)
				}
				var gerr *googleapi.Error
				if got := errors.As(err, &gerr); got != (tt.want.httpError != 0) || got && gerr.Code != tt.want.httpError {
					t.Errorf("googleapi.Error in chain = %v (%v), want code %d", got, gerr, tt.want.httpError)
				}
				if list, err := e.prov.List(ctx, nil); err != nil || len(list) != 0 {
					t.Errorf("a failed launch left %v (%v)", list, err)
				}
			})
		}
	}
}

func checkError(t *testing.T, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("err = %v, want %v", err, want)
	}
	for _, other := range []error{launcher.ErrNoCapacity, launcher.ErrQuota, launcher.ErrInvalid, launcher.ErrUnauthorized} {
		if other != want && errors.Is(err, other) {
			t.Errorf("err = %v is also %v", err, other)
		}
	}
	if got, retry := launcher.IsRetryable(err), want == launcher.ErrNoCapacity || want == launcher.ErrQuota; got != retry {
		t.Errorf("IsRetryable = %v, want %v", got, retry)
	}
}

// TestModelledLimits exercises the fake's own capacity and quota accounting, not injected
// faults, and a zone the project does not have.
func TestModelledLimits(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{Zones: append([]string{"us-west1-a"}, testZones...)})
	ctx := testCtx(t)
	e.fake.SetCapacity("us-central1-a", "a2-highgpu-1g", 1)
	a2 := launcher.Placement{InstanceType: "a2-highgpu-1g", Accelerator: "A100", AcceleratorCount: 1}
	if _, err := e.prov.Launch(ctx, spec("cap-1", a2)); err != nil {
		t.Fatal(err)
	}
	_, err := e.prov.Launch(ctx, spec("cap-2", a2))
	checkError(t, err, launcher.ErrNoCapacity)
	a2.Zone = "us-central1-b"
	if _, err := e.prov.Launch(ctx, spec("cap-3", a2)); err != nil {
		t.Fatalf("another zone has capacity: %v", err)
	}

	e.fake.SetGPUQuota("us-east1", 2)
	t4 := launcher.Placement{Zone: "us-east1-b", InstanceType: "n1-standard-8", Accelerator: "T4", AcceleratorCount: 2}
	if _, err := e.prov.Launch(ctx, spec("quota-1", t4)); err != nil {
		t.Fatal(err)
	}
	_, err = e.prov.Launch(ctx, spec("quota-2", t4))
	checkError(t, err, launcher.ErrQuota)

	_, err = e.prov.Launch(ctx, spec("nozone", launcher.Placement{Zone: "us-west1-a", InstanceType: "n1-standard-4"}))
	checkError(t, err, launcher.ErrInvalid)
	_, err = e.prov.Launch(ctx, spec("notallowed", launcher.Placement{Zone: "europe-west4-a", InstanceType: "n1-standard-4"}))
	checkError(t, err, launcher.ErrInvalid)
}

func TestPreemption(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx, cancel := context.WithCancel(testCtx(t))
	notices := e.prov.Notices(ctx)
	// The watcher polls the fake until its context ends: stop it and wait for it before the
	// environment's cleanup (registered earlier, so run later) tears the fake down under it.
	t.Cleanup(func() {
		cancel()
		for range notices {
		}
	})
	spot, err := e.prov.Launch(ctx, spec("spot-1", launcher.Placement{InstanceType: "g2-standard-4", Accelerator: "L4", AcceleratorCount: 1, Spot: true}))
	if err != nil {
		t.Fatal(err)
	}
	onDemand, err := e.prov.Launch(ctx, spec("od-1", launcher.Placement{InstanceType: "g2-standard-4", Accelerator: "L4", AcceleratorCount: 1}))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.fake.Preempt(onDemand.Name); err == nil {
		t.Error("the fake preempted an on-demand VM")
	}
	before := time.Now().Add(-time.Second)
	if err := e.fake.Preempt(spot.Name); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-notices:
		if n.InstanceID != spot.ID || n.At.Before(before) {
			t.Errorf("notice = %+v, want %s", n, spot.ID)
		}
	case <-ctx.Done():
		t.Fatal("no preemption notice")
	}
	list, err := e.prov.List(ctx, map[string]string{launcher.LabelService: "chat"})
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]launcher.State{}
	for _, in := range list {
		states[in.ID] = in.State
		if in.ID == spot.ID && !strings.Contains(in.Reason, "preempted") {
			t.Errorf("reason = %q", in.Reason)
		}
	}
	if diff := cmp.Diff(map[string]launcher.State{spot.ID: launcher.StatePreempted, onDemand.ID: launcher.StateRunning}, states); diff != "" {
		t.Errorf("states (-want +got):\n%s", diff)
	}
	if err := e.prov.Terminate(ctx, spot.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-notices:
		t.Errorf("second notice %+v for one preemption", n)
	default:
	}
}

func TestGang(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	pl := launcher.Placement{Zone: "us-central1-b", InstanceType: "a2-highgpu-8g", Accelerator: "A100", AcceleratorCount: 8}
	s := spec("train", pl)
	s.Labels = map[string]string{"ferry.job": "train"}
	insts, err := launcher.LaunchGang(ctx, e.prov, s, 3)
	if err != nil {
		t.Fatal(err)
	}
	for rank, in := range insts {
		vm, zone, _ := e.fake.Instance(in.Name)
		if zone != "us-central1-b" || !strings.HasPrefix(in.Name, fmt.Sprintf("train-%d-", rank)) || in.Labels[launcher.LabelNodeRank] != fmt.Sprint(rank) ||
			!strings.Contains(metadataValue(vm, metaStartup), fmt.Sprintf("export SKYPILOT_NODE_RANK='%d'", rank)) {
			t.Errorf("node %d = %+v in %s", rank, in, zone)
		}
	}
	for _, in := range insts {
		if err := e.prov.Terminate(ctx, in.ID); err != nil {
			t.Fatal(err)
		}
	}

	// Room for two of three: nothing may be left behind.
	e.fake.SetCapacity("us-central1-b", "a2-highgpu-8g", 2)
	_, err = launcher.LaunchGang(ctx, e.prov, s, 3)
	checkError(t, err, launcher.ErrNoCapacity)
	left, err := e.prov.List(ctx, map[string]string{"ferry.job": "train"})
	if err != nil || len(left) != 0 {
		t.Fatalf("a failed gang left %+v (%v)", left, err)
	}
}

func TestCredentials(t *testing.T) {
	denied := map[string]int{"revoked": http.StatusUnauthorized, "viewer": http.StatusForbidden}
	for _, tok := range []string{"revoked", "viewer"} {
		t.Run(tok, func(t *testing.T) {
			e := newEnv(t, fakecompute.Options{DeniedTokens: denied}, Options{Token: tok})
			ctx := testCtx(t)
			checkError(t, e.prov.Check(ctx), launcher.ErrUnauthorized)
			_, err := e.prov.Launch(ctx, spec("x", launcher.Placement{InstanceType: "n1-standard-4"}))
			checkError(t, err, launcher.ErrUnauthorized)
			_, err = e.prov.List(ctx, nil)
			checkError(t, err, launcher.ErrUnauthorized)
		})
	}
	t.Run("good token", func(t *testing.T) {
		e := newEnv(t, fakecompute.Options{DeniedTokens: denied}, Options{Token: "fine"})
		ctx := testCtx(t)
		if err := e.prov.Check(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := e.prov.Launch(ctx, spec("x", launcher.Placement{InstanceType: "n1-standard-4"})); err != nil {
			t.Fatal(err)
		}
	})
}
