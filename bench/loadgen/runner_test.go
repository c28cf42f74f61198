package loadgen

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	tests := map[string]struct {
		cfg     Config
		wantErr []string // substrings, one per expected problem
	}{
		"valid":            {cfg: Config{Concurrency: 4, Duration: time.Second}},
		"valid with ramp":  {cfg: Config{Concurrency: 4, Duration: time.Second, Ramp: 500 * time.Millisecond, MaxRequests: 10}},
		"zero concurrency": {cfg: Config{Duration: time.Second}, wantErr: []string{"concurrency 0"}},
		"too many workers": {cfg: Config{Concurrency: MaxConcurrency + 1, Duration: time.Second}, wantErr: []string{"concurrency"}},
		"no duration":      {cfg: Config{Concurrency: 1}, wantErr: []string{"duration 0s"}},
		"all wrong": {
			cfg:     Config{Concurrency: -1, Duration: time.Hour, MaxRequests: -1, Ramp: -time.Second},
			wantErr: []string{"concurrency -1", "duration 1h0m0s", "max requests -1", "ramp -1s"},
		},
		"ramp longer than run": {cfg: Config{Concurrency: 1, Duration: time.Second, Ramp: time.Second}, wantErr: []string{"ramp 1s"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want errors %q", tc.wantErr)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Validate() = %q, want it to mention %q", err, want)
				}
			}
		})
	}
}

func TestRunStopsAtRequestCap(t *testing.T) {
	var calls atomic.Int64
	res, err := Run(context.Background(), Config{Concurrency: 8, Duration: 10 * time.Second, MaxRequests: 100},
		func(context.Context, int) (Sample, error) {
			calls.Add(1)
			return Sample{TTFB: time.Microsecond}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 100 || calls.Load() != 100 || res.Errors != 0 {
		t.Errorf("requests %d, calls %d, errors %d; want 100, 100, 0", res.Requests, calls.Load(), res.Errors)
	}
	if res.Latency.Count() != 100 || res.TTFB.Count() != 100 {
		t.Errorf("histograms hold %d and %d samples, want 100", res.Latency.Count(), res.TTFB.Count())
	}
	if res.Elapsed > 5*time.Second {
		t.Errorf("took %v: the cap did not end the run", res.Elapsed)
	}
}

func TestRunStopsAtDuration(t *testing.T) {
	start := time.Now()
	res, err := Run(context.Background(), Config{Concurrency: 4, Duration: 100 * time.Millisecond},
		func(context.Context, int) (Sample, error) {
			time.Sleep(time.Millisecond)
			return Sample{}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("took %v for a 100ms run", took)
	}
	if res.Requests == 0 || res.PeakInFlight < 1 || res.PeakInFlight > 4 {
		t.Errorf("requests %d, peak in flight %d", res.Requests, res.PeakInFlight)
	}
	if res.RequestsPerSecond() <= 0 {
		t.Errorf("req/s %v", res.RequestsPerSecond())
	}
}

func TestRunCountsErrors(t *testing.T) {
	boom := errors.New("boom")
	var calls atomic.Int64
	res, err := Run(context.Background(), Config{Concurrency: 2, Duration: 10 * time.Second, MaxRequests: 10},
		func(context.Context, int) (Sample, error) {
			if calls.Add(1)%2 == 0 {
				return Sample{}, boom
			}
			return Sample{}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 5 || res.Errors != 5 || res.FirstError != "boom" {
		t.Errorf("requests %d errors %d first %q", res.Requests, res.Errors, res.FirstError)
	}
	if res.Latency.Count() != uint64(res.Requests) {
		t.Errorf("failed requests reached the latency histogram")
	}
}

func TestRunRampAndCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var started atomic.Int64
	go func() {
		for started.Load() < 2 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	// Ten workers ramped over 5 s: cancelling after the first two keeps the rest from starting.
	res, err := Run(ctx, Config{Concurrency: 10, Duration: 8 * time.Second, Ramp: 5 * time.Second},
		func(ctx context.Context, _ int) (Sample, error) {
			started.Add(1)
			<-ctx.Done()
			return Sample{}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if res.Elapsed > 3*time.Second || started.Load() > 5 {
		t.Errorf("elapsed %v with %d started: cancel did not stop the ramp", res.Elapsed, started.Load())
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	if _, err := Run(context.Background(), Config{}, nil); err == nil {
		t.Error("Run accepted a zero Config")
	}
}
