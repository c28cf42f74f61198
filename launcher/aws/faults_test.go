package aws

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
	"github.com/ferryserve/ferry/launcher/fakefault"
)

// What the provider does when EC2 fails: real SDK clients against fakeec2 with its outage
// switch set (fakeec2/faults.go).

const westRegion = "us-west-2"

// faultProvider is a provider on fake like newProvider's, with a short request timeout, its
// warnings and infos observed, and mod applied to its options.
func faultProvider(t *testing.T, fake *fakeec2.Server, mod func(*Options)) (*Provider, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	o := Options{
		Regions:        []string{testRegion, westRegion},
		Endpoint:       fake.URL(),
		Credentials:    credentials.NewStaticCredentialsProvider(goodKey, "secret", ""),
		AMIs:           map[string]string{testRegion: "ami-0123456789abcdef0", westRegion: "ami-0fedcba9876543210"},
		LaunchTimeout:  testTimeout,
		PollInterval:   10 * time.Millisecond,
		NoticeInterval: 20 * time.Millisecond,
		LogInterval:    20 * time.Millisecond,
		RequestTimeout: time.Second,
		Logger:         zap.New(core),
	}
	if mod != nil {
		mod(&o)
	}
	p, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return p, logs
}

// gapWheres names a partial list's gaps ("aws/us-west-2"); it fails the test when err is not
// a partial list.
func gapWheres(t *testing.T, err error) []string {
	t.Helper()
	gaps, ok := launcher.Partial(err)
	if !ok {
		t.Fatalf("List error %v is not a partial list", err)
	}
	var out []string
	for _, g := range gaps {
		out = append(out, g.Where())
	}
	slices.Sort(out)
	return out
}

func instanceIDs(insts []launcher.Instance) []string {
	var out []string
	for _, in := range insts {
		out = append(out, in.ID)
	}
	slices.Sort(out)
	return out
}

func westSpec(name string) launcher.Spec {
	s := spec(name, "exec sleep 300", false)
	s.Placement.Region, s.Placement.Zone = westRegion, "usw2-az1"
	return s
}

// TestFaultsClassified: EC2 failing everywhere, each way it fails: List answers a partial list
// naming both regions, Launch, Terminate and Check fail, and every error wraps the typed error
// of the failure (ErrUnavailable, ErrThrottled) once the SDK's bounded retries gave up.
func TestFaultsClassified(t *testing.T) {
	for name, tc := range map[string]struct {
		fault fakefault.Fault
		want  error
	}{
		"503 Unavailable":        {fault: fakefault.Fault{Status: 503}, want: launcher.ErrUnavailable},
		"500 InternalError":      {fault: fakefault.Fault{Status: 500}, want: launcher.ErrUnavailable},
		"503 ServiceUnavailable": {fault: fakefault.Fault{Status: 503, Code: "ServiceUnavailable"}, want: launcher.ErrUnavailable},
		"504 of a code unknown":  {fault: fakefault.Fault{Status: 504, Code: "GatewayGaveUp"}, want: launcher.ErrUnavailable},
		"throttling":             {fault: fakefault.Fault{Throttle: true}, want: launcher.ErrThrottled},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, fakeec2.Options{}, goodKey)
			p, _ := faultProvider(t, e.fake, nil)
			ctx := context.Background()
			before, err := p.Launch(ctx, spec("before", "exec sleep 300", false))
			if err != nil {
				t.Fatal(err)
			}
			e.fake.Outages().Set(tc.fault)

			calls := e.fake.Calls("DescribeInstances", testRegion)
			insts, err := p.List(ctx, nil)
			if !errors.Is(err, tc.want) {
				t.Fatalf("List: %v, want %v", err, tc.want)
			}
			// Every region failed: one gap for the whole infra, naming each region.
			if got, want := gapWheres(t, err), []string{"aws"}; !slices.Equal(got, want) || !strings.Contains(err.Error(), testRegion) || !strings.Contains(err.Error(), westRegion) {
				t.Fatalf("gaps %v (%v), want %v naming both regions", got, err, want)
			}
			if len(insts) != 0 {
				t.Fatalf("List under the fault listed %v", instanceIDs(insts))
			}
			var gaveUp *retry.MaxAttemptsError
			if !errors.As(err, &gaveUp) {
				t.Fatalf("List error %v: want the SDK's retries given up (retry.MaxAttemptsError)", err)
			}
			if n := e.fake.Calls("DescribeInstances", testRegion) - calls; n != DefaultMaxAttempts {
				t.Fatalf("List tried DescribeInstances %d times in %s, want the retryer's bound %d", n, testRegion, DefaultMaxAttempts)
			}

			launched := len(e.fake.Instances())
			if _, err := p.Launch(ctx, spec("during", "exec sleep 300", false)); !errors.Is(err, tc.want) {
				t.Fatalf("Launch: %v, want %v", err, tc.want)
			}
			if n := len(e.fake.Instances()); n != launched {
				t.Fatalf("a launch that failed at once left %d instance(s)", n-launched)
			}
			if err := p.Terminate(ctx, before.ID); !errors.Is(err, tc.want) {
				t.Fatalf("Terminate: %v, want %v", err, tc.want)
			}
			err = p.Check(ctx)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), testRegion) || !strings.Contains(err.Error(), westRegion) {
				t.Fatalf("Check: %v, want %v naming both regions", err, tc.want)
			}
		})
	}
}

