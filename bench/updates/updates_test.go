package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/bench/loadgen"
	"github.com/ferryserve/ferry/bench/servicekit"
	"github.com/ferryserve/ferry/configs"
)

// TestUpdatesShort runs the whole benchmark, --short, against a ferry built from the working
// tree: a real controller, local replica-sim replicas and the attached proxy, in a temporary
// FERRY_HOME. Every scenario must pass.
func TestUpdatesShort(t *testing.T) {
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
		if !s.Passed {
			t.Errorf("scenario %s (%s) failed: %s", s.Key, s.Title, strings.Join(s.Why, "; "))
		}
		for _, n := range s.Notes {
			t.Logf("scenario %s note: %s", s.Key, n)
		}
	}
	for _, p := range rep.Teardown {
		t.Errorf("teardown: %s", p)
	}
	if t.Failed() {
		// The output directory goes with the test: keep what explains the failure.
		t.Logf("controller.log, warnings and errors:\n%s", servicekit.LogLevels(filepath.Join(out, "home", "controller.log"), "warn", "error"))
	}
}

func TestModelOfJSON(t *testing.T) {
	tests := map[string]struct {
		body      string
		wantModel string
		wantErr   string
	}{
		"completion": {body: `{"id":"x","object":"chat.completion","model":"upd-v2","choices":[]}`, wantModel: "upd-v2"},
		"error":      {body: `{"error":{"message":"no ready replica","type":"service_unavailable","code":"no_replica"}}`, wantErr: "carried an error"},
		"null error": {body: `{"model":"upd-v1","error":null}`, wantModel: "upd-v1"},
		"no model":   {body: `{"object":"chat.completion"}`, wantErr: errNoModel.Error()},
		"not json":   {body: `<html>bad gateway</html>`, wantErr: "not JSON"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := modelOfJSON([]byte(tc.body))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("modelOfJSON() error = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.wantModel {
				t.Fatalf("modelOfJSON() = %q, %v; want %q", got, err, tc.wantModel)
			}
		})
	}
}

func sseChunk(model, content string) string {
	return fmt.Sprintf(`data: {"object":"chat.completion.chunk","model":%q,"choices":[{"delta":{"content":%q}}]}`+"\n\n", model, content)
}

func TestReadStream(t *testing.T) {
	done := "data: [DONE]\n\n"
	usage := `data: {"object":"chat.completion.chunk","model":"upd-v3","choices":[],"usage":{"total_tokens":9}}` + "\n\n"
	tests := map[string]struct {
		stream    string
		wantModel string
		wantErr   error  // matched with errors.Is
		wantText  string // or matched in the message
	}{
		"complete":              {stream: sseChunk("upd-v3", "a") + sseChunk("upd-v3", "b") + usage + done, wantModel: "upd-v3"},
		"comments and events":   {stream: ": keep-alive\n\nevent: message\n" + sseChunk("upd-v1", "a") + done, wantModel: "upd-v1"},
		"no space after colon":  {stream: `data:{"model":"upd-v2"}` + "\ndata:[DONE]\n", wantModel: "upd-v2"},
		"cut without DONE":      {stream: sseChunk("upd-v3", "a"), wantErr: loadgen.ErrIncompleteStream},
		"empty body":            {stream: "", wantErr: loadgen.ErrIncompleteStream},
		"proxy error event":     {stream: sseChunk("upd-v3", "a") + `data: {"error":{"message":"the replica serving this stream for service \"upd\" failed mid-stream","type":"server_error"}}` + "\n\n", wantErr: errStreamError},
		"error then DONE":       {stream: `data: {"error":{"message":"x"}}` + "\n\n" + done, wantErr: errStreamError},
		"two versions":          {stream: sseChunk("upd-v2", "a") + sseChunk("upd-v3", "b") + done, wantErr: errMixedModels},
		"no model":              {stream: `data: {"choices":[]}` + "\n\n" + done, wantErr: errNoModel},
		"data after DONE":       {stream: sseChunk("upd-v1", "a") + done + sseChunk("upd-v1", "b"), wantText: "after [DONE]"},
		"garbage chunk":         {stream: "data: {not json\n\n" + done, wantText: "not JSON"},
		"line longer than buf":  {stream: sseChunk("upd-v4", strings.Repeat("x", 300)) + done, wantModel: "upd-v4"},
		"crlf line ends":        {stream: strings.ReplaceAll(sseChunk("upd-v5", "a")+done, "\n", "\r\n"), wantModel: "upd-v5"},
		"usage chunk only":      {stream: usage + done, wantModel: "upd-v3"},
		"DONE without newline":  {stream: sseChunk("upd-v1", "a") + "data: [DONE]", wantModel: "upd-v1"},
		"error in a later line": {stream: sseChunk("upd-v1", "a") + `data: {"model":"upd-v1","error":{"code":"x"}}` + "\n\n" + done, wantErr: errStreamError},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			// A small buffer, so that long lines take the ErrBufferFull path.
			br := bufio.NewReaderSize(strings.NewReader(tc.stream), 64)
			got, err := readStream(br)
			switch {
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("readStream() error = %v, want %v", err, tc.wantErr)
				}
			case tc.wantText != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantText) {
					t.Fatalf("readStream() error = %v, want one mentioning %q", err, tc.wantText)
				}
			default:
				if err != nil || got != tc.wantModel {
					t.Fatalf("readStream() = %q, %v; want %q", got, err, tc.wantModel)
				}
			}
		})
	}
}

