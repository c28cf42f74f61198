package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/bench/servicekit"
	"github.com/ferryserve/ferry/replicas"
)

// TestFaultsShort runs the whole benchmark, --short, against a ferry built from the working
// tree: a real controller, local replica-sim replicas and the attached proxy, in a temporary
// FERRY_HOME on a tmpfs. Every fault must meet its targets. Without root the disk-full
// scenario cannot mount its tmpfs and is skipped, with the reason in the report.
func TestFaultsShort(t *testing.T) {
	bin, out := servicekit.ShortRunEnv(t)

	opts, err := parseFlags([]string{"--short", "--ferry-bin", bin, "--out", out})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var summary bytes.Buffer
	start := time.Now()
	rep, err := execute(ctx, opts, &summary, func(format string, args ...any) { t.Logf(format, args...) })
	t.Logf("run took %v; summary:\n%s", time.Since(start).Round(time.Second), summary.String())
	if err != nil {
		t.Fatalf("execute: %v", err)
	}
	if got, want := len(rep.Results), len(scenarios()); got != want {
		t.Fatalf("%d scenarios ran, want %d", got, want)
	}
	for _, s := range rep.Results {
		if s.Skipped != "" {
			t.Logf("scenario %s (%s) %s", s.Key, s.Title, s.Skipped)
			continue
		}
		if !s.Passed {
			t.Errorf("scenario %s (%s) failed: %s", s.Key, s.Title, strings.Join(s.Why, "; "))
		}
	}
	for _, p := range rep.Teardown {
		t.Errorf("teardown: %s", p)
	}
	if t.Failed() {
		log := filepath.Join(out, "logs", "home", "controller.log") // copied out of the tmpfs
		if _, err := os.Stat(log); err != nil {
			log = filepath.Join(out, "home", "controller.log")
		}
		t.Logf("controller.log, warnings and errors:\n%s", servicekit.LogLevels(log, "warn", "error"))
	}
}

func sseChunk(content string) string {
	return `data: {"object":"chat.completion.chunk","model":"faults-sim","choices":[{"delta":{"content":"` + content + `"}}]}` + "\n\n"
}

func TestReadStream(t *testing.T) {
	done := "data: [DONE]\n\n"
	proxyCut := `data: {"error":{"message":"the replica serving this stream for service \"faults\" failed mid-stream","type":"upstream_error","code":"stream_interrupted"}}` + "\n\n"
	tests := map[string]struct {
		stream string
		want   outcome
	}{
		"complete":                      {stream: sseChunk("a") + sseChunk("b") + done, want: outcomeOK},
		"comments and no space":         {stream: ": keep-alive\n\n" + "data:{\"choices\":[]}\n" + "data:[DONE]\n", want: outcomeOK},
		"cut with the proxy's event":    {stream: sseChunk("a") + proxyCut, want: outcomeCutWithEvent},
		"cut without an event":          {stream: sseChunk("a"), want: outcomeCutNoEvent},
		"empty":                         {stream: "", want: outcomeCutNoEvent},
		"error event not OpenAI-shaped": {stream: sseChunk("a") + `data: {"error":"boom"}` + "\n\n", want: outcomeCutNoEvent},
		"content mentioning error":      {stream: sseChunk(`\"error\" is a word`) + done, want: outcomeOK},
		"long line":                     {stream: sseChunk(strings.Repeat("x", 20<<10)) + done, want: outcomeOK},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := readStream(bufio.NewReaderSize(strings.NewReader(tc.stream), 4<<10))
			if got != tc.want {
				t.Errorf("readStream = %v (%v), want %v", got, err, tc.want)
			}
		})
	}
}

