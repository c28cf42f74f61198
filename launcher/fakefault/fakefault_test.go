package fakefault

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestParseString: every spec `ferry fakecloud --fault` documents reads as the fault it says,
// and String writes it back so that Parse reads the same fault.
func TestParseString(t *testing.T) {
	for name, tc := range map[string]struct {
		spec       string
		want       Fault
		wantString string // "" is spec itself
	}{
		"status":          {spec: "503", want: Fault{Status: 503}},
		"zone 404":        {spec: "404,zone=us-central1-f", want: Fault{Status: 404, Zone: "us-central1-f"}},
		"hang":            {spec: "hang", want: Fault{Hang: true}},
		"throttle rate":   {spec: "throttle,rate=0.5", want: Fault{Throttle: true, Rate: 0.5}},
		"recovers":        {spec: "503,for=60s", want: Fault{Status: 503, For: time.Minute}, wantString: "503,for=1m0s"},
		"slow":            {spec: "slow,delay=2s", want: Fault{Delay: 2 * time.Second}},
		"region ops code": {spec: "500,region=us-east-1,ops=RunInstances|DescribeInstances,code=InternalError", want: Fault{Status: 500, Region: "us-east-1", Ops: []string{"RunInstances", "DescribeInstances"}, Code: "InternalError"}},
		"message":         {spec: "403,message=no access", want: Fault{Status: 403, Message: "no access"}},
		"rate one is all": {spec: "503,rate=1", want: Fault{Status: 503, Rate: 1}, wantString: "503"},
		"spaces trimmed":  {spec: " hang,zone=us-east-1a ", want: Fault{Hang: true, Zone: "us-east-1a"}, wantString: "hang,zone=us-east-1a"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Parse(tc.spec)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.spec, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("Parse(%q) (-want +got):\n%s", tc.spec, diff)
			}
			wantString := tc.wantString
			if wantString == "" {
				wantString = tc.spec
			}
			if s := got.String(); s != wantString {
				t.Fatalf("String() = %q, want %q", s, wantString)
			}
			again, err := Parse(got.String())
			if err != nil {
				t.Fatalf("Parse(String()) = %v", err)
			}
			if got.Rate == 1 {
				again.Rate = 1 // "all" is written as no rate
			}
			if diff := cmp.Diff(got, again); diff != "" {
				t.Fatalf("Parse(String()) differs (-first +again):\n%s", diff)
			}
		})
	}
}

