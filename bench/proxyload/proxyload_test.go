package main

import (
	"context"
	"math"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/valyala/fasthttp"

	"github.com/ferryserve/ferry/bench/loadgen"
)

func TestRenderNginxConfig(t *testing.T) {
	text, err := renderNginxConfig(nginxConfig{
		Prefix:            "/tmp/run/nginx",
		Listen:            "127.0.0.1:19201",
		Upstreams:         []string{"127.0.0.1:19101", "127.0.0.1:19102"},
		WorkerConnections: 1000,
		ErrorLog:          "/tmp/run/logs/nginx-error.log",
	})
	if err != nil {
		t.Fatal(err)
	}
	conf := string(text)
	// The settings the comparison depends on: one worker, no access log, keep-alive upstreams
	// over HTTP/1.1, and no response buffering so that SSE streams through.
	for _, want := range []string{
		"worker_processes 1;",
		"worker_rlimit_nofile 2064;",
		"daemon off;",
		"worker_connections 1000;",
		"access_log off;",
		"    server 127.0.0.1:19101;\n    server 127.0.0.1:19102;\n    keepalive 1024;",
		"listen 127.0.0.1:19201 backlog=4096;",
		"proxy_http_version 1.1;",
		`proxy_set_header Connection "";`,
		"proxy_buffering off;",
		"pid /tmp/run/nginx/nginx.pid;",
		"error_log /tmp/run/logs/nginx-error.log warn;",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("config lacks %q:\n%s", want, conf)
		}
	}
	if strings.Count(conf, "{") != strings.Count(conf, "}") {
		t.Errorf("unbalanced braces:\n%s", conf)
	}
}