func TestClassifyStatus(t *testing.T) {
	busy := []byte(`{"error":{"message":"all replicas of service \"faults\" are at their connection limit","type":"service_unavailable","code":"replicas_busy"}}`)
	tests := map[string]struct {
		status     int
		retryAfter string
		body       []byte
		want       outcome
	}{
		"503 with Retry-After":     {503, "1", busy, outcomeShed},
		"429 with Retry-After":     {429, "1", busy, outcomeShed},
		"503 without Retry-After":  {503, "", busy, outcomeFailed},
		"502":                      {502, "1", busy, outcomeFailed},
		"503 not OpenAI-shaped":    {503, "1", []byte("<html>busy</html>"), outcomeFailed},
		"500 from a replica":       {500, "", []byte(`{"error":{"message":"boom","type":"internal_server_error"}}`), outcomeFailed},
		"error without a message":  {503, "1", []byte(`{"error":{"type":"x"}}`), outcomeFailed},
		"error that is not object": {503, "1", []byte(`{"error":"x"}`), outcomeFailed},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got, msg := classifyStatus(tc.status, []byte(tc.retryAfter), tc.body); got != tc.want {
				t.Errorf("classifyStatus = %v (%s), want %v", got, msg, tc.want)
			}
		})
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP go_goroutines Number of goroutines.
# TYPE go_goroutines gauge
go_goroutines 42
ferry_replicas_ejected{service="faults"} 1
ferry_replicas_ejected{service="other"} 3
ferry_replica_ejections_total{service="faults"} 7
ferry_retries_total{service="faults"} 2.5e+01
`
	got, err := parseMetrics(strings.NewReader(text), "go_goroutines", "ferry_replicas_ejected", "ferry_retries_total")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"go_goroutines": 42, `ferry_replicas_ejected{service="faults"}`: 1, `ferry_replicas_ejected{service="other"}`: 3,
		`ferry_retries_total{service="faults"}`: 25,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("parseMetrics (-want +got):\n%s", diff)
	}
}

func TestStoreMismatches(t *testing.T) {
	rows := []storeRow{{ID: 1, Status: "READY"}, {ID: 2, Status: "STARTING"}, {ID: 9, Status: "FAILED"}}
	recs := []replicas.Record{{ID: 1, Status: replicas.StatusReady}, {ID: 2, Status: replicas.StatusReady}, {ID: 3, Status: replicas.StatusStarting}}
	want := []string{
		"replica 2 is STARTING in the store, READY in the controller",
		"replica 3 (STARTING) has no row",
		"row of replica 9 (FAILED) that the controller does not report",
	}
	if diff := cmp.Diff(want, storeMismatches(rows, recs)); diff != "" {
		t.Errorf("storeMismatches (-want +got):\n%s", diff)
	}
	if got := storeMismatches(rows[:1], recs[:1]); len(got) != 0 {
		t.Errorf("agreeing store: %v", got)
	}
}

func TestJudge(t *testing.T) {
	healthy := func(kind faultKind) *scenarioResult {
		return &scenarioResult{Kind: kind, HealedAfterS: 1, EjectedAfterS: 1.2, ProxyEjectedAfterS: 1.3, Flips: 2, Flood: &floodResult{Shed: 5},
			LeaksBefore: snapshotLeaks{Controller: processStats{PID: 1, FDs: 30, Goroutines: 40}},
			LeaksAfter:  snapshotLeaks{Controller: processStats{PID: 1, FDs: 30 + fdSlack, Goroutines: 40 + goroutineSlack}}}
	}
	tests := map[string]struct {
		res     *scenarioResult
		wantWhy []string // substrings, in order; none: passes
	}{
		"all well": {res: healthy(faultKill)},
		"non-streamed failure": {res: func() *scenarioResult { r := healthy(faultKill); r.Plain.Failed = 1; r.Plain.Sent = 9; return r }(),
			wantWhy: []string{"1 of 9 non-streamed requests failed"}},
		"cut stream with an event is allowed": {res: func() *scenarioResult { r := healthy(faultKill); r.Stream.CutWithEvent = 3; return r }()},
		"cut stream without an event": {res: func() *scenarioResult { r := healthy(faultKill); r.Stream.CutNoEvent = 1; return r }(),
			wantWhy: []string{"cut without an SSE error event"}},
		"shed outside the flood": {res: func() *scenarioResult { r := healthy(faultHang); r.Plain.Shed = 2; return r }(),
			wantWhy: []string{"2 of 0 non-streamed requests failed"}},
		"shed in the flood": {res: func() *scenarioResult { r := healthy(faultExhaust); r.Plain.Shed = 2; r.Stream.Shed = 1; return r }()},
		"flood never exhausted": {res: func() *scenarioResult { r := healthy(faultExhaust); r.Flood.Shed = 0; return r }(),
			wantWhy: []string{"never exhausted"}},
		"failure after the flood": {res: func() *scenarioResult { r := healthy(faultExhaust); r.PostFaultFailed = 1; return r }(),
			wantWhy: []string{"after the flood ended"}},
		"slow ejection": {res: func() *scenarioResult { r := healthy(faultHang); r.EjectedAfterS = 2.5; return r }(),
			wantWhy: []string{"after 2.50 s (target: within 2s)"}},
		"never ejected": {res: func() *scenarioResult { r := healthy(faultHang); r.ProxyEjectedAfterS = 0; return r }(),
			wantWhy: []string{"attached proxy's rotation after never"}},
		"slow replica ejected": {res: func() *scenarioResult { r := healthy(faultErrors); r.Ejections = 1; return r }(),
			wantWhy: []string{"slow but answering replica was ejected"}},
		"no flapping seen": {res: func() *scenarioResult { r := healthy(faultFlap); r.Flips = 0; return r }(),
			wantWhy: []string{"never changed"}},
		"not healed": {res: func() *scenarioResult { r := healthy(faultKill); r.HealedAfterS = -1; return r }(),
			wantWhy: []string{"did not heal"}},
		"fd leak": {res: func() *scenarioResult { r := healthy(faultKill); r.LeaksAfter.Controller.FDs++; return r }(),
			wantWhy: []string{"controller holds 37 fds"}},
		"new controller": {res: func() *scenarioResult {
			r := healthy(faultController)
			r.LeaksAfter.Controller = processStats{PID: 2, FDs: 99}
			return r
		}()},
		"orphan and store": {res: func() *scenarioResult {
			r := healthy(faultKill)
			r.Orphans, r.StoreMismatch = []string{"process group 5"}, []string{"replica 3 (READY) has no row"}
			return r
		}(), wantWhy: []string{"leftover process", "store: replica 3"}},
		"skipped": {res: &scenarioResult{Kind: faultDiskFull, Skipped: "skipped: needs root"}},
		"bodies refused, memory flat": {res: func() *scenarioResult {
			r := healthy(faultUnauthBodies)
			r.Bodies = &bodyAttackResult{Sent: 500, Refused: 500, PeakRSS: 70 << 20, HWM: 72 << 20}
			return r
		}()},
		"bodies: memory and slow answers": {res: func() *scenarioResult {
			r := healthy(faultUnauthBodies)
			r.Bodies = &bodyAttackResult{Sent: 500, Refused: 490, Unanswered: 10, PeakRSS: 70 << 20, HWM: 3 << 30}
			r.Plain.Failed, r.Plain.Sent = 1, 20
			return r
		}(), wantWhy: []string{"1 of 20 non-streamed", "RSS reached 3072 MiB", "10 of 500 unauthenticated"}},
		"flood: failures during, none after": {res: func() *scenarioResult {
			r := healthy(faultConnFlood)
			r.Plain.Failed, r.Stream.Shed = 3, 2
			r.ConnFloods = []*connFloodResult{{Target: "gateway", FDLimit: 1024, Opened: 1500, Alive: true, ServedAfterS: 0.5}}
			return r
		}()},
		"flood: dead, silent, short": {res: func() *scenarioResult {
			r := healthy(faultConnFlood)
			r.PostFaultFailed = 2
			r.ConnFloods = []*connFloodResult{{Target: "proxy", FDLimit: 512, Opened: 1500, ServedAfterS: 1},
				{Target: "gateway", FDLimit: 1024, Opened: 1500, Alive: true, ServedAfterS: -1, LastError: "EOF"},
				{Target: "other", FDLimit: 1024, Opened: 900, Alive: true, ServedAfterS: 1}}
			return r
		}(), wantWhy: []string{"2 keyed requests", "proxy stopped", "gateway did not serve", "not past its limit"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.res.judge(options{})
			if tc.res.Passed != (len(tc.wantWhy) == 0) || len(tc.res.Why) != len(tc.wantWhy) {
				t.Fatalf("passed %v, why %q; want %q", tc.res.Passed, tc.res.Why, tc.wantWhy)
			}
			for i, w := range tc.wantWhy {
				if !strings.Contains(tc.res.Why[i], w) {
					t.Errorf("why[%d] = %q, want it to mention %q", i, tc.res.Why[i], w)
				}
			}
		})
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--short", "--hang-for", "7s", "--only", "2,7"})
	if err != nil {
		t.Fatal(err)
	}
	if o.workers != 4 || o.hangFor != 7*time.Second || o.floodStreams != 4*proxyConnsPerReplica+256 || !o.selected("7") || o.selected("1") {
		t.Errorf("parsed %+v", o)
	}
	_, err = parseFlags([]string{"--replicas", "1", "--only", "10", "--error-rate", "0.8", "--conn-flood", "1000"})
	for _, want := range []string{"--replicas=1", "--only=10", "--error-rate/--slow-rate", "--conn-flood=1000"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseFlags error = %v, want it to mention %s", err, want)
		}
	}
}

func TestTornLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "controller.log")
	log := `{"level":"info","msg":"a"}` + "\n" + `{"level":"info","msg":"b","ti{"level":"info","msg":"c"}` + "\n\n" + `{"level":"info","msg":"d"}` + "\n"
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := tornLines(path); err != nil || got != 1 {
		t.Errorf("tornLines = %d, %v; want 1", got, err)
	}
}