// TestStringRemainingFor: what is left of a fault's For is never shown as 0s, which Parse would
// read as a fault that never ends.
func TestStringRemainingFor(t *testing.T) {
	for d, want := range map[time.Duration]string{
		400 * time.Millisecond:  "503,for=400ms",
		100 * time.Microsecond:  "503,for=1ms",
		1400 * time.Millisecond: "503,for=1s",
		90 * time.Second:        "503,for=1m30s",
	} {
		if got := (Fault{Status: 503, For: d}).String(); got != want {
			t.Errorf("For %v: String() = %q, want %q", d, got, want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for spec, wantErr := range map[string]string{
		"":                  "kind must be",
		"200":               "kind must be",
		"600":               "kind must be",
		"boom":              "kind must be",
		"slow":              "slow needs delay",
		"503,zone":          "not key=value",
		"503,zone=":         "not key=value",
		"503,color=red":     "unknown key",
		"throttle,rate=0":   "rate",
		"throttle,rate=1.5": "rate",
		"503,for=soon":      "for",
		"slow,delay=x":      "delay",
	} {
		if _, err := Parse(spec); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("Parse(%q) = %v, want an error about %q", spec, err, wantErr)
		}
	}
}

// TestMatch: a fault takes the requests of its zone, of the zones in its region, and of its
// operations; a fault limited to a place never takes a request about no place.
func TestMatch(t *testing.T) {
	for name, tc := range map[string]struct {
		fault Fault
		req   Request
		want  bool
	}{
		"everything":                    {Fault{Status: 503}, Request{Op: "instances.list", Zone: "us-central1-a"}, true},
		"everything, global":            {Fault{Status: 503}, Request{Op: "globalOperations.get"}, true},
		"its zone":                      {Fault{Zone: "us-central1-f"}, Request{Op: "instances.list", Zone: "us-central1-f"}, true},
		"another zone":                  {Fault{Zone: "us-central1-f"}, Request{Op: "instances.list", Zone: "us-central1-a"}, false},
		"zone fault, global request":    {Fault{Zone: "us-central1-f"}, Request{Op: "globalOperations.get"}, false},
		"GCP zone in its region":        {Fault{Region: "us-central1"}, Request{Op: "instances.list", Zone: "us-central1-b"}, true},
		"GCP zone in another region":    {Fault{Region: "us-central1"}, Request{Op: "instances.list", Zone: "us-east1-b"}, false},
		"AWS zone in its region":        {Fault{Region: "us-east-1"}, Request{Op: "RunInstances", Zone: "us-east-1a"}, true},
		"AWS request's own region":      {Fault{Region: "us-east-1"}, Request{Op: "DescribeInstances", Region: "us-east-1"}, true},
		"AWS another region":            {Fault{Region: "us-east-1"}, Request{Op: "DescribeInstances", Region: "us-west-2"}, false},
		"region fault, global request":  {Fault{Region: "us-east-1"}, Request{Op: "DescribeRegions"}, false},
		"one of its ops":                {Fault{Ops: []string{"instances.insert", "instances.delete"}}, Request{Op: "instances.delete", Zone: "us-east1-b"}, true},
		"not one of its ops":            {Fault{Ops: []string{"instances.insert"}}, Request{Op: "instances.list", Zone: "us-east1-b"}, false},
		"zone and op both needed":       {Fault{Zone: "us-east1-b", Ops: []string{"instances.insert"}}, Request{Op: "instances.insert", Zone: "us-east1-c"}, false},
		"zone and op both met":          {Fault{Zone: "us-east1-b", Ops: []string{"instances.insert"}}, Request{Op: "instances.insert", Zone: "us-east1-b"}, true},
		"explicit region beats derived": {Fault{Region: "us-east-1"}, Request{Op: "RunInstances", Region: "us-west-2", Zone: "us-east-1a"}, false},
	} {
		t.Run(name, func(t *testing.T) {
			var s Switch
			s.Set(tc.fault)
			if _, got := s.Match(tc.req); got != tc.want {
				t.Fatalf("Match(%+v) with %s = %v, want %v", tc.req, tc.fault, got, tc.want)
			}
		})
	}
}

// TestMatchFirst: the first matching fault wins, and a request no fault takes gets none.
func TestMatchFirst(t *testing.T) {
	var s Switch
	s.Set(Fault{Status: 404, Zone: "us-central1-f"}, Fault{Status: 503})
	if f, ok := s.Match(Request{Op: "instances.list", Zone: "us-central1-f"}); !ok || f.Status != 404 {
		t.Fatalf("us-central1-f got %+v, %v; want the 404", f, ok)
	}
	if f, ok := s.Match(Request{Op: "instances.list", Zone: "us-central1-a"}); !ok || f.Status != 503 {
		t.Fatalf("us-central1-a got %+v, %v; want the 503", f, ok)
	}
	s.Clear()
	if f, ok := s.Match(Request{Op: "instances.list", Zone: "us-central1-a"}); ok {
		t.Fatalf("after Clear got %+v", f)
	}
	var zero Switch
	if _, ok := zero.Match(Request{Op: "instances.list"}); ok {
		t.Fatal("the zero Switch matched")
	}
}

// TestMatchRate: a fault with a rate takes about that share of the requests.
func TestMatchRate(t *testing.T) {
	var s Switch
	s.Set(Fault{Throttle: true, Rate: 0.5})
	const n = 4000
	hit := 0
	for range n {
		if _, ok := s.Match(Request{Op: "DescribeInstances", Region: "us-east-1"}); ok {
			hit++
		}
	}
	if hit < n*4/10 || hit > n*6/10 {
		t.Fatalf("rate 0.5 took %d of %d requests", hit, n)
	}
	s.Set(Fault{Throttle: true, Rate: 1})
	for range 100 {
		if _, ok := s.Match(Request{Op: "DescribeInstances"}); !ok {
			t.Fatal("rate 1 let a request through")
		}
	}
}

// TestFor: a fault with For ends by itself (a cloud that recovers); Faults and Match report
// what is left of it.
func TestFor(t *testing.T) {
	var s Switch
	const d = 300 * time.Millisecond
	s.Set(Fault{Status: 503, For: d}, Fault{Status: 404, Zone: "us-central1-f"})
	f, ok := s.Match(Request{Op: "instances.list", Zone: "us-central1-a"})
	if !ok || f.For <= 0 || f.For > d {
		t.Fatalf("Match = %+v, %v; want the 503 with at most %v left", f, ok, d)
	}
	if fs := s.Faults(); len(fs) != 2 || fs[0].For <= 0 || fs[0].For > d || fs[1].For != 0 {
		t.Fatalf("Faults() = %+v", fs)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, ok := s.Match(Request{Op: "instances.list", Zone: "us-central1-a"}); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fault did not end")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if fs := s.Faults(); len(fs) != 1 || fs[0].Status != 404 {
		t.Fatalf("after the 503 ended Faults() = %+v, want the 404 alone", fs)
	}
	// Add keeps what is left of the faults in force.
	s.Set(Fault{Status: 500, For: time.Hour})
	s.Add(Fault{Hang: true, Zone: "us-east1-b"})
	if fs := s.Faults(); len(fs) != 2 || fs[0].Status != 500 || fs[0].For <= 59*time.Minute || fs[0].For > time.Hour || !fs[1].Hang {
		t.Fatalf("after Add Faults() = %+v", fs)
	}
}

// waitAsync runs Wait in the background and returns its answer's channel.
func waitAsync(ctx context.Context, s *Switch, f Fault, stop <-chan struct{}) <-chan bool {
	ch := make(chan bool, 1)
	go func() { ch <- s.Wait(ctx, f, stop) }()
	return ch
}

// held fails the test if the waiting request was released (a short look, not a wait for a
// decision: the release under test happens later).
func held(t *testing.T, ch <-chan bool, why string) {
	t.Helper()
	select {
	case got := <-ch:
		t.Fatalf("%s: Wait returned %v, want it still holding the request", why, got)
	case <-time.After(50 * time.Millisecond):
	}
}

func released(t *testing.T, ch <-chan bool, want bool, why string) {
	t.Helper()
	select {
	case got := <-ch:
		if got != want {
			t.Fatalf("%s: Wait returned %v, want %v", why, got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: Wait did not return", why)
	}
}

// TestWaitHang: a hung request is held until the hang is cleared (then it is answered), not
// when another fault is set beside it; the client giving up and the fake stopping end it
// without an answer.
func TestWaitHang(t *testing.T) {
	ctx := context.Background()
	req := Request{Op: "instances.list", Zone: "us-central1-a"}

	t.Run("released by Clear", func(t *testing.T) {
		var s Switch
		s.Set(Fault{Hang: true})
		f, _ := s.Match(req)
		ch := waitAsync(ctx, &s, f, nil)
		held(t, ch, "hang set")
		s.Add(Fault{Status: 503, Zone: "us-east1-b"})
		held(t, ch, "another fault added")
		s.Clear()
		released(t, ch, true, "after Clear")
	})
	t.Run("released when it ends", func(t *testing.T) {
		var s Switch
		s.Set(Fault{Hang: true, For: 200 * time.Millisecond})
		f, _ := s.Match(req)
		released(t, waitAsync(ctx, &s, f, nil), true, "hang for 200ms")
	})
	t.Run("client gives up", func(t *testing.T) {
		var s Switch
		s.Set(Fault{Hang: true})
		f, _ := s.Match(req)
		cctx, cancel := context.WithCancel(ctx)
		ch := waitAsync(cctx, &s, f, nil)
		held(t, ch, "hang set")
		if n := s.Held(); n != 1 {
			t.Fatalf("Held() = %d while one request hangs", n)
		}
		cancel()
		released(t, ch, false, "client gone")
		if n := s.Held(); n != 0 {
			t.Fatalf("Held() = %d after the request was dropped", n)
		}
	})
	t.Run("fake stops", func(t *testing.T) {
		var s Switch
		s.Set(Fault{Hang: true})
		f, _ := s.Match(req)
		stop := make(chan struct{})
		ch := waitAsync(ctx, &s, f, stop)
		held(t, ch, "hang set")
		close(stop)
		released(t, ch, false, "fake stopped")
	})
	t.Run("cleared before waiting", func(t *testing.T) {
		var s Switch
		s.Set(Fault{Hang: true})
		f, _ := s.Match(req)
		s.Clear()
		released(t, waitAsync(ctx, &s, f, nil), true, "cleared between Match and Wait")
	})
}

// TestWaitDelay: a slow answer comes after its delay, or not at all if the client gives up.
func TestWaitDelay(t *testing.T) {
	var s Switch
	f := Fault{Delay: 100 * time.Millisecond}
	start := time.Now()
	if !s.Wait(context.Background(), f, nil) {
		t.Fatal("Wait on a delay returned false")
	}
	if took := time.Since(start); took < f.Delay {
		t.Fatalf("answered after %v, want at least %v", took, f.Delay)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if s.Wait(ctx, Fault{Delay: time.Hour}, nil) {
		t.Fatal("Wait for a client that gave up returned true")
	}
}

func TestRegionOf(t *testing.T) {
	for zone, want := range map[string]string{
		"us-central1-a":  "us-central1",
		"europe-west4-b": "europe-west4",
		"us-east-1a":     "us-east-1",
		"ap-south-2c":    "ap-south-2",
		"us-east-1":      "us-east-1",
	} {
		if got := RegionOf(zone); got != want {
			t.Errorf("RegionOf(%q) = %q, want %q", zone, got, want)
		}
	}
}
