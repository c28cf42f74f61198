package gcp

import (
	"bytes"
	"context"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/fakefault"
	"github.com/ferryserve/ferry/launcher/gcp/fakecompute"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

// Loops that call the API (the preemption watcher, a followed serial port) while it fails:
// they back off instead of asking every tick, say so when the failure starts and ends rather
// than every tick, and lose nothing.

// TestFaultNoticesBackOff: while one zone fails, the preemption watcher goes on watching the
// others every tick, asks the failing zone less and less often, and says so once; when it
// answers again, its preemption is noticed and that is said once too.
func TestFaultNoticesBackOff(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	e := newEnv(t, fakecompute.Options{}, Options{Logger: zap.New(core)})
	ctx, cancel := context.WithCancel(testCtx(t))
	spotPlacement := func(zone string) launcher.Placement {
		return launcher.Placement{Zone: zone, InstanceType: "n1-standard-4", Spot: true}
	}
	healthy, err := e.prov.Launch(ctx, spec("spot-a", spotPlacement("us-central1-a")))
	if err != nil {
		t.Fatal(err)
	}
	failing, err := e.prov.Launch(ctx, spec("spot-b", spotPlacement("us-central1-b")))
	if err != nil {
		t.Fatal(err)
	}
	notices := e.prov.Notices(ctx)
	t.Cleanup(func() {
		cancel()
		for range notices {
		}
	})
	waitNotice := func(id string) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case n := <-notices:
				if n.InstanceID == id {
					return
				}
			case <-timeout:
				t.Fatalf("no notice for %s", id)
			}
		}
	}
	polls := func(zone string) int { return e.requests.count("GET zones/" + zone + "/operations") }

	e.fake.Outages().Set(fakefault.Fault{Status: 503, Zone: "us-central1-b"})
	healthy0, failing0 := polls("us-central1-a"), polls("us-central1-b")
	if err := e.fake.Preempt(healthy.Name); err != nil {
		t.Fatal(err)
	}
	waitNotice(healthy.ID)
	waitFor(t, "60 polls of the healthy zone", func() bool { return polls("us-central1-a")-healthy0 >= 60 })
	healthyPolls := polls("us-central1-a") - healthy0
	failingPolls := polls("us-central1-b") - failing0 // lists are not retried by the SDK
	// Backing off from 20 ms, doubling, a zone is asked at most ~13 times in the 30 s the wait
	// above may take; once a tick (20 ms) would be 60 or more.
	if failingPolls > 14 || failingPolls*4 > healthyPolls {
		t.Fatalf("the failing zone was polled %d times while the healthy one was %d times: no back-off", failingPolls, healthyPolls)
	}
	warned := logs.FilterMessageSnippet("zone not answering").FilterField(zap.String("zone", "us-central1-b"))
	if warned.Len() != 1 || warned.All()[0].Level != zap.WarnLevel {
		t.Fatalf("the failing zone was warned about %d times, want once: %v", warned.Len(), warned.All())
	}

	e.fake.Outages().Clear()
	if err := e.fake.Preempt(failing.Name); err != nil {
		t.Fatal(err)
	}
	waitNotice(failing.ID)
	waitFor(t, "the zone's recovery logged", func() bool {
		return logs.FilterMessageSnippet("zone answers again").FilterField(zap.String("zone", "us-central1-b")).Len() == 1
	})
	if n := logs.FilterMessageSnippet("zone not answering").Len(); n != 1 {
		t.Fatalf("%d warnings of zones not answering, want the one", n)
	}
}

// syncBuffer is a bytes.Buffer a stream writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestFaultFollowedLogsRideOutAnOutage: a followed serial port whose reads fail for a while is
// read less often, warned about once, and goes on where it stopped when the API answers: no
// line is lost and the stream ends when the VM does.
func TestFaultFollowedLogsRideOutAnOutage(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	e := newEnv(t, fakecompute.Options{}, Options{LogInterval: 20 * time.Millisecond, Logger: zap.New(core)})
	ctx := testCtx(t)
	goFile := t.TempDir() + "/go"
	s := jobSpecFor("logs", "", `for i in 1 2 3; do echo "line $i"; done
while [ ! -e "$GO_FILE" ]; do sleep 0.05; done
echo "line 4"; exit 0`, false)
	s.Envs = map[string]string{"GO_FILE": goFile}
	in, err := e.prov.Launch(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	var followed syncBuffer
	var stalled atomic.Int64 // failed reads the stream reported
	done := make(chan error, 1)
	opts := launcher.LogOptions{Tail: -1, Follow: true, Stalled: func(error) { stalled.Add(1) }}
	go func() { done <- e.prov.StreamLogs(ctx, in.ID, opts, &followed) }()
	waitFor(t, "line 3 followed", func() bool { return strings.Contains(followed.String(), "line 3\n") })
	if n := stalled.Load(); n != 0 {
		t.Fatalf("%d reads reported failing before the outage", n)
	}

	e.fake.Outages().Set(fakefault.Fault{Status: 503, Zone: in.Zone, Ops: []string{fakecompute.OpInstancesGetSerialPort, fakecompute.OpInstancesGet}})
	// Each poll asks whether the VM ended (instances.get) before it reads the port.
	reads := func() int {
		vm := "GET zones/" + in.Zone + "/instances/" + in.Name
		return e.requests.count(vm) + e.requests.count(vm+"/serialPort")
	}
	during := reads()
	waitFor(t, "reads failing", func() bool { return reads()-during >= 2*DefaultMaxAttempts })
	// Whoever waits for the output's end hears that the infra holds it up.
	waitFor(t, "a failed read reported", func() bool { return stalled.Load() > 0 })
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the VM to end", func() bool { return strings.Contains(e.fake.SerialOutput(in.Zone, in.Name), vmnode.ExitMarker) })
	select {
	case err := <-done:
		t.Fatalf("the stream ended during the outage: %v", err)
	default:
	}
	e.fake.Outages().Clear()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the stream failed: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stream did not end after the VM did")
	}
	if !strings.Contains(followed.String(), "line 1\nline 2\nline 3\n") || !strings.Contains(followed.String(), "line 4\n") ||
		!strings.Contains(followed.String(), vmnode.ExitMarker+"0\n") {
		t.Fatalf("followed logs lost lines:\n%s", followed.String())
	}
	if n := logs.FilterMessageSnippet("the API is not answering").Len(); n != 1 {
		t.Fatalf("the outage was warned about %d times, want once", n)
	}
	if n := logs.FilterMessageSnippet("the API answers again").Len(); n != 1 {
		t.Fatalf("the recovery was logged %d times, want once", n)
	}
}
