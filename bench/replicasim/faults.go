package replicasim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Faults are the failures a replica injects that may change while it runs: a fault-injection
// benchmark turns them on and off on one live replica (through Config.FaultsFile) instead of
// relaunching it, so that each fault is measured on its own against an otherwise steady service.
type Faults struct {
	// ErrorRate is the fraction of completions answered with a 500.
	ErrorRate float64
	// HangRate is the fraction of completions that never answer until the client goes away.
	HangRate float64
	// SlowRate is the fraction of completions whose first token comes SlowDelay late: a replica
	// that is slow but still making progress, which a proxy must not mistake for a dead one.
	SlowRate  float64
	SlowDelay time.Duration
	// FlapPeriod, when positive, makes /health alternate: 200 for a period, then 503 for a
	// period, and so on, counted from when the setting took effect (from the end of the startup
	// delay for the flag). Completions are still served: only readiness flaps, as with a health
	// check that is flaky or a replica that keeps reporting itself overloaded.
	FlapPeriod time.Duration
}

// faults is the part of c that may change at run time.
func (c *Config) faults() Faults {
	return Faults{ErrorRate: c.ErrorRate, HangRate: c.HangRate, SlowRate: c.SlowRate, SlowDelay: c.SlowDelay, FlapPeriod: c.FlapPeriod}
}

// registerFaultFlags binds the run-time fault knobs. A faults file uses the same flag names.
func (c *Config) registerFaultFlags(fs *pflag.FlagSet) {
	fs.Float64Var(&c.ErrorRate, "error-rate", c.ErrorRate, "fraction of completions answered with HTTP 500")
	fs.Float64Var(&c.HangRate, "hang-rate", c.HangRate, "fraction of completions that hang until the client disconnects")
	fs.Float64Var(&c.SlowRate, "slow-rate", c.SlowRate, "fraction of completions whose first token comes --slow-delay late")
	fs.DurationVar(&c.SlowDelay, "slow-delay", c.SlowDelay, "extra time to first token of the --slow-rate completions")
	fs.DurationVar(&c.FlapPeriod, "flap-period", c.FlapPeriod, "make /health alternate between 200 and 503 every period (completions keep working); 0 never")
}

// faultErrors validates the fault knobs, in Validate's format.
func (c *Config) faultErrors() []error {
	var errs []error
	bad := func(flag string, v any, rule string) {
		errs = append(errs, fmt.Errorf("--%s=%v: %s", flag, v, rule))
	}
	for _, r := range []struct {
		flag string
		v    float64
	}{{"error-rate", c.ErrorRate}, {"hang-rate", c.HangRate}, {"slow-rate", c.SlowRate}} {
		if !(r.v >= 0 && r.v <= 1) {
			bad(r.flag, r.v, "must be between 0 and 1")
		}
	}
	if c.ErrorRate+c.HangRate > 1 {
		bad("hang-rate", c.HangRate, fmt.Sprintf("plus --error-rate=%v must not exceed 1", c.ErrorRate))
	} else if c.ErrorRate+c.HangRate+c.SlowRate > 1 {
		bad("slow-rate", c.SlowRate, fmt.Sprintf("plus --error-rate=%v and --hang-rate=%v must not exceed 1", c.ErrorRate, c.HangRate))
	}
	if c.SlowDelay < 0 || c.SlowDelay > time.Hour {
		bad("slow-delay", c.SlowDelay, "must be between 0 and 1h")
	}
	if c.FlapPeriod < 0 {
		bad("flap-period", c.FlapPeriod, "must not be negative")
	}
	return errs
}

// clamped repairs out-of-range values the way NewServer repairs a Config: rates into [0, 1] and
// their sum at most 1 (errors first, then hangs, then slow answers), durations not negative.
func (f Faults) clamped() Faults {
	f.ErrorRate = clamp01(f.ErrorRate)
	f.HangRate = min(clamp01(f.HangRate), 1-f.ErrorRate)
	f.SlowRate = min(clamp01(f.SlowRate), 1-f.ErrorRate-f.HangRate)
	f.SlowDelay = max(f.SlowDelay, 0)
	f.FlapPeriod = max(f.FlapPeriod, 0)
	return f
}

