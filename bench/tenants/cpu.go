package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryserve/ferry/bench/benchkit"
	"github.com/ferryserve/ferry/bench/childproc"
	"github.com/ferryserve/ferry/bench/procstat"
	"github.com/ferryserve/ferry/bench/servicekit"
)

// The CPU phase: what a managed key costs the proxy that serves it. Two more attached proxies, in
// front of a service of its own whose replica answers at once (so that the proxies, not the
// engine, set the pace), serve the same small chat completions at the same time: one under a
// managed key with per-minute and per-day limits on itself and its team and a dollar budget
// (identified, scoped, admitted, priced, settled from the answer's usage, six x-ratelimit-*
// headers), the other under a key of the service's own (service.auth.keys_from_env: what the
// gateway did before managed keys). Each proxy's own CPU time, read from /proc around the round,
// divided by the requests it served, is the figure: the load generator and the replica are other
// processes, so neither's work is counted.
//
// Both streams run at once, so whatever else the host does (on two cores, a compile or a test
// shifts a lone round by ±20 %) weighs on both alike; the roles swap every round, so that what
// differs between the two proxy processes (where they run, their heaps) cancels out in each pair
// of rounds, whose ratio is the geometric mean of its two. Bar (issue 41): the managed key ≤
// 1.10× the own key, the median of the pairs' ratios.

const (
	chatPath   = "/v1/chat/completions"
	cpuService = "tenants-cpu"
	cpuKeyEnv  = "FERRY_BENCH_OWN_KEY"
	cpuWorkers = 16 // a stream, one per proxy
	cpuBar     = 1.10
)

// cpuYAML is the CPU phase's service: one replica with no delay and a batch far above the
// load's concurrency, the proxy's slots and headroom on (max_in_flight_per_replica), and both
// kinds of key.
func (o options) cpuYAML() string {
	return fmt.Sprintf(`name: %s
resources:
  infra: local
service:
  readiness_probe: /health
  ports: 8080
  replicas: 1
  auth:
    keys_from_env: [%s]
    managed_keys: true
  limits:
    max_in_flight_per_replica: 256
run: ferry replica-sim --port $FERRY_PORT --model %s --max-num-seqs 256 --ttft 0s --itl 0s --itl-per-seq 0s --prefill-per-token 0s
`, cpuService, cpuKeyEnv, model)
}

type cpuResult struct {
	Requests int // at most, per stream and round
	Rounds   []cpuRound
	// Pairs are the ratios of consecutive rounds (roles swapped) taken together; Median is
	// their median, which Pass judges against cpuBar.
	Pairs  []float64
	Median float64
	Pass   bool
	// Headers are the rate headers of a managed key's answer: proof that the work was done.
	Headers map[string]string
}

type cpuRound struct {
	// ManagedProxy is which proxy (0 or 1) served the managed key.
	ManagedProxy         int
	Own, Managed         time.Duration // the proxy's CPU per request
	OwnRate, ManagedRate float64       // requests per second
	Ratio                float64
}

