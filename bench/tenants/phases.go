package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryserve/ferry/bench/childproc"
	"github.com/ferryserve/ferry/bench/servicekit"
)

// bench is a running set-up: the keys' secrets and the two attached proxies.
type bench struct {
	opts    options
	metrics []string // the proxies' admin listeners
	// setup are the requests that found the proxies serving, counted in the usage check.
	setup []result
	// answers are answer lengths drawn from the trace, for the fair-share and shedding phases.
	answers []int
	draws   atomic.Uint64
	f       *servicekit.Ferry
	keys    map[string]string // name → secret
	proxies []string          // base URLs
	procs   []*childproc.Proc
	client  *http.Client
}

// keySpecs are the keys the phases use, with `ferry keys create` flags.
var keySpecs = []struct {
	name  string
	flags []string
}{
	{"heavy", []string{"--priority", "standard"}},
	{"light", nil}, // --light-priority
	{"bulk", []string{"--priority", "batch"}},
	{"urgent", []string{"--priority", "interactive"}},
}

func setUp(ctx context.Context, f *servicekit.Ferry, o options, progress func(string, ...any)) (*bench, error) {
	b := &bench{opts: o, f: f, keys: map[string]string{},
		client: &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 512, MaxConnsPerHost: 512}}}
	if out, err := f.Run(ctx, "price", time.Minute, "keys", "prices", "set", model, "--input-per-million", "0.5", "--output-per-million", "1.5"); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, out)
	}
	specs := append(keySpecs, struct {
		name  string
		flags []string
	}{"capped", []string{"--tpd", strconv.FormatInt(o.budgetTokens, 10)}})
	for _, k := range specs {
		if k.name == "light" {
			k.flags = []string{"--priority", o.lightPriority}
		}
		secret, err := b.createKey(ctx, k.name, k.flags)
		if err != nil {
			return nil, err
		}
		b.keys[k.name] = secret
	}
	for i := range 2 {
		px, err := startAttachedProxy(f, fmt.Sprintf("proxy-%d", i), serviceName, -1)
		if err != nil {
			return nil, err
		}
		b.metrics = append(b.metrics, px.metrics)
		b.procs = append(b.procs, px.proc)
		b.proxies = append(b.proxies, px.base)
	}
	progress("two attached proxies: %s", strings.Join(b.proxies, ", "))
	for _, base := range b.proxies {
		err := servicekit.PollUntil(ctx, time.Minute, 200*time.Millisecond, func() (bool, error) {
			r := b.send(ctx, base, "light", false)
			b.setup = append(b.setup, r)
			return r.Status == 200, nil
		})
		if err != nil {
			return nil, fmt.Errorf("proxy %s never served a managed key: %w", base, err)
		}
	}
	// Each proxy takes its share of the replicas' slots once the controller has counted both
	// (at its next answer to their poll, up to 30 s); until then it would send the engines
	// twice their batch, which queue it first come first served. The new share serves new
	// connections: the client's are closed.
	progress("waiting for each proxy to take its share of the replicas (the controller's next answer)")
	for _, p := range b.procs {
		err := servicekit.PollUntil(ctx, time.Minute, 500*time.Millisecond, func() (bool, error) {
			return strings.Contains(p.LogTail(1<<20), `"proxies_sharing_replicas": 2`), nil
		})
		if err != nil {
			return nil, fmt.Errorf("a proxy never learned it shares the replicas: %w", err)
		}
	}
	b.client.CloseIdleConnections()
	return b, nil
}

func (b *bench) stopProxies() {
	for _, p := range b.procs {
		b.f.Group.Stop(p)
	}
}

// result is one request's outcome as the client saw it.
type result struct {
	Key       string
	Status    int
	TTFT      time.Duration
	In, Out   int64 // the usage the replica reported (0 when it answered none)
	Code      string
	Headers   map[string]string `json:",omitempty"` // a refusal's rate headers
	Err       string            `json:",omitempty"`
	SentAt    time.Duration
	proxyBase string
}

