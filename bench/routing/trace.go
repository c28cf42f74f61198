package main

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// traceRecord is one request of the Azure LLM inference trace.
type traceRecord struct {
	// At is the arrival time relative to the first record of the file.
	At time.Duration
	// ContextTokens and GeneratedTokens are the prompt and output lengths.
	ContextTokens   int
	GeneratedTokens int
}

// traceTimeLayout is the trace's TIMESTAMP format: seven fractional digits, no zone.
const traceTimeLayout = "2006-01-02 15:04:05.9999999"

// Sanity bounds on token counts: the trace's largest prompt is 14,050 tokens and its longest
// output 1,000; anything far beyond is a corrupt line, not a request to replay.
const (
	maxContextTokens   = 100_000
	maxGeneratedTokens = 10_000
)

// parseTrace reads TIMESTAMP,ContextTokens,GeneratedTokens CSV (with that header), in the order
// of the file, which is arrival order. It reports the line of the first malformed record.
func parseTrace(r io.Reader) ([]traceRecord, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = 3
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("trace header: %w", err)
	}
	if want := []string{"TIMESTAMP", "ContextTokens", "GeneratedTokens"}; strings.Join(header, ",") != strings.Join(want, ",") {
		return nil, fmt.Errorf("trace header %q: want %q", strings.Join(header, ","), strings.Join(want, ","))
	}
	var (
		out   []traceRecord
		first time.Time
		prev  time.Duration
	)
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("trace: %w", err)
		}
		line, _ := cr.FieldPos(0)
		ts, err := time.Parse(traceTimeLayout, rec[0])
		if err != nil {
			return nil, fmt.Errorf("trace line %d: TIMESTAMP %q: %w", line, rec[0], err)
		}
		ctxTokens, err1 := strconv.Atoi(rec[1])
		genTokens, err2 := strconv.Atoi(rec[2])
		if err1 != nil || err2 != nil || ctxTokens < 1 || ctxTokens > maxContextTokens || genTokens < 1 || genTokens > maxGeneratedTokens {
			return nil, fmt.Errorf("trace line %d: tokens %q,%q: want 1..%d and 1..%d", line, rec[1], rec[2], maxContextTokens, maxGeneratedTokens)
		}
		if len(out) == 0 {
			first = ts
		}
		at := ts.Sub(first)
		if at < prev {
			return nil, fmt.Errorf("trace line %d: %s is earlier than the previous record", line, rec[0])
		}
		prev = at
		out = append(out, traceRecord{At: at, ContextTokens: ctxTokens, GeneratedTokens: genTokens})
	}
	if len(out) == 0 {
		return nil, errors.New("trace has no records")
	}
	return out, nil
}

// readTrace parses the trace file at path.
func readTrace(path string) ([]traceRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	recs, err := parseTrace(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return recs, nil
}

// window returns n records starting at index start, with times rebased to the first of them.
func window(recs []traceRecord, start, n int) ([]traceRecord, error) {
	if start < 0 || n < 1 || start+n > len(recs) {
		return nil, fmt.Errorf("window of %d records from %d: the trace has %d", n, start, len(recs))
	}
	out := make([]traceRecord, n)
	base := recs[start].At
	for i := range out {
		r := recs[start+i]
		r.At -= base
		out[i] = r
	}
	return out, nil
}