// measureCPU brings up the CPU phase's service and proxy, runs the rounds and takes them down.
func (b *bench) measureCPU(ctx context.Context, progress func(string, ...any)) (cpuResult, error) {
	var res cpuResult
	o := b.opts
	raw := make([]byte, 20)
	_, _ = rand.Read(raw)
	own := "sk-bench-" + hex.EncodeToString(raw)
	b.f.Env = append(b.f.Env, cpuKeyEnv+"="+own) // read by serve up: the key reaches the proxy only as its hash
	task := filepath.Join(o.out, "tenants-cpu.yaml")
	if err := os.WriteFile(task, []byte(o.cpuYAML()), 0o644); err != nil {
		return res, err
	}
	progress("cpu: serve up %s", task)
	if out, err := b.f.Run(ctx, "serve-up-cpu", 3*time.Minute, "serve", "up", task, "-y"); err != nil {
		return res, fmt.Errorf("%w\n%s", err, servicekit.LastLines(out, 20))
	}
	defer func() {
		_, _ = b.f.Run(context.WithoutCancel(ctx), "serve-down-cpu", 2*time.Minute, "serve", "down", cpuService, "-y")
	}()
	limits := []string{"--rpm", "1000000000", "--tpm", "100000000000", "--rpd", "100000000000", "--tpd", "1000000000000", "--budget-usd", "1000000"}
	if out, err := b.f.Run(ctx, "team-cpu", time.Minute, append([]string{"keys", "teams", "set", "metered-team"}, limits...)...); err != nil {
		return res, fmt.Errorf("%w\n%s", err, out)
	}
	secret, err := b.createKey(ctx, "metered", append([]string{"--team", "metered-team"}, limits...))
	if err != nil {
		return res, err
	}
	var proxies [2]attachedProxy
	for i := range proxies {
		if proxies[i], err = startAttachedProxy(b.f, fmt.Sprintf("proxy-cpu-%d", i), cpuService, o.cpuPin); err != nil {
			return res, err
		}
		defer b.f.Group.Stop(proxies[i].proc)
	}
	l := &cpuLoad{body: fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Say hello."}],"max_tokens":8}`, model),
		client: &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: cpuWorkers, MaxConnsPerHost: cpuWorkers}}}
	defer l.client.CloseIdleConnections()
	for _, px := range proxies {
		err = servicekit.PollUntil(ctx, time.Minute, 200*time.Millisecond, func() (bool, error) {
			h, err := l.once(ctx, px.base+chatPath, secret)
			res.Headers = h
			return err == nil, nil
		})
		if err != nil {
			return res, fmt.Errorf("the CPU phase's proxy never served the managed key: %w\n%s", err, servicekit.LastLines(px.proc.LogTail(1<<16), 10))
		}
	}
	if res.Headers["X-Ratelimit-Limit-Tokens"] == "" || res.Headers["X-Ratelimit-Remaining-Requests"] == "" {
		return res, fmt.Errorf("a managed key's answer lacks its rate headers: %v", res.Headers)
	}
	res.Requests = o.cpuRequests
	progress("cpu: %d rounds of at most %d requests a key, through two attached proxies at once (%d at a time each), roles swapped each round",
		o.cpuRounds, o.cpuRequests, cpuWorkers)
	// Warm both paths on both proxies: connections, pools, the ledger's rows.
	for m := range 2 {
		if _, err := l.round(ctx, proxies, m, own, secret, max(o.cpuRequests/4, 500)); err != nil {
			return res, err
		}
	}
	for i := range o.cpuRounds {
		r, err := l.round(ctx, proxies, i%2, own, secret, o.cpuRequests)
		if err != nil {
			return res, err
		}
		res.Rounds = append(res.Rounds, r)
		progress("cpu: round %d: own key %v, managed key %v a request (%.3f×; managed on proxy %d)", i+1, r.Own, r.Managed, r.Ratio, r.ManagedProxy)
	}
	res.judge()
	return res, nil
}

// judge pairs the rounds (each pair has both proxies in both roles) and takes the median of the
// pairs' geometric means; an odd round at the end stands alone.
func (res *cpuResult) judge() {
	res.Pairs = nil
	for i := 0; i < len(res.Rounds); i += 2 {
		r := res.Rounds[i].Ratio
		if i+1 < len(res.Rounds) {
			r = math.Sqrt(r * res.Rounds[i+1].Ratio)
		}
		res.Pairs = append(res.Pairs, r)
	}
	sorted := slices.Sorted(slices.Values(res.Pairs))
	if n := len(sorted); n%2 == 1 {
		res.Median = sorted[n/2]
	} else {
		res.Median = (sorted[n/2-1] + sorted[n/2]) / 2
	}
	res.Pass = res.Median <= cpuBar
}

// attachedProxy is a `ferry proxy --attach` the bench started.
type attachedProxy struct {
	base, metrics string // http://ADDR, and the metrics listener's address
	proc          *childproc.Proc
}

