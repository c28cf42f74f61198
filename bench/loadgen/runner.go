package loadgen

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Limits that keep a misconfigured run from exhausting the machine.
const (
	// MaxConcurrency bounds Config.Concurrency: the 5,000-stream test plus headroom, and below
	// the usual open-file limit for one side of every connection.
	MaxConcurrency = 8192
	// MaxDuration bounds Config.Duration.
	MaxDuration = 30 * time.Minute
	// histogramShards bounds the memory of a run with thousands of workers: workers share
	// this many histogram pairs, each behind its own mutex.
	histogramShards = 16
)

// Config bounds a closed-loop run: Concurrency workers each issue one request at a time until
// Duration has passed or MaxRequests have been started, whichever comes first. Requests in flight
// when the run stops are allowed to finish, so that every counted request was served entirely
// inside the measured window; each one is bounded by the Op's own timeout.
type Config struct {
	Concurrency int
	Duration    time.Duration
	// MaxRequests caps the requests started; zero means no cap.
	MaxRequests int64
	// Ramp staggers the workers' first requests evenly over this long, so that thousands of
	// connections are not opened in the same instant.
	Ramp time.Duration
}

// Validate reports every invalid field at once.
func (c Config) Validate() error {
	var errs []error
	if c.Concurrency < 1 || c.Concurrency > MaxConcurrency {
		errs = append(errs, fmt.Errorf("concurrency %d: must be between 1 and %d", c.Concurrency, MaxConcurrency))
	}
	if c.Duration <= 0 || c.Duration > MaxDuration {
		errs = append(errs, fmt.Errorf("duration %v: must be positive and at most %v", c.Duration, MaxDuration))
	}
	if c.MaxRequests < 0 {
		errs = append(errs, fmt.Errorf("max requests %d: must not be negative", c.MaxRequests))
	}
	if c.Ramp < 0 || c.Ramp >= c.Duration && c.Duration > 0 {
		errs = append(errs, fmt.Errorf("ramp %v: must not be negative and must be shorter than the duration %v", c.Ramp, c.Duration))
	}
	return errors.Join(errs...)
}

// Sample is what an Op reports beyond its latency, which the runner measures itself.
type Sample struct {
	// TTFB is the time from sending the request to the first byte of the response body (for a
	// stream, the first event); zero when the Op does not measure it.
	TTFB time.Duration
}

// Op issues one request on behalf of worker and returns when its response has been read
// completely. An error counts the request as failed.
type Op func(ctx context.Context, worker int) (Sample, error)

// Result is the outcome of Run.
type Result struct {
	// Requests is the number of requests that succeeded, Errors the number that failed.
	Requests int64
	Errors   int64
	// FirstError is the first failure's message, to say why errors happened.
	FirstError string
	// Elapsed runs from the first request to the end of the last one.
	Elapsed time.Duration
	// PeakInFlight is the highest number of requests in flight at once.
	PeakInFlight int64
	// Latency holds successful requests' full durations; TTFB their first-byte times when the
	// Op measured them.
	Latency *Histogram
	TTFB    *Histogram
}

// RequestsPerSecond is successful requests over the elapsed time.
func (r *Result) RequestsPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

type histogramShard struct {
	mu      sync.Mutex
	latency Histogram
	ttfb    Histogram
}

// Run drives op from cfg.Concurrency workers and blocks until every worker has stopped. It
// stops starting requests when ctx ends, as well as at the duration or the request cap.
func Run(ctx context.Context, cfg Config, op Op) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	shards := make([]histogramShard, min(cfg.Concurrency, histogramShards))
	var (
		started, ok, failed, inFlight, peak atomic.Int64
		firstErr                            atomic.Pointer[string]
		wg                                  sync.WaitGroup
	)
	begin := time.Now()
	deadline := begin.Add(cfg.Duration)
	for w := range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			shard := &shards[w%len(shards)]
			if cfg.Ramp > 0 {
				delay := time.Duration(int64(cfg.Ramp) * int64(w) / int64(cfg.Concurrency))
				select {
				case <-time.After(delay):
				case <-ctx.Done():
					return
				}
			}
			for ctx.Err() == nil && time.Now().Before(deadline) {
				if n := started.Add(1); cfg.MaxRequests > 0 && n > cfg.MaxRequests {
					return
				}
				storeMax(&peak, inFlight.Add(1))
				t0 := time.Now()
				s, err := op(ctx, w)
				d := time.Since(t0)
				inFlight.Add(-1)
				if err != nil {
					failed.Add(1)
					msg := err.Error()
					firstErr.CompareAndSwap(nil, &msg)
					continue
				}
				ok.Add(1)
				shard.mu.Lock()
				shard.latency.Record(d)
				if s.TTFB > 0 {
					shard.ttfb.Record(s.TTFB)
				}
				shard.mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res := &Result{
		Requests:     ok.Load(),
		Errors:       failed.Load(),
		Elapsed:      time.Since(begin),
		PeakInFlight: peak.Load(),
		Latency:      &Histogram{},
		TTFB:         &Histogram{},
	}
	if p := firstErr.Load(); p != nil {
		res.FirstError = *p
	}
	for i := range shards {
		res.Latency.Merge(&shards[i].latency)
		res.TTFB.Merge(&shards[i].ttfb)
	}
	return res, nil
}

// storeMax raises v to at least x.
func storeMax(v *atomic.Int64, x int64) {
	for {
		cur := v.Load()
		if x <= cur || v.CompareAndSwap(cur, x) {
			return
		}
	}
}