var rateHeaders = []string{"Retry-After", "X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens",
	"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests"}

var prompt = strings.Repeat("the quick brown fox jumps over the lazy dog ", 10)

// send sends one chat completion with the key's secret (as keyName's) and reads it whole.
// A stream asks for usage in its last chunk.
func (b *bench) send(ctx context.Context, base, keyName string, stream bool) result {
	answer := b.opts.answerTokens
	if stream && len(b.answers) > 0 { // the budget phase's answers stay alike: its bar is tokens
		answer = b.answers[(b.draws.Add(1)*2654435761)%uint64(len(b.answers))]
	}
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d`, model, prompt, answer)
	if stream {
		body += `,"stream":true,"stream_options":{"include_usage":true}`
	}
	body += "}"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return result{Key: keyName, Err: err.Error()}
	}
	req.Header.Set("Authorization", "Bearer "+b.keys[keyName])
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := b.client.Do(req)
	if err != nil {
		return result{Key: keyName, Err: err.Error()}
	}
	defer resp.Body.Close()
	r := result{Key: keyName, Status: resp.StatusCode, proxyBase: base}
	if resp.StatusCode != 200 {
		var e struct{ Error struct{ Code string } }
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		_ = json.Unmarshal(raw, &e)
		r.Code, r.Headers = e.Error.Code, map[string]string{}
		for _, h := range rateHeaders {
			if v := resp.Header.Get(h); v != "" {
				r.Headers[h] = v
			}
		}
		return r
	}
	var last []byte
	if stream {
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadBytes('\n')
			if payload, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
				if r.TTFT == 0 {
					r.TTFT = time.Since(start)
				}
				if p := bytes.TrimSpace(payload); !bytes.Equal(p, []byte("[DONE]")) {
					last = p
				}
			}
			if err != nil {
				break
			}
		}
	} else {
		last, _ = io.ReadAll(resp.Body)
		r.TTFT = time.Since(start)
	}
	var u struct {
		Usage *struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
		}
	}
	if json.Unmarshal(last, &u) == nil && u.Usage != nil {
		r.In, r.Out = u.Usage.Prompt, u.Usage.Completion
	} else {
		r.Err = "no usage in the answer"
	}
	return r
}

// closedLoop runs workers that each send requests back to back (alternating proxies) for d, or
// until stop reports true, and returns every result. A request under way when the loop ends is
// read to its end: cut, its tokens would be the proxy's count, not the replica's report.
func (b *bench) closedLoop(ctx context.Context, d time.Duration, workers int, keyName string, stream bool, stop func(result) bool) []result {
	var mu sync.Mutex
	var out []result
	var wg sync.WaitGroup
	var stopped atomic.Bool
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil && !stopped.Load() && time.Since(start) < d; i++ {
				r := b.send(ctx, b.proxies[(w+i)%len(b.proxies)], keyName, stream)
				r.SentAt = time.Since(start)
				mu.Lock()
				out = append(out, r)
				if stop != nil && stop(r) {
					stopped.Store(true)
				}
				mu.Unlock()
				if r.Status == 429 || r.Status == 503 {
					time.Sleep(50 * time.Millisecond) // a client backs off a little; the bench does not honour hours of Retry-After
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// openLoop sends keyName's requests at rate (Poisson) for d, each on its own goroutine.
func (b *bench) openLoop(ctx context.Context, rate float64, d time.Duration, keyName string, rng *rand.Rand) []result {
	var mu sync.Mutex
	var out []result
	var wg sync.WaitGroup
	start := time.Now()
	for i, at := 0, time.Duration(0); ; i++ {
		at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		if at >= d || servicekit.SleepCtx(ctx, time.Until(start.Add(at))) != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := b.send(ctx, b.proxies[i%len(b.proxies)], keyName, true)
			r.SentAt = at
			mu.Lock()
			out = append(out, r)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}
