package sim

import (
	"io"

	"github.com/ferryserve/ferry/bench/azuretrace"
)

// TraceRecord is one request of an Azure LLM inference trace.
type TraceRecord struct {
	// At is the arrival time in seconds after the trace's first record.
	At float64
	// ContextTokens and GeneratedTokens are the prompt and output lengths.
	ContextTokens   int
	GeneratedTokens int
}

// Trace is a request trace that the simulator loops over its horizon.
type Trace struct {
	// Path is the file it was read from, for the report.
	Path    string
	Records []TraceRecord
	// Period is the length of one pass: the span from the first to the last arrival plus one
	// mean inter-arrival gap, so that looping adds neither a burst nor a pause at the seam.
	Period float64
}

// LoadTrace reads an Azure LLM inference trace (package azuretrace) for replay.
func LoadTrace(path string) (*Trace, error) {
	recs, err := azuretrace.Read(path)
	if err != nil {
		return nil, err
	}
	return NewTrace(path, toSeconds(recs)), nil
}

// NewTrace wraps records (non-empty, in arrival order) with their loop period.
func NewTrace(path string, recs []TraceRecord) *Trace {
	span := recs[len(recs)-1].At - recs[0].At
	gap := 1.0
	if len(recs) > 1 && span > 0 {
		gap = span / float64(len(recs)-1)
	}
	return &Trace{Path: path, Records: recs, Period: span + gap}
}

// ParseTrace parses a trace and names the line of the first bad record.
func ParseTrace(r io.Reader) ([]TraceRecord, error) {
	recs, err := azuretrace.Parse(r)
	if err != nil {
		return nil, err
	}
	return toSeconds(recs), nil
}

// toSeconds converts arrival times to the simulator's float seconds.
func toSeconds(recs []azuretrace.Record) []TraceRecord {
	out := make([]TraceRecord, len(recs))
	for i, r := range recs {
		out[i] = TraceRecord{At: r.At.Seconds(), ContextTokens: r.ContextTokens, GeneratedTokens: r.GeneratedTokens}
	}
	return out
}

// PeakRate is the highest arrival rate over any whole minute of one pass, in requests per
// second, after dividing arrival times by timeScale's inverse (timeScale 2 doubles it).
func (t *Trace) PeakRate(timeScale float64) float64 {
	perMinute := map[int]int{}
	peak := 0
	for _, r := range t.Records {
		m := int(r.At / 60)
		perMinute[m]++
		peak = max(peak, perMinute[m])
	}
	return float64(peak) / 60 * timeScale
}

// MeanRate is the mean arrival rate of one pass, in requests per second, time-scaled.
func (t *Trace) MeanRate(timeScale float64) float64 {
	return float64(len(t.Records)) / t.Period * timeScale
}

// arrivalSource yields requests in arrival order; ok is false when it has no more.
type arrivalSource interface {
	next() (a arrival, ok bool)
}

// arrival is one request to replay: when, and its token counts.
type arrival struct {
	at       float64
	ctx, gen int
}

// loopedTrace replays a trace pass after pass, arrival times divided by scale, until until.
type loopedTrace struct {
	trace *Trace
	scale float64
	until float64
	i     int
	pass  int
}

func newLoopedTrace(t *Trace, scale, until float64) *loopedTrace {
	return &loopedTrace{trace: t, scale: scale, until: until}
}

func (l *loopedTrace) next() (arrival, bool) {
	recs := l.trace.Records
	if l.i == len(recs) {
		l.i, l.pass = 0, l.pass+1
	}
	r := recs[l.i]
	at := (r.At - recs[0].At + float64(l.pass)*l.trace.Period) / l.scale
	if at >= l.until {
		return arrival{}, false
	}
	l.i++
	return arrival{at: at, ctx: r.ContextTokens, gen: r.GeneratedTokens}, true
}
