package sim

import (
	"bufio"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
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

// traceTimeLayout is the trace's TIMESTAMP format: up to seven fractional digits, no zone.
const traceTimeLayout = "2006-01-02 15:04:05.9999999"

// Bounds on token counts: the conversation trace's largest prompt is 14,050 tokens and its
// longest output 1,000; a value far beyond is a corrupt line, not a request to replay.
const (
	maxTraceContextTokens   = 1_000_000
	maxTraceGeneratedTokens = 100_000
)

// LoadTrace reads a TIMESTAMP,ContextTokens,GeneratedTokens CSV (the Azure LLM inference
// trace's shape, header required) in file order, which must be arrival order.
func LoadTrace(path string) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("request trace: %w", err)
	}
	defer f.Close()
	recs, err := ParseTrace(bufio.NewReader(f))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return NewTrace(path, recs), nil
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

// ParseTrace parses the CSV and names the line of the first bad record.
func ParseTrace(r io.Reader) ([]TraceRecord, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = 3
	cr.ReuseRecord = true
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, errors.New("empty file: want a TIMESTAMP,ContextTokens,GeneratedTokens header")
	}
	if err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	want := "TIMESTAMP,ContextTokens,GeneratedTokens"
	if got := strings.TrimPrefix(strings.Join(header, ","), "\ufeff"); got != want {
		return nil, fmt.Errorf("line 1: header %q, want %q", got, want)
	}
	var (
		out   []TraceRecord
		first time.Time
	)
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// csv.ParseError already says "record on line N".
			return nil, err
		}
		line, _ := cr.FieldPos(0)
		ts, err := time.Parse(traceTimeLayout, strings.TrimSpace(rec[0]))
		if err != nil {
			return nil, fmt.Errorf("line %d: TIMESTAMP %q: want %s", line, rec[0], traceTimeLayout)
		}
		ctx, err1 := strconv.Atoi(strings.TrimSpace(rec[1]))
		gen, err2 := strconv.Atoi(strings.TrimSpace(rec[2]))
		if err1 != nil || err2 != nil || ctx < 1 || ctx > maxTraceContextTokens || gen < 1 || gen > maxTraceGeneratedTokens {
			return nil, fmt.Errorf("line %d: tokens %q,%q: want integers in 1..%d and 1..%d",
				line, rec[1], rec[2], maxTraceContextTokens, maxTraceGeneratedTokens)
		}
		if len(out) == 0 {
			first = ts
		}
		at := ts.Sub(first).Seconds()
		if len(out) > 0 && at < out[len(out)-1].At {
			return nil, fmt.Errorf("line %d: %s is earlier than the previous record (want arrival order)", line, rec[0])
		}
		out = append(out, TraceRecord{At: at, ContextTokens: ctx, GeneratedTokens: gen})
	}
	if len(out) == 0 {
		return nil, errors.New("no records after the header")
	}
	return out, nil
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