// TestHangCutByRequestTimeout: an endpoint that accepts and never answers is cut by the
// request timeout: List returns within a few seconds with every region a gap that says the
// call ran out its deadline (which opens the provisioner's breaker at once), and Launch fails
// with ErrUnavailable within its bound; a List whose own deadline is shorter returns by then,
// still naming what it could not read.
func TestHangCutByRequestTimeout(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	p, _ := faultProvider(t, e.fake, nil) // RequestTimeout 1s, 3 attempts
	e.fake.Outages().Set(fakefault.Fault{Hang: true})
	// Three attempts of a second each, the SDK's back-off between them, and a loaded machine.
	const bound = 15 * time.Second
	// A deadline far beyond the bound, so that a regression fails here rather than hangs.
	ctx, cancel := context.WithTimeout(context.Background(), 4*bound)
	defer cancel()

	start := time.Now()
	insts, err := p.List(ctx, nil)
	took := time.Since(start)
	if took > bound {
		t.Fatalf("List under a hang took %v, want under %v", took, bound)
	}
	if !errors.Is(err, launcher.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("List: %v, want ErrUnavailable from a request that ran out its deadline", err)
	}
	if got := gapWheres(t, err); !slices.Equal(got, []string{"aws"}) || len(insts) != 0 {
		t.Fatalf("List: %v with gaps %v, want nothing and the whole infra as a gap (every region failed)", instanceIDs(insts), got)
	}

	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	start = time.Now()
	_, err = p.List(short, nil)
	cancel()
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("List with a 300ms deadline took %v", took)
	}
	if got := gapWheres(t, err); !slices.Equal(got, []string{"aws"}) || !errors.Is(err, launcher.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("List past its deadline: gaps %v (%v), want the whole infra, unavailable past its deadline", got, err)
	}

	start = time.Now()
	if _, err := p.Launch(ctx, spec("hung", "exec sleep 300", false)); !errors.Is(err, launcher.ErrUnavailable) {
		t.Fatalf("Launch under a hang: %v, want ErrUnavailable", err)
	}
	if took := time.Since(start); took > bound {
		t.Fatalf("Launch under a hang took %v, want under %v", took, bound)
	}
	if err := p.Check(ctx); !errors.Is(err, launcher.ErrUnavailable) {
		t.Fatalf("Check under a hang: %v, want ErrUnavailable", err)
	}
}

// TestLaunchCutMidWait: a hang that starts while Launch waits for its VM to run is cut per
// request too: Launch fails with ErrUnavailable within its bound, not after LaunchTimeout.
func TestLaunchCutMidWait(t *testing.T) {
	e := newEnv(t, fakeec2.Options{BootDelay: time.Hour}, goodKey) // pending until the test is over
	p, _ := faultProvider(t, e.fake, nil)
	done := make(chan error, 1)
	go func() {
		_, err := p.Launch(context.Background(), spec("waits", "exec sleep 300", false))
		done <- err
	}()
	waitFor(t, testTimeout, "the instance to be launched", func() (bool, string) {
		return len(e.fake.Instances()) == 1, fmt.Sprint(e.fake.Instances())
	})
	e.fake.Outages().Set(fakefault.Fault{Hang: true, Ops: []string{"DescribeInstances"}})
	start := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, launcher.ErrUnavailable) {
			t.Fatalf("Launch: %v, want ErrUnavailable", err)
		}
	case <-time.After(testTimeout):
		t.Fatalf("Launch still waiting %v after DescribeInstances began to hang", testTimeout)
	}
	t.Logf("Launch failed %v after the hang began", time.Since(start).Round(time.Millisecond))
}

