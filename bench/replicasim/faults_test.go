package replicasim

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const chatBody = `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`

func TestSlowInjection(t *testing.T) {
	cfg := fastConfig()
	cfg.SlowRate, cfg.SlowDelay = 1, 150*time.Millisecond
	_, base := startServer(t, cfg)
	for _, body := range []string{chatBody, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}`} {
		start := time.Now()
		r := mustPost(t, base+"/v1/chat/completions", body)
		// A lower bound only: the delay is a sleep, so it can be longer, never shorter.
		if took := time.Since(start); r.status != http.StatusOK || took < cfg.SlowDelay {
			t.Errorf("%s: status %d after %v, want 200 after at least %v", body, r.status, took, cfg.SlowDelay)
		}
	}
}

func TestFlapDownAlternates(t *testing.T) {
	s := NewServer(fastConfig())
	t0 := time.Unix(1000, 0)
	s.setFaults(Faults{FlapPeriod: time.Second}, t0)
	for _, tc := range []struct {
		at   time.Duration
		down bool
	}{{-time.Millisecond, false}, {0, false}, {999 * time.Millisecond, false}, {time.Second, true},
		{1999 * time.Millisecond, true}, {2 * time.Second, false}, {3500 * time.Millisecond, true}} {
		if got := s.flapDown(t0.Add(tc.at)); got != tc.down {
			t.Errorf("flapDown(t0%+v) = %v, want %v", tc.at, got, tc.down)
		}
	}
	// Another fault changing leaves the flapping's phase alone; a new period restarts it.
	s.setFaults(Faults{FlapPeriod: time.Second, ErrorRate: 0.5}, t0.Add(time.Second))
	if !s.flapDown(t0.Add(1500 * time.Millisecond)) {
		t.Error("an unrelated change restarted the flapping")
	}
	s.setFaults(Faults{FlapPeriod: 2 * time.Second}, t0.Add(time.Second))
	if s.flapDown(t0.Add(1500 * time.Millisecond)) {
		t.Error("a new period did not restart the flapping from up")
	}
	s.setFaults(Faults{}, t0)
	if s.flapDown(t0.Add(time.Second)) {
		t.Error("flapping without a period")
	}
}

func TestFlappingHealthKeepsServing(t *testing.T) {
	s, base := startServer(t, fastConfig())
	s.setFaults(Faults{FlapPeriod: time.Hour}, time.Now().Add(-time.Hour)) // in the second, "down" hour
	if r := get(t, base+"/health"); r.status != http.StatusServiceUnavailable {
		t.Errorf("/health while flapped down: %d, want 503", r.status)
	}
	if r := mustPost(t, base+"/v1/chat/completions", chatBody); r.status != http.StatusOK {
		t.Errorf("completion while flapped down: %d, want 200 (only readiness flaps)", r.status)
	}
	s.SetFaults(Faults{FlapPeriod: 2 * time.Hour}) // a new period restarts up
	if r := get(t, base+"/health"); r.status != http.StatusOK {
		t.Errorf("/health in the first period: %d, want 200", r.status)
	}
}

func TestParseFaults(t *testing.T) {
	base := Faults{ErrorRate: 0.1, SlowDelay: time.Second}
	tests := map[string]struct {
		content string
		want    Faults
		wantErr string
	}{
		"empty keeps the base": {content: "", want: base},
		"flags on lines with a comment": {content: "# slow replica\n--slow-rate 0.5 --slow-delay=2s\n--flap-period 3s\n",
			want: Faults{ErrorRate: 0.1, SlowRate: 0.5, SlowDelay: 2 * time.Second, FlapPeriod: 3 * time.Second}},
		"overrides the base":  {content: "--error-rate 0", want: Faults{SlowDelay: time.Second}},
		"unknown flag":        {content: "--max-num-seqs 3", wantErr: "unknown flag"},
		"not a flag":          {content: "error-rate 0.5", wantErr: "unexpected arguments"},
		"out of range":        {content: "--error-rate 0.8 --hang-rate 0.5", wantErr: "--hang-rate=0.5"},
		"rates sum above one": {content: "--error-rate 0.5 --slow-rate 0.6", wantErr: "--slow-rate=0.6"},
		"bad duration":        {content: "--flap-period soon", wantErr: "flap-period"},
		"negative flap":       {content: "--flap-period -1s", wantErr: "--flap-period=-1s"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseFaults([]byte(tc.content), base)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseFaults(%q) error = %v, want one mentioning %q", tc.content, err, tc.wantErr)
				}
				if got != base {
					t.Errorf("a bad file changed the faults to %+v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("parseFaults(%q) (-want +got):\n%s", tc.content, diff)
			}
		})
	}
}

func TestFaultsWatcher(t *testing.T) {
	cfg := fastConfig()
	cfg.ErrorRate = 0.2
	s := NewServer(cfg)
	path := filepath.Join(t.TempDir(), "faults")
	var reports []string
	w := &faultsWatcher{s: s, path: path, base: cfg.faults(), report: func(format string, args ...any) {
		reports = append(reports, fmt.Sprintf(format, args...))
	}}
	now := time.Now()
	step := func(content string) Faults {
		t.Helper()
		switch content {
		case "<removed>":
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		default:
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		now = now.Add(faultsFilePoll)
		w.check(now)
		return s.Faults()
	}
	w.check(now)
	if got := s.Faults(); got != cfg.faults() || len(reports) != 0 {
		t.Fatalf("no file: faults %+v, reports %q; want the command line's and no report", got, reports)
	}
	if got := step("--error-rate 1"); got.ErrorRate != 1 {
		t.Errorf("after writing --error-rate 1: %+v", got)
	}
	if got := step("--error-rate 2"); got.ErrorRate != 1 {
		t.Errorf("an invalid file changed the faults: %+v", got)
	}
	if got := step("--hang-rate 0.5"); got.HangRate != 0.5 || got.ErrorRate != 0.2 {
		t.Errorf("after --hang-rate 0.5: %+v, want the command line's error rate kept", got)
	}
	if got := step("<removed>"); got != cfg.faults() {
		t.Errorf("after removing the file: %+v, want the command line's %+v", got, cfg.faults())
	}
	if len(reports) != 4 || !strings.Contains(reports[1], "ignored") || !strings.Contains(reports[3], "removed") {
		t.Errorf("reports = %q; want applied, ignored, applied, removed", reports)
	}
}

// TestServeFollowsFaultsFile runs a replica with a faults file through Serve: a fault in the
// file applies from the first request, and removing the file ends it.
func TestServeFollowsFaultsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "faults")
	if err := os.WriteFile(path, []byte("--error-rate 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig()
	cfg.FaultsFile = path
	s := NewServer(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve = %v", err)
		}
	}()
	base := "http://" + ln.Addr().String()
	if r := mustPost(t, base+"/v1/chat/completions", chatBody); r.status != http.StatusInternalServerError {
		t.Fatalf("first request with --error-rate 1 in the faults file: %d, want 500", r.status)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "faults file removal applied", func() bool { return s.Faults().ErrorRate == 0 })
	if r := mustPost(t, base+"/v1/chat/completions", chatBody); r.status != http.StatusOK {
		t.Errorf("after removing the faults file: %d, want 200", r.status)
	}
}
