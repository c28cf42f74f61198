package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
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

// The CPU phase: what a managed key costs the proxy that serves it. One more attached proxy, in
// front of a service of its own whose replica answers at once (so that the proxy, not the
// engine, sets the pace), serves the same small chat completions under two keys in alternating
// rounds: a managed key with per-minute and per-day limits on itself and its team and a dollar
// budget (identified, scoped, admitted, priced, settled from the answer's usage, six
// x-ratelimit-* headers), and a key of the service's own (service.auth.keys_from_env: what the
// gateway did before managed keys). The proxy's own CPU time, read from /proc around each round,
// divided by the round's requests, is the figure: the load generator and the replica are other
// processes, so neither's work is counted. Bar (issue 41): the managed key ≤ 1.10× the own key,
// the median of the rounds' paired ratios.

const (
	cpuService = "tenants-cpu"
	cpuKeyEnv  = "FERRY_BENCH_OWN_KEY"
	cpuWorkers = 32
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
	Requests int // per key and round
	Rounds   []cpuRound
	// Median is the median of the rounds' ratios; Pass judges it against cpuBar.
	Median float64
	Pass   bool
	// Headers are the rate headers of a managed key's answer: proof that the work was done.
	Headers map[string]string
}

type cpuRound struct {
	Own, Managed time.Duration // the proxy's CPU per request
	OwnRate      float64       // requests per second under the own key
	Ratio        float64
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
	addr, err := benchkit.FreeLoopbackAddr()
	if err != nil {
		return res, err
	}
	maddr, err := benchkit.FreeLoopbackAddr()
	if err != nil {
		return res, err
	}
	p, err := b.f.Group.Start(childproc.Spec{Name: "proxy-cpu", Env: b.f.Env, CPU: o.cpuPin,
		Argv: []string{b.f.Bin, "proxy", "--attach", cpuService, "--listen", addr, "--metrics-listen", maddr}})
	if err != nil {
		return res, err
	}
	defer b.f.Group.Stop(p)
	l := &cpuLoad{url: "http://" + addr + "/v1/chat/completions",
		body:   fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Say hello."}],"max_tokens":8}`, model),
		client: &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: cpuWorkers, MaxConnsPerHost: cpuWorkers}}}
	defer l.client.CloseIdleConnections()
	err = servicekit.PollUntil(ctx, time.Minute, 200*time.Millisecond, func() (bool, error) {
		h, err := l.once(ctx, secret)
		res.Headers = h
		return err == nil, nil
	})
	if err != nil {
		return res, fmt.Errorf("the CPU phase's proxy never served the managed key: %w\n%s", err, servicekit.LastLines(p.LogTail(1<<16), 10))
	}
	if res.Headers["X-Ratelimit-Limit-Tokens"] == "" || res.Headers["X-Ratelimit-Remaining-Requests"] == "" {
		return res, fmt.Errorf("a managed key's answer lacks its rate headers: %v", res.Headers)
	}
	res.Requests = o.cpuRequests
	progress("cpu: %d rounds of %d requests a key, %d at a time, through one attached proxy", o.cpuRounds, o.cpuRequests, cpuWorkers)
	for _, key := range []string{own, secret} { // warm both paths: connections, pools, the ledger's rows
		if _, _, err := l.round(ctx, key, max(o.cpuRequests/4, 500), p.PID); err != nil {
			return res, err
		}
	}
	for i := range o.cpuRounds {
		var r cpuRound
		for j := range 2 { // the order alternates, so that drift in the host's speed hits both alike
			managed := (i+j)%2 == 1
			key := own
			if managed {
				key = secret
			}
			perReq, rate, err := l.round(ctx, key, o.cpuRequests, p.PID)
			if err != nil {
				return res, err
			}
			if managed {
				r.Managed = perReq
			} else {
				r.Own, r.OwnRate = perReq, rate
			}
		}
		r.Ratio = float64(r.Managed) / float64(r.Own)
		res.Rounds = append(res.Rounds, r)
		progress("cpu: round %d: own key %v, managed key %v a request (%.3f×)", i+1, r.Own, r.Managed, r.Ratio)
	}
	ratios := make([]float64, len(res.Rounds))
	for i, r := range res.Rounds {
		ratios[i] = r.Ratio
	}
	slices.Sort(ratios)
	res.Median = ratios[len(ratios)/2]
	res.Pass = res.Median <= cpuBar
	return res, nil
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
	url, body string
	client    *http.Client
}

// once sends one request with key and returns the answer's rate headers; an answer other than a
// whole 200 is an error.
func (l *cpuLoad) once(ctx context.Context, key string) (map[string]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.url, strings.NewReader(l.body))
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

// round sends n requests with key, cpuWorkers at a time, and returns the proxy's (pid's) CPU
// time per request and the requests per second. Any failed request fails the round.
func (l *cpuLoad) round(ctx context.Context, key string, n, pid int) (time.Duration, float64, error) {
	before, err := procstat.ReadStat(servicekit.ProcRoot, pid)
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	var next atomic.Int64
	var firstErr error
	var failOnce sync.Once
	var wg sync.WaitGroup
	for range cpuWorkers {
		wg.Go(func() {
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				if _, err := l.once(ctx, key); err != nil {
					failOnce.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	after, err := procstat.ReadStat(servicekit.ProcRoot, pid)
	if err != nil {
		return 0, 0, err
	}
	if firstErr != nil {
		return 0, 0, fmt.Errorf("cpu round: %w", firstErr)
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	return (after.CPU() - before.CPU()) / time.Duration(n), float64(n) / elapsed.Seconds(), nil
}