// TestOneRegionFailing: with one region of two failing, the other's instances are listed and
// the gap names the failing region alone; launches in the healthy region go on, even while a
// launch in the failing region holds a call open there (the regions' security-group locks are
// apart); Check names the failing region only. Cleared, the list is whole again.
func TestOneRegionFailing(t *testing.T) {
	for name, fault := range map[string]fakefault.Fault{
		"503":  {Region: westRegion, Status: 503},
		"hang": {Region: westRegion, Hang: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, fakeec2.Options{}, goodKey)
			// A request timeout long enough that the hung west launch holds its call
			// open for the whole of the east launch; List and Check get deadlines of
			// their own, shorter, as the provisioner gives them.
			p, _ := faultProvider(t, e.fake, func(o *Options) { o.RequestTimeout = 5 * time.Second })
			ctx := context.Background()
			within := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 3*time.Second) }
			east, err := p.Launch(ctx, spec("east", "exec sleep 300", false))
			if err != nil {
				t.Fatal(err)
			}
			west, err := p.Launch(ctx, westSpec("west"))
			if err != nil {
				t.Fatal(err)
			}
			e.fake.Outages().Set(fault)

			lctx, cancel := within()
			insts, err := p.List(lctx, nil)
			cancel()
			if got := gapWheres(t, err); !slices.Equal(got, []string{"aws/" + westRegion}) {
				t.Fatalf("gaps %v, want %s alone", got, westRegion)
			}
			if !errors.Is(err, launcher.ErrUnavailable) {
				t.Fatalf("List: %v, want the gap's ErrUnavailable", err)
			}
			if got := instanceIDs(insts); !slices.Equal(got, []string{east.ID}) {
				t.Fatalf("listed %v, want %s (the healthy region's)", got, east.ID)
			}

			// A west launch on a new port holds west's security-group lock while its
			// call fails or hangs; an east launch on that port must not wait for it.
			westCtx, cancelWest := context.WithCancel(ctx)
			defer cancelWest()
			westDone := make(chan error, 1)
			go func() {
				s := westSpec("west-2")
				s.Port = 9090
				_, err := p.Launch(westCtx, s)
				westDone <- err
			}()
			if fault.Hang {
				waitFor(t, testTimeout, "the west launch to be held", func() (bool, string) {
					return e.fake.Held() > 0, fmt.Sprint(e.fake.Held(), " held")
				})
			}
			s := spec("east-2", "exec sleep 300", false)
			s.Port = 9090
			if _, err := p.Launch(ctx, s); err != nil {
				t.Fatalf("launch in the healthy region: %v", err)
			}
			if fault.Hang {
				select {
				case err := <-westDone:
					t.Fatalf("the hung west launch ended (%v) before the east launch: the test shows nothing", err)
				default:
				}
				cancelWest() // its failing in time is TestHangCutByRequestTimeout's
				if err := <-westDone; err == nil {
					t.Fatal("a launch in the hung region succeeded")
				}
			} else if err := <-westDone; !errors.Is(err, launcher.ErrUnavailable) {
				t.Fatalf("launch in the failing region: %v, want ErrUnavailable", err)
			}

			cctx, cancel := within()
			err = p.Check(cctx)
			cancel()
			if !errors.Is(err, launcher.ErrUnavailable) || !strings.Contains(err.Error(), westRegion) || strings.Contains(err.Error(), testRegion) {
				t.Fatalf("Check: %v, want ErrUnavailable naming %s only", err, westRegion)
			}

			e.fake.Outages().Clear()
			insts, err = p.List(ctx, nil)
			if err != nil {
				t.Fatalf("List after the fault cleared: %v", err)
			}
			if got := instanceIDs(insts); !slices.Contains(got, east.ID) || !slices.Contains(got, west.ID) {
				t.Fatalf("listed %v after the fault cleared, want both regions' instances", got)
			}
		})
	}
}