// activeFaults are the faults in force and when they took effect, which flapping counts from.
type activeFaults struct {
	Faults
	since time.Time
}

// SetFaults replaces the injected faults from now on; requests already past their fault draw
// keep what they drew. Flapping restarts from "up" when its period changes.
func (s *Server) SetFaults(f Faults) {
	s.setFaults(f, time.Now())
}

func (s *Server) setFaults(f Faults, now time.Time) {
	f = f.clamped()
	next := &activeFaults{Faults: f, since: now}
	if cur := s.faults.Load(); cur != nil && cur.FlapPeriod == f.FlapPeriod {
		next.since = cur.since // an unrelated change does not restart the flapping
	}
	s.faults.Store(next)
}

// Faults returns the faults in force.
func (s *Server) Faults() Faults { return s.faults.Load().Faults }

// flapDown reports whether flapping has /health answer 503 at now: the odd periods since the
// flapping began.
func (s *Server) flapDown(now time.Time) bool {
	f := s.faults.Load()
	if f.FlapPeriod <= 0 {
		return false
	}
	elapsed := now.Sub(f.since)
	return elapsed >= 0 && (elapsed/f.FlapPeriod)%2 == 1
}

// faultsFilePoll is how often a faults file is re-read: fast enough that a benchmark's fault
// starts within a fraction of the probes and health checks it is meant to trip.
const faultsFilePoll = 100 * time.Millisecond

// parseFaults reads a faults file: fault flags (--error-rate 0.3 --slow-delay 2s ...) separated
// by spaces or newlines; lines starting with # are comments. A flag the file does not name keeps
// its value from base, the command line's.
func parseFaults(content []byte, base Faults) (Faults, error) {
	var args []string
	for _, line := range strings.Split(string(content), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			args = append(args, strings.Fields(line)...)
		}
	}
	c := Config{ErrorRate: base.ErrorRate, HangRate: base.HangRate, SlowRate: base.SlowRate, SlowDelay: base.SlowDelay, FlapPeriod: base.FlapPeriod}
	fs := pflag.NewFlagSet("faults file", pflag.ContinueOnError)
	fs.SetOutput(discard{})
	c.registerFaultFlags(fs)
	if err := fs.Parse(args); err != nil {
		return base, err
	}
	if fs.NArg() > 0 {
		return base, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := errors.Join(c.faultErrors()...); err != nil {
		return base, err
	}
	return c.faults(), nil
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// faultsWatcher applies a faults file to a server: the file's faults while it exists, the
// command line's (base) once it is gone. A file that does not parse leaves the faults as they
// were and is reported once.
type faultsWatcher struct {
	s    *Server
	path string
	base Faults
	// last is the content last seen; nil while the file does not exist.
	last   []byte
	report func(format string, args ...any)
}

// check reads the file once and applies it if it changed.
func (w *faultsWatcher) check(now time.Time) {
	content, err := os.ReadFile(w.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if w.last != nil {
			w.last = nil
			w.s.setFaults(w.base, now)
			w.report("faults file %s removed: back to the command line's faults", w.path)
		}
		return
	case err != nil:
		return // unreadable for a moment (being replaced): try again at the next poll
	}
	if w.last != nil && bytes.Equal(content, w.last) {
		return
	}
	w.last = content
	f, err := parseFaults(content, w.base)
	if err != nil {
		w.report("faults file %s ignored: %v", w.path, err)
		return
	}
	w.s.setFaults(f, now)
	w.report("faults file %s applied: %+v", w.path, f.clamped())
}

// run polls the file until ctx ends.
func (w *faultsWatcher) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			w.check(now)
		}
	}
}