func TestRenderNginxConfigRejects(t *testing.T) {
	valid := nginxConfig{Prefix: "/p", Listen: "127.0.0.1:1", Upstreams: []string{"127.0.0.1:2"}, WorkerConnections: 64, ErrorLog: "/p/e.log"}
	tests := map[string]struct {
		edit func(*nginxConfig)
		want string
	}{
		"relative prefix":   {func(c *nginxConfig) { c.Prefix = "rel" }, "prefix"},
		"no upstreams":      {func(c *nginxConfig) { c.Upstreams = nil }, "upstreams"},
		"injection":         {func(c *nginxConfig) { c.Upstreams = []string{"127.0.0.1:2; evil"} }, "must not contain"},
		"few connections":   {func(c *nginxConfig) { c.WorkerConnections = 1 }, "worker connections"},
		"empty listen":      {func(c *nginxConfig) { c.Listen = "" }, "listen"},
		"relative errorlog": {func(c *nginxConfig) { c.ErrorLog = "e.log" }, "error log"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := valid
			tc.edit(&c)
			if _, err := renderNginxConfig(c); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("renderNginxConfig() error = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
	if _, err := renderNginxConfig(valid); err != nil {
		t.Errorf("valid config rejected: %v", err)
	}
}

// TestBackendThroughLoadgen runs the backend in process and drives both operations the driver
// measures against it.
func TestBackendThroughLoadgen(t *testing.T) {
	if n := len(completionReply); n < 300 || n > 360 {
		t.Errorf("completion reply is %d bytes, want about 330 like the reference harness", n)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newBackendServer(backendConfig{chunks: 3, chunkGap: time.Millisecond})
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Shutdown() }()
	client, err := loadgen.NewClient(ln.Addr().String(), 4, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer client.CloseIdleConnections()
	cfg := loadgen.Config{Concurrency: 4, Duration: 5 * time.Second, MaxRequests: 40}

	res, err := loadgen.Run(context.Background(), cfg, nonStreamOp(client))
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 40 || res.Errors != 0 {
		t.Errorf("non-streamed: %d ok, %d errors (%s)", res.Requests, res.Errors, res.FirstError)
	}
	res, err = loadgen.Run(context.Background(), cfg, streamOp(client, 5, 2*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 40 || res.Errors != 0 || res.TTFB.Count() != 40 {
		t.Errorf("streams: %d ok, %d errors (%s), %d TTFBs", res.Requests, res.Errors, res.FirstError, res.TTFB.Count())
	}
	// 5 chunks 2 ms apart: at least 8 ms per stream, with the first event well before the end.
	if res.Latency.Min() < 8*time.Millisecond || res.TTFB.Quantile(0.5) >= res.Latency.Quantile(0.5) {
		t.Errorf("stream timing: min total %v, TTFB p50 %v, total p50 %v", res.Latency.Min(), res.TTFB.Quantile(0.5), res.Latency.Quantile(0.5))
	}
	// A stream of the wrong shape is an error, not a silent success.
	res, err = loadgen.Run(context.Background(), loadgen.Config{Concurrency: 1, Duration: 5 * time.Second, MaxRequests: 1},
		func(ctx context.Context, w int) (loadgen.Sample, error) {
			r, err := client.Stream(streamPath(2, 0), streamRequest, nil)
			if err == nil && r.Events != 3 {
				t.Errorf("?chunks=2 gave %d events, want 3", r.Events)
			}
			return loadgen.Sample{}, err
		})
	if err != nil || res.Errors != 0 {
		t.Errorf("query override: %v %s", err, res.FirstError)
	}
	if _, err := client.Do(fasthttp.MethodGet, "/health", nil, nil); err != nil {
		t.Errorf("GET /health: %v", err)
	}
}

func TestStreamShape(t *testing.T) {
	cfg := backendConfig{chunks: 32, chunkGap: 5 * time.Millisecond}
	tests := map[string]struct {
		query      string
		wantChunks int
		wantGap    time.Duration
		wantErr    bool
	}{
		"defaults":        {"", 32, 5 * time.Millisecond, false},
		"override both":   {"chunks=4&gap_ms=0.5", 4, 500 * time.Microsecond, false},
		"zero gap":        {"gap_ms=0", 32, 0, false},
		"too many chunks": {"chunks=10001", 0, 0, true},
		"bad gap":         {"gap_ms=-1", 0, 0, true},
		"garbage":         {"chunks=x", 0, 0, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var args fasthttp.Args
			args.Parse(tc.query)
			chunks, gap, err := streamShape(&args, cfg)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error = %v, wantErr %v", err, tc.wantErr)
			}
			if !tc.wantErr && (chunks != tc.wantChunks || gap != tc.wantGap) {
				t.Errorf("got %d chunks, gap %v; want %d, %v", chunks, gap, tc.wantChunks, tc.wantGap)
			}
		})
	}
	if got := streamPath(32, 5*time.Millisecond); got != "/v1/chat/completions?chunks=32&gap_ms=5" {
		t.Errorf("streamPath = %q", got)
	}
}

func TestPairedRatiosAndMedians(t *testing.T) {
	r := &report{opts: options{targets: allTargets}}
	// Three repetitions in which the host sped up and slowed down: ferry is always 1.5x nginx's
	// req/s within a repetition, although the medians alone would say 1.2x.
	for rep, rps := range [][2]float64{{15000, 10000}, {30000, 20000}, {12000, 8000}} {
		r.add(measurement{Scenario: scenarioNonStream, Target: targetFerry, Rep: rep, RPS: rps[0], ProxyCPUUs: 30})
		r.add(measurement{Scenario: scenarioNonStream, Target: targetNginx, Rep: rep, RPS: rps[1], ProxyCPUUs: 40})
	}
	if got := r.pairedRatio(scenarioNonStream, targetFerry, targetNginx, fRPS); got != 1.5 {
		t.Errorf("paired req/s ratio %v, want 1.5", got)
	}
	if got := r.pairedDiff(scenarioNonStream, targetFerry, targetNginx, fCPU); got != -10 {
		t.Errorf("paired CPU difference %v, want -10", got)
	}
	if got := r.pairedRatio(scenarioStream, targetFerry, targetNginx, fRPS); !math.IsNaN(got) {
		t.Errorf("ratio without data = %v, want NaN", got)
	}
	// p99 is zero in both rows, so its ratio is not measurable and that check is left out.
	want := []check{
		{Name: "non-streamed: ferry CPU/req ÷ nginx", Value: 0.75, Limit: "≤ 0.75", Pass: true},
		{Name: "non-streamed: ferry req/s ÷ nginx", Value: 1.5, Limit: "≥ 1.00", Pass: true},
	}
	if diff := cmp.Diff(want, r.checks()); diff != "" {
		t.Errorf("checks (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		in   []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {[]float64{7}, 7}} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	if !math.IsNaN(median(nil)) {
		t.Error("median of nothing should be NaN")
	}
	if diff := cmp.Diff([]string{"c", "a", "b"}, rotate([]string{"a", "b", "c"}, 5)); diff != "" {
		t.Errorf("rotate (-want +got):\n%s", diff)
	}
}

func TestReportRendersTables(t *testing.T) {
	opts := options{targets: allTargets, scenarios: allScenarios, reps: 1, duration: time.Second, proxyCPU: 0, loadCPU: 1, streams5k: 10}
	r := newReport(opts)
	for _, name := range allTargets {
		r.add(measurement{Scenario: scenarioNonStream, Target: name, RPS: 1000, ProxyCPUUs: 20, Latency: loadgen.Summary{P50Ms: 1, P99Ms: 2}})
		r.add(measurement{Scenario: scenarioStream, Target: name, RPS: 100, ProxyCPUUs: 500, TTFB: loadgen.Summary{P50Ms: 0.5}})
	}
	r.addManyStreams(manyStreams{Target: targetFerry, Streams: 10, OK: 10, PeakInFlight: 10, PeakRSSMiB: 30, HWMMiB: 31})
	var out strings.Builder
	r.render(&out)
	text := out.String()
	for _, want := range []string{
		"## Non-streamed", "## SSE streams", "## 10 concurrent SSE streams over", "## Issue targets",
		"| ferry       | 1000  |", "| passthrough | 1000  |", "passthrough CPU/req ÷ nginx (fasthttp's floor; informational)",
		"ferry CPU/req ÷ passthrough (Ferry's own work; informational)", "10 streams: ferry peak RSS MiB (all open at once, no errors: true)", "| 31.000",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	var pinning []string
	if runtime.NumCPU() < 2 {
		pinning = []string{"--proxy-cpu=-1", "--load-cpu=-1"}
	}
	good, err := parseFlags(pinning)
	if err != nil {
		t.Fatalf("defaults rejected: %v", err)
	}
	if good.concurrency != 64 || good.streamConcurrency != 32 || good.streams5k != 5000 {
		t.Errorf("defaults %+v", good)
	}
	for name, args := range map[string][]string{
		"unknown target":   {"--targets", "direct,haproxy"},
		"unknown scenario": {"--scenarios", "bulk"},
		"same cpus":        {"--proxy-cpu", "1", "--load-cpu", "1"},
		"half pinned":      {"--proxy-cpu", "-1"},
		"direct in 5k":     {"--streams5k-targets", "direct"},
		"zero duration":    {"--duration", "0s"},
		"stray argument":   {"extra"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("%s: %q accepted", name, args)
		}
	}
}