// TestRecoversAfterFor: a fault with For ends by itself, and the provider works again without
// being told: List is whole, Launch runs.
func TestRecoversAfterFor(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	p, _ := faultProvider(t, e.fake, nil)
	ctx := context.Background()
	before, err := p.Launch(ctx, spec("before", "exec sleep 300", false))
	if err != nil {
		t.Fatal(err)
	}
	e.fake.Outages().Set(fakefault.Fault{Status: 503, For: 2 * time.Second})
	if _, err := p.List(ctx, nil); !errors.Is(err, launcher.ErrUnavailable) {
		t.Fatalf("List during the fault: %v, want ErrUnavailable", err)
	}
	waitFor(t, testTimeout, "List to be whole again", func() (bool, string) {
		insts, err := p.List(ctx, nil)
		if err != nil {
			return false, err.Error()
		}
		return slices.Equal(instanceIDs(insts), []string{before.ID}), fmt.Sprint(instanceIDs(insts))
	})
	if _, err := p.Launch(ctx, spec("after", "exec sleep 300", false)); err != nil {
		t.Fatalf("Launch after the fault ended: %v", err)
	}
	if err := p.Check(ctx); err != nil {
		t.Fatalf("Check after the fault ended: %v", err)
	}
}

// TestNoticesBackOff: while EC2 fails the notice poll, each region is polled less and less
// often, and the failure is logged once per region, not at every poll; once EC2 answers again
// the poll says so and notices come as before.
func TestNoticesBackOff(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	// One attempt per call, so that the calls counted are the poll's.
	p, logs := faultProvider(t, e.fake, func(o *Options) { o.MaxAttempts = 1 })
	e.fake.Outages().Set(fakefault.Fault{Status: 503})
	ctx, cancel := context.WithCancel(context.Background())
	notices := p.Notices(ctx)
	stopWatcher(t, cancel, notices)
	failing := func() int { return logs.FilterMessageSnippet("EC2 fails the notice poll").Len() }
	waitFor(t, testTimeout, "the failure logged in both regions", func() (bool, string) {
		return failing() == 2, fmt.Sprint(logs.All())
	})

	const window = time.Second // 50 polls of 20ms without a back-off
	before := e.fake.Calls("DescribeSpotInstanceRequests", testRegion)
	time.Sleep(window) // measuring a rate: how many calls a second of failures brings
	if n := e.fake.Calls("DescribeSpotInstanceRequests", testRegion) - before; n > 10 {
		t.Errorf("%d calls in %v against a failing endpoint polled every %v: want a back-off", n, window, p.opts.NoticeInterval)
	}
	if n := failing(); n != 2 {
		t.Errorf("the failure was logged %d times, want once per region", n)
	}

	e.fake.Outages().Clear()
	waitFor(t, testTimeout, "the recovery logged in both regions", func() (bool, string) {
		return logs.FilterMessageSnippet("EC2 answers the notice poll again").Len() == 2, fmt.Sprint(logs.All())
	})
	inst, err := p.Launch(context.Background(), spec("spot-after", "exec sleep 300", true))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.fake.Preempt(fakeInstance(t, e.fake, inst.ID).ID); err != nil {
		t.Fatal(err)
	}
	if n := nextNotice(t, notices); n.InstanceID != inst.ID {
		t.Fatalf("notice names %s, want %s", n.InstanceID, inst.ID)
	}
	if n := failing(); n != 2 {
		t.Errorf("the failure was logged %d times in all, want once per region", n)
	}
}

