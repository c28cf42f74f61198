package autoscaler

import (
	"context"
	"runtime/debug"
	"time"

	"go.uber.org/zap"
)

// SamplesPerDecision is how many times per decision interval a Loop samples the service's
// concurrency: one sample a second would read a burst that came and went between two decisions
// as nothing, so each decision sees the interval's mean (Knative's queue-proxy averages per
// second the same way).
const SamplesPerDecision = 10

// LoadSource is what a Loop reads of the data plane: the proxies in front of one service.
type LoadSource interface {
	// Arrivals counts the requests that arrived since the source began, held ones too; it
	// never goes down.
	Arrivals() uint64
	// InFlight is the requests being served plus the requests held for a replica or a slot,
	// now.
	InFlight() float64
	// Engines are the last scraped metrics of the replicas the proxy routes to, one per
	// replica; empty when none was scraped.
	Engines() []EngineLoad
}

// Fleet is what a Loop reads and sets of the service's replicas.
type Fleet interface {
	// Replicas lists every replica the service has (Sample.Replicas).
	Replicas() []Replica
	// Target is the replica count asked for now, and whether anyone decided it (a restarted
	// controller that saved none does not know; the loop then resumes from the live replicas).
	Target() (n int, known bool)
	// SetTarget applies a decision that changes the target.
	SetTarget(d Decision)
}

// Ticker is the part of time.Ticker a Loop uses; tests pass one they drive by hand.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// LoopConfig configures a Loop.
type LoopConfig struct {
	Spec  Spec
	Load  LoadSource
	Fleet Fleet
	// Logger gets one line per change of target and any recovered panic.
	Logger *zap.Logger
	// NewTicker makes the sampling ticker; nil uses time.NewTicker. Each tick's time is the
	// clock the decisions run on.
	NewTicker func(d time.Duration) Ticker
	// Now is the clock of decisions that a Poke starts; nil is time.Now.
	Now func() time.Time
}

// Loop is one service's scale loop, after Knative's scalerRunner: it samples the load
// SamplesPerDecision times per decision interval, decides once per interval, and at once when
// poked (a request waits at zero), and hands a changed target to the fleet. It keeps its Scaler
// across Start calls, so a loop started again resumes what it learned.
type Loop struct {
	cfg  LoopConfig
	log  *zap.Logger
	poke chan struct{}

	// Owned by the goroutine running Start.
	scaler Scaler
	// lastArrivals is the source's count at the previous decision (or at Start).
	lastArrivals uint64
	inflightSum  float64
	samples      int
}

// NewLoop returns a Loop that does nothing until Start.
func NewLoop(cfg LoopConfig) *Loop {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.NewTicker == nil {
		cfg.NewTicker = newTimeTicker
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Spec = cfg.Spec.WithDefaults()
	return &Loop{cfg: cfg, log: cfg.Logger, poke: make(chan struct{}, 1)}
}

// Poke asks for a decision now rather than at the next interval: a request is held while the
// service has no replica. It never blocks, so the request path may call it.
func (l *Loop) Poke() {
	select {
	case l.poke <- struct{}{}:
	default:
	}
}

// Start runs the loop until ctx ends. A panic in one decision is logged and the loop goes on:
// a scaler bug must not freeze a service at its current size. Calls must not overlap.
func (l *Loop) Start(ctx context.Context) error {
	tick := l.cfg.NewTicker(l.cfg.Spec.DecisionInterval / SamplesPerDecision)
	defer tick.Stop()
	// Requests that arrived before the loop ran (while a previous one was stopped) are not
	// load of its first interval; a request held since then shows in InFlight.
	l.lastArrivals = l.cfg.Load.Arrivals()
	l.inflightSum, l.samples = 0, 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tick.C():
			l.safely("sample", func() { l.sample(now) })
		case <-l.poke:
			l.safely("decide", func() { l.decide(l.cfg.Now()) })
		}
	}
}

// sample adds the current concurrency to the interval's mean, and decides once the interval is
// complete.
func (l *Loop) sample(now time.Time) {
	l.inflightSum += l.cfg.Load.InFlight()
	l.samples++
	if l.samples >= SamplesPerDecision {
		l.decide(now)
	}
}

// decide runs one decision on what the interval showed and applies it.
func (l *Loop) decide(now time.Time) {
	replicas := l.cfg.Fleet.Replicas()
	target, known := l.cfg.Fleet.Target()
	if l.scaler == nil {
		// A restarted controller resumes from the target it saved, else from the replicas it
		// found, so a restart neither drops a loaded service to its minimum nor keeps it above
		// what it had (mid-rollout, old and new replicas together are more than the target).
		if !known {
			target = max(liveCount(replicas), target)
		}
		l.scaler = Resume(l.cfg.Spec, target)
	}
	arrivals := l.cfg.Load.Arrivals()
	s := Sample{InFlight: l.cfg.Load.InFlight(), Engines: l.cfg.Load.Engines(), Replicas: replicas, Target: target}
	if arrivals >= l.lastArrivals {
		s.Arrivals = int(arrivals - l.lastArrivals)
	}
	l.lastArrivals = arrivals
	if l.samples > 0 {
		s.InFlightMean = l.inflightSum / float64(l.samples)
	}
	l.inflightSum, l.samples = 0, 0

	obs, st := Observe(l.cfg.Spec, s)
	d := l.scaler.Decide(now, obs, st)
	if d.Target == target {
		return
	}
	l.log.Info("scaling", zap.Int("from", target), zap.Int("to", d.Target), zap.Bool("panic", d.Panic),
		zap.String("reason", d.Reason), zap.Int("ready", st.Ready))
	l.cfg.Fleet.SetTarget(d)
}

// safely runs one step of the loop, turning a panic into a log line.
func (l *Loop) safely(what string, step func()) {
	defer func() {
		if p := recover(); p != nil {
			l.log.Error("recovered panic in the scale loop", zap.String("in", what), zap.Any("panic", p),
				zap.ByteString("stack", debug.Stack()))
		}
	}()
	step()
}

// timeTicker adapts time.Ticker to Ticker.
type timeTicker struct{ *time.Ticker }

func newTimeTicker(d time.Duration) Ticker { return timeTicker{time.NewTicker(d)} }

func (t timeTicker) C() <-chan time.Time { return t.Ticker.C }