// startAttachedProxy starts `ferry proxy --attach service` on free loopback addresses, pinned
// to CPU cpu (-1: not pinned).
func startAttachedProxy(f *servicekit.Ferry, name, service string, cpu int) (attachedProxy, error) {
	addr, err := benchkit.FreeLoopbackAddr()
	if err != nil {
		return attachedProxy{}, err
	}
	maddr, err := benchkit.FreeLoopbackAddr()
	if err != nil {
		return attachedProxy{}, err
	}
	p, err := f.Group.Start(childproc.Spec{Name: name, Env: f.Env, CPU: cpu,
		Argv: []string{f.Bin, "proxy", "--attach", service, "--listen", addr, "--metrics-listen", maddr}})
	if err != nil {
		return attachedProxy{}, err
	}
	return attachedProxy{base: "http://" + addr, metrics: maddr, proc: p}, nil
}

// createKey runs `ferry keys create NAME --json FLAGS` and returns the secret.
func (b *bench) createKey(ctx context.Context, name string, flags []string) (string, error) {
	out, err := b.f.Run(ctx, "key-"+name, time.Minute, append([]string{"keys", "create", name, "--json"}, flags...)...)
	if err != nil {
		return "", fmt.Errorf("%w\n%s", err, out)
	}
	var created struct{ Secret string }
	if i := strings.Index(out, "{"); i < 0 || json.Unmarshal([]byte(out[i:]), &created) != nil || created.Secret == "" {
		return "", fmt.Errorf("ferry keys create %s: no secret in %q", name, out)
	}
	return created.Secret, nil
}

// cpuLoad sends the CPU phase's request.
type cpuLoad struct {
	body   string
	client *http.Client
}

// once sends one request with key to url and returns the answer's rate headers; an answer other
// than a whole 200 is an error.
func (l *cpuLoad) once(ctx context.Context, url, key string) (map[string]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(l.body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || n == 0 {
		return nil, fmt.Errorf("status %d, %d bytes, %v", resp.StatusCode, n, err)
	}
	h := map[string]string{}
	for _, name := range rateHeaders {
		if v := resp.Header.Get(name); v != "" {
			h[name] = v
		}
	}
	return h, nil
}

// round sends the managed key's stream to proxies[managed] and the own key's to the other, at
// once, cpuWorkers at a time each, until either has sent n (the other stops then too), and
// returns each proxy's CPU time per request it served. Any failed request fails the round.
func (l *cpuLoad) round(ctx context.Context, proxies [2]attachedProxy, managed int, own, secret string, n int) (cpuRound, error) {
	r := cpuRound{ManagedProxy: managed}
	keys := [2]string{own, own}
	keys[managed] = secret
	var before [2]procstat.Stat
	for i, px := range proxies {
		st, err := procstat.ReadStat(servicekit.ProcRoot, px.proc.PID)
		if err != nil {
			return r, err
		}
		before[i] = st
	}
	// A stream stops between requests, never in the middle of one: a request cut off would
	// have cost its proxy CPU without being counted.
	var halt atomic.Bool
	var firstErr error
	var failOnce sync.Once
	start := time.Now()
	var done [2]atomic.Int64
	var wg sync.WaitGroup
	for i := range proxies {
		for range cpuWorkers {
			wg.Go(func() {
				for !halt.Load() && ctx.Err() == nil {
					if _, err := l.once(ctx, proxies[i].base+chatPath, keys[i]); err != nil {
						failOnce.Do(func() { firstErr = fmt.Errorf("cpu round, proxy %d: %w", i, err) })
						halt.Store(true)
						return
					}
					if done[i].Add(1) >= int64(n) {
						halt.Store(true)
					}
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return r, firstErr
	}
	if err := ctx.Err(); err != nil {
		return r, err
	}
	var perReq [2]time.Duration
	var rate [2]float64
	for i, px := range proxies {
		after, err := procstat.ReadStat(servicekit.ProcRoot, px.proc.PID)
		if err != nil {
			return r, err
		}
		served := max(done[i].Load(), 1)
		perReq[i] = (after.CPU() - before[i].CPU()) / time.Duration(served)
		rate[i] = float64(served) / elapsed.Seconds()
	}
	r.Managed, r.ManagedRate = perReq[managed], rate[managed]
	r.Own, r.OwnRate = perReq[1-managed], rate[1-managed]
	r.Ratio = float64(r.Managed) / float64(r.Own)
	return r, nil
}