// TestNoticesIsolateRegions: a region whose endpoint hangs does not delay another region's
// notices: each region's poll runs apart.
func TestNoticesIsolateRegions(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	// Each hung call in the west holds its poll 10s (30s with retries); the east's notice
	// must come well before.
	p, _ := faultProvider(t, e.fake, func(o *Options) { o.RequestTimeout = 10 * time.Second })
	inst, err := p.Launch(context.Background(), spec("spot-east", "exec sleep 300", true))
	if err != nil {
		t.Fatal(err)
	}
	e.fake.Outages().Set(fakefault.Fault{Region: westRegion, Hang: true})
	ctx, cancel := context.WithCancel(context.Background())
	notices := p.Notices(ctx)
	stopWatcher(t, cancel, notices)
	waitFor(t, testTimeout, "the west poll to hang", func() (bool, string) {
		return e.fake.Held() > 0, "nothing held"
	})
	if err := e.fake.Preempt(fakeInstance(t, e.fake, inst.ID).ID); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	select {
	case n := <-notices:
		if n.InstanceID != inst.ID {
			t.Fatalf("notice names %s, want %s", n.InstanceID, inst.ID)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("no notice from the healthy region while the other hangs")
	}
	t.Logf("notice %v after the preemption", time.Since(start).Round(time.Millisecond))
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader in two goroutines.
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

// TestStreamLogsRidesOutAFault: a followed console whose reads EC2 fails is read less and less
// often, not given up, and logged once; once EC2 answers, the output that came meanwhile
// follows and the stream ends with the instance.
func TestStreamLogsRidesOutAFault(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	p, logs := faultProvider(t, e.fake, func(o *Options) { o.MaxAttempts = 1 })
	ctx := context.Background()
	inst, err := p.Launch(ctx, spec("talker", `i=0; while :; do echo "tick $i"; i=$((i+1)); sleep 0.05; done`, false))
	if err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	var stalled atomic.Int64 // failed reads the stream reported
	done := make(chan error, 1)
	opts := launcher.LogOptions{Tail: -1, Follow: true, Stalled: func(error) { stalled.Add(1) }}
	go func() { done <- p.StreamLogs(ctx, inst.ID, opts, &out) }()
	waitFor(t, testTimeout, "the console followed", func() (bool, string) {
		return strings.Contains(out.String(), "tick 2\n"), out.String()
	})
	if n := stalled.Load(); n != 0 {
		t.Fatalf("%d reads reported failing before the fault", n)
	}

	e.fake.Outages().Set(fakefault.Fault{Status: 503})
	failing := func() int { return logs.FilterMessageSnippet("fails to serve the console output").Len() }
	waitFor(t, testTimeout, "the failure logged", func() (bool, string) { return failing() == 1, fmt.Sprint(logs.All()) })
	// Whoever waits for the output's end hears that EC2 holds it up.
	waitFor(t, testTimeout, "a failed read reported", func() (bool, string) { return stalled.Load() > 0, "" })
	const window = time.Second // 50 reads of 20ms without a back-off
	reads := func() int {
		return e.fake.Calls("GetConsoleOutput", testRegion) + e.fake.Calls("DescribeInstances", testRegion)
	}
	before := reads()
	time.Sleep(window) // measuring a rate: how many calls a second of failures brings
	if n := reads() - before; n > 10 {
		t.Errorf("%d reads in %v of a failing console read every %v: want a back-off", n, window, p.opts.LogInterval)
	}
	select {
	case err := <-done:
		t.Fatalf("the stream ended (%v) while EC2 failed; want it to wait for EC2", err)
	default:
	}
	seen := out.String()

	e.fake.Outages().Clear()
	waitFor(t, testTimeout, "output after the fault", func() (bool, string) {
		now := out.String()
		return len(now) > len(seen) && strings.HasSuffix(now, "\n"), now[len(seen):]
	})
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("stream ended with %v, want nil once the instance ended", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("the stream did not end with its instance")
	}
	if n := failing(); n != 1 {
		t.Errorf("the failure was logged %d times, want once", n)
	}
	if n := logs.FilterMessageSnippet("serves the console output again").Len(); n != 1 {
		t.Errorf("the recovery was logged %d times, want once", n)
	}
}

// TestReservationsWithOneRegionFailing: the reservations and offerings of the healthy region
// come back with a gap for the failing one, instead of nothing.
func TestReservationsWithOneRegionFailing(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	p, _ := faultProvider(t, e.fake, nil)
	ctx := context.Background()
	east, err := e.fake.AddReservation(fakeec2.Reservation{Zone: testZoneID, InstanceType: testType, Count: 2, Match: fakeec2.MatchTargeted})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.fake.AddReservation(fakeec2.Reservation{Zone: "usw2-az1", InstanceType: testType, Count: 2, Match: fakeec2.MatchTargeted}); err != nil {
		t.Fatal(err)
	}
	e.fake.Outages().Set(fakefault.Fault{Region: westRegion, Status: 503})

	rs, err := p.Reservations(ctx)
	if got := gapWheres(t, err); !slices.Equal(got, []string{"aws/" + westRegion}) || !errors.Is(err, launcher.ErrUnavailable) {
		t.Fatalf("Reservations: gaps %v (%v), want %s alone, unavailable", got, err, westRegion)
	}
	if len(rs) != 1 || rs[0].ID != east {
		t.Fatalf("Reservations listed %+v, want %s alone", rs, east)
	}
	offers, err := p.Offerings(ctx)
	if got := gapWheres(t, err); !slices.Equal(got, []string{"aws/" + westRegion}) {
		t.Fatalf("Offerings: gaps %v (%v), want %s alone", got, err, westRegion)
	}
	if len(offers) != 1 || offers[0].Reservation.ID != east {
		t.Fatalf("Offerings %+v, want %s alone", offers, east)
	}

	e.fake.Outages().Clear()
	if rs, err := p.Reservations(ctx); err != nil || len(rs) != 2 {
		t.Fatalf("Reservations after the fault: %d, %v; want both regions'", len(rs), err)
	}
}
