package main

import (
	"fmt"

	"github.com/ferryserve/ferry/bench/azuretrace"
)

// traceRecord is one request of the Azure LLM inference trace.
type traceRecord = azuretrace.Record

// parseTrace and readTrace read the trace (see package azuretrace).
var (
	parseTrace = azuretrace.Parse
	readTrace  = azuretrace.Read
)

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