// TestClient drives doPlain and doStream against a loopback server that answers like a replica
// or the proxy would, failures included.
func TestClient(t *testing.T) {
	mux := http.NewServeMux()
	var mode string // set per subtest; the requests are sequential
	mux.HandleFunc("POST "+servicekit.ChatPath, func(w http.ResponseWriter, r *http.Request) {
		switch mode {
		case "ok":
			if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, sseChunk("upd-v2", "a")+sseChunk("upd-v2", "b")+"data: [DONE]\n\n")
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"object":"chat.completion","model":"upd-v2"}`)
		case "503":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"error":{"message":"no ready replica"}}`)
		case "json-for-stream":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"object":"chat.completion","model":"upd-v2"}`)
		case "cut":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, sseChunk("upd-v2", "a"))
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	c, err := newClient(ln.Addr().String(), 2, 5*time.Second, 4, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer c.closeIdle()
	var status *loadgen.StatusError
	tests := []struct {
		mode             string
		wantPlain        string
		wantPlainErr     any // error value or *target for errors.As
		wantStream       string
		wantStreamErrIs  error
		wantStreamStatus bool
	}{
		{mode: "ok", wantPlain: "upd-v2", wantStream: "upd-v2"},
		{mode: "503", wantPlainErr: &status, wantStreamStatus: true},
		{mode: "json-for-stream", wantPlain: "upd-v2", wantStreamErrIs: loadgen.ErrNotEventStream},
		{mode: "cut", wantPlainErr: "not JSON", wantStreamErrIs: loadgen.ErrIncompleteStream},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			mode = tc.mode
			got, err := c.doPlain()
			switch want := tc.wantPlainErr.(type) {
			case nil:
				if err != nil || got != tc.wantPlain {
					t.Errorf("doPlain() = %q, %v; want %q", got, err, tc.wantPlain)
				}
			case **loadgen.StatusError:
				if !errors.As(err, want) || (*want).Status != http.StatusServiceUnavailable {
					t.Errorf("doPlain() error = %v, want HTTP 503", err)
				}
			case string:
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("doPlain() error = %v, want one mentioning %q", err, want)
				}
			}
			got, err = c.doStream()
			switch {
			case tc.wantStreamErrIs != nil:
				if !errors.Is(err, tc.wantStreamErrIs) {
					t.Errorf("doStream() error = %v, want %v", err, tc.wantStreamErrIs)
				}
			case tc.wantStreamStatus:
				var se *loadgen.StatusError
				if !errors.As(err, &se) || se.Status != http.StatusServiceUnavailable {
					t.Errorf("doStream() error = %v, want HTTP 503", err)
				}
			default:
				if err != nil || got != tc.wantStream {
					t.Errorf("doStream() = %q, %v; want %q", got, err, tc.wantStream)
				}
			}
		})
	}
	if _, err := newClient("10.0.0.1:80", 1, time.Second, 1, 1); !errors.Is(err, loadgen.ErrNotLoopback) {
		t.Errorf("newClient(10.0.0.1:80) error = %v, want ErrNotLoopback", err)
	}
}

func TestAggregate(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	updateStart, rolloutEnd := at(10), at(20)
	records := []record{
		// Out of order on purpose: workers' records are concatenated, not sorted.
		{Start: at(21), Latency: ms(500), Stream: true, Model: "upd-v2"},
		{Start: at(1), Latency: ms(200), Model: "upd-v1"},
		{Start: at(2), Latency: ms(500), Stream: true, Model: "upd-v1"},
		{Start: at(10), Latency: ms(210), Model: "upd-v1"},               // at the update's start: during
		{Start: at(12), Latency: ms(220), Model: "upd-v2"},               // first new answer
		{Start: at(13), Latency: ms(600), Stream: true, Model: "upd-v1"}, // old after new
		{Start: at(14), Latency: ms(5), Err: "HTTP 503: no ready replica"},
		{Start: at(15), Latency: ms(300), Stream: true, Model: "upd-v1", Err: "stream carried an error event"},
		{Start: at(20), Latency: ms(200), Model: "upd-v2"}, // at the rollout's end: during
		{Start: at(22), Latency: ms(200), Model: "upd-v2"},
		{Start: at(20.25), Latency: ms(200), Model: "upd-v1"}, // the data plane catching up
	}
	r := scenarioResult{WantModel: "upd-v2"}
	r.aggregate(records, updateStart, rolloutEnd, "upd-v1", "upd-v2")

	if r.Requests != 11 || r.Failed != 2 {
		t.Errorf("requests, failed = %d, %d; want 11, 2", r.Requests, r.Failed)
	}
	wantCounts := map[string][2]int{"before": {2, 0}, "during": {6, 2}, "after": {3, 0}}
	gotCounts := map[string][2]int{
		"before": {r.Before.Requests, r.Before.Failed},
		"during": {r.During.Requests, r.During.Failed},
		"after":  {r.After.Requests, r.After.Failed},
	}
	if diff := cmp.Diff(wantCounts, gotCounts); diff != "" {
		t.Errorf("requests and failures per phase (-want +got):\n%s", diff)
	}
	wantModels := []map[string]int{{"upd-v1": 2}, {"upd-v1": 2, "upd-v2": 2}, {"upd-v1": 1, "upd-v2": 2}}
	if diff := cmp.Diff(wantModels, []map[string]int{r.Before.Models, r.During.Models, r.After.Models}); diff != "" {
		t.Errorf("models per phase (-want +got):\n%s", diff)
	}
	if r.FirstNewAtS == nil || *r.FirstNewAtS != 2 {
		t.Errorf("FirstNewAtS = %v, want 2", r.FirstNewAtS)
	}
	if r.OldAfterFirstNew != 2 {
		t.Errorf("OldAfterFirstNew = %d, want 2", r.OldAfterFirstNew)
	}
	if diff := cmp.Diff([]stray{{AfterEndMs: 250, Model: "upd-v1"}}, r.Strays); diff != "" {
		t.Errorf("strays (-want +got):\n%s", diff)
	}
	wantFailures := []failure{
		{AtS: 4, Phase: phaseDuring, Err: "HTTP 503: no ready replica"},
		{AtS: 5, Phase: phaseDuring, Stream: true, Model: "upd-v1", Err: "stream carried an error event"},
	}
	if diff := cmp.Diff(wantFailures, r.Failures); diff != "" {
		t.Errorf("failures (-want +got):\n%s", diff)
	}
	if got := r.During.Plain.Count; got != 3 {
		t.Errorf("during: %d plain latencies, want 3 (failed requests excluded)", got)
	}
	if got := r.Before.Stream.P50Ms; got < 499 || got > 501 {
		t.Errorf("before: stream p50 = %v ms, want 500", got)
	}
	if len(r.Records) != 11 || r.Records[0].StartS != -9 || r.Records[10].StartS != 12 {
		t.Errorf("records not sorted by start relative to the update: first %+v, last %+v", r.Records[0], r.Records[len(r.Records)-1])
	}

	// No new-version answer at all (a rolled-back update).
	rb := scenarioResult{WantModel: "upd-v1"}
	rb.aggregate(records[1:4], updateStart, rolloutEnd, "upd-v1", "upd-v9")
	if rb.FirstNewAtS != nil || rb.OldAfterFirstNew != 0 || rb.Strays != nil {
		t.Errorf("without new answers: FirstNewAtS = %v, OldAfterFirstNew = %d, strays %v; want nil, 0, none", rb.FirstNewAtS, rb.OldAfterFirstNew, rb.Strays)
	}
}

func TestAggregateKeepsFirstFailures(t *testing.T) {
	t0 := time.Now()
	var records []record
	for i := range 9 {
		records = append(records, record{Start: t0.Add(time.Duration(i) * time.Second), Err: fmt.Sprintf("failure %d", i)})
	}
	var r scenarioResult
	r.aggregate(records, t0, t0.Add(time.Minute), "upd-v1", "upd-v2")
	if r.Failed != 9 || len(r.Failures) != maxFailuresKept || r.Failures[0].Err != "failure 0" {
		t.Errorf("failed %d, kept %d (first %q); want 9, %d, failure 0", r.Failed, len(r.Failures), r.Failures[0].Err, maxFailuresKept)
	}
}

func TestJudge(t *testing.T) {
	passing := func() scenarioResult {
		return scenarioResult{WantState: "SUCCEEDED", State: "SUCCEEDED", WantModel: "upd-v2", Requests: 10, SettleMs: 500,
			After: phaseStats{Requests: 3, Models: map[string]int{"upd-v2": 3}}}
	}
	tests := map[string]struct {
		edit      func(*scenarioResult)
		wantWhy   []string
		wantNotes []string
	}{
		"pass": {edit: func(*scenarioResult) {}},
		"failed requests": {edit: func(r *scenarioResult) { r.Failed = 2 },
			wantWhy: []string{"2 of 10 requests failed"}},
		"wrong state": {edit: func(r *scenarioResult) { r.State = "ROLLED_BACK" },
			wantWhy: []string{"rollout ended ROLLED_BACK, want SUCCEEDED"}},
		"old version after": {edit: func(r *scenarioResult) {
			r.Strays = []stray{{AfterEndMs: 20, Model: "upd-v1"}, {AfterEndMs: 500, Model: "upd-v1"}, {AfterEndMs: 900, Model: "upd-v1"}}
		},
			wantWhy:   []string{"upd-v1 answered 2 requests started 500 ms or more after the rollout ended (only upd-v2 may)"},
			wantNotes: []string{"upd-v1 ×1 answered requests that started after the rollout was seen to end, the last 20.0 ms after (within the 500 ms allowed for the data plane to follow)"}},
		"old version while settling": {edit: func(r *scenarioResult) {
			r.Strays = []stray{{AfterEndMs: 1.5, Model: "upd-v1"}, {AfterEndMs: 31, Model: "upd-v1", Stream: true}}
		},
			wantNotes: []string{"upd-v1 ×2 answered requests that started after the rollout was seen to end, the last 31.0 ms after (within the 500 ms allowed for the data plane to follow)"}},
		"strict": {edit: func(r *scenarioResult) { r.SettleMs = 0; r.Strays = []stray{{AfterEndMs: 0, Model: "upd-v1"}} },
			wantWhy: []string{"upd-v1 answered 1 requests started 0 ms or more after the rollout ended (only upd-v2 may)"}},
		"nothing after": {edit: func(r *scenarioResult) {
			r.After = phaseStats{Requests: 2, Failed: 2, Models: map[string]int{}}
			r.Failed = 2
		},
			wantWhy: []string{"2 of 10 requests failed", "no request succeeded after the rollout ended"}},
		"driver error": {edit: func(r *scenarioResult) { r.Error = "needs the attached proxy"; r.State = "" },
			wantWhy: []string{"not completed: needs the attached proxy", "rollout ended —, want SUCCEEDED"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := passing()
			tc.edit(&r)
			r.judge()
			if diff := cmp.Diff(tc.wantWhy, r.Why); diff != "" {
				t.Errorf("why (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantNotes, r.Notes); diff != "" {
				t.Errorf("notes (-want +got):\n%s", diff)
			}
			if r.Passed != (len(tc.wantWhy) == 0) {
				t.Errorf("Passed = %v with why %q", r.Passed, r.Why)
			}
		})
	}
}

// TestTaskYAML checks that every version the driver writes is a valid Ferry task with the
// knobs it means.
func TestTaskYAML(t *testing.T) {
	spec := taskSpec{Replicas: 4, MaxParallel: 2, MinHealthySeconds: 1, InitialDelaySeconds: 30,
		StartupDelay: time.Second, TTFT: 50 * time.Millisecond, ITL: 20 * time.Millisecond}
	for _, crash := range []bool{false, true} {
		task, err := configs.Parse("v3.yaml", []byte(taskYAML(spec, 3, crash)), configs.Overrides{})
		if err != nil {
			t.Fatalf("crash=%v: %v\n%s", crash, err, taskYAML(spec, 3, crash))
		}
		s := task.Service
		got := []any{task.Name, task.Envs["MODEL"], s.ReplicaPolicy.MinReplicas, s.ReplicaPolicy.MaxReplicas,
			s.ReadinessProbe.Path, s.ReadinessProbe.InitialDelaySeconds, s.Update.MaxParallel, s.Update.MinHealthySeconds}
		want := []any{"upd", "upd-v3", 4, 4, "/health", 30, 2, 1}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("crash=%v: task (-want +got):\n%s", crash, diff)
		}
		wantRun := "ferry replica-sim --port $FERRY_PORT --model $MODEL --startup-delay 1s --ttft 50ms --itl 20ms"
		if crash {
			wantRun = crashRun
		}
		if task.Run != wantRun {
			t.Errorf("crash=%v: run = %q, want %q", crash, task.Run, wantRun)
		}
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.workers != 8 || o.before != 5*time.Second || o.after != 3*time.Second || o.maxParallel != 1 {
		t.Errorf("defaults: workers %d before %v after %v max-parallel %d", o.workers, o.before, o.after, o.maxParallel)
	}
	o, err = parseFlags([]string{"--short", "--workers", "6"})
	if err != nil {
		t.Fatal(err)
	}
	if o.workers != 6 || o.before != 2*time.Second || o.after != time.Second || o.maxParallel != 2 {
		t.Errorf("--short --workers 6: workers %d before %v after %v max-parallel %d", o.workers, o.before, o.after, o.maxParallel)
	}
	_, err = parseFlags([]string{"--workers", "1", "--max-parallel", "9", "--before", "0s"})
	for _, want := range []string{"--workers=1", "--max-parallel=9", "--before=0s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bad flags: error = %v, want one naming %s", err, want)
		}
	}
}
