// Package azuretrace reads the Azure LLM inference traces (Azure/AzurePublicDataset, 2023):
// one request per line, TIMESTAMP,ContextTokens,GeneratedTokens, in arrival order. The routing
// benchmark and the scaling simulator both replay them.
package azuretrace

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

// Record is one request.
type Record struct {
	// At is the arrival time relative to the first record of the file.
	At time.Duration
	// ContextTokens and GeneratedTokens are the prompt and output lengths.
	ContextTokens   int
	GeneratedTokens int
}

// Header is the header line a trace must start with.
const Header = "TIMESTAMP,ContextTokens,GeneratedTokens"

// timeLayout is the TIMESTAMP format: up to seven fractional digits, no zone.
const timeLayout = "2006-01-02 15:04:05.9999999"

// Sanity bounds on token counts: the conversation trace's largest prompt is 14,050 tokens and
// its longest output 1,000; anything far beyond is a corrupt line, not a request to replay.
const (
	MaxContextTokens   = 100_000
	MaxGeneratedTokens = 10_000
)

// Parse reads a trace in file order, which must be arrival order, and names the line of the
// first malformed record.
func Parse(r io.Reader) ([]Record, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = 3
	cr.ReuseRecord = true
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("empty file: want the trace header %s", Header)
	}
	if err != nil {
		return nil, fmt.Errorf("trace header: %w", err)
	}
	if got := strings.TrimPrefix(strings.Join(header, ","), "\ufeff"); got != Header {
		return nil, fmt.Errorf("line 1: header %q, want the trace header %q", got, Header)
	}
	var (
		out   []Record
		first time.Time
	)
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err // csv.ParseError already says "record on line N"
		}
		line, _ := cr.FieldPos(0)
		ts, err := time.Parse(timeLayout, strings.TrimSpace(rec[0]))
		if err != nil {
			return nil, fmt.Errorf("line %d: TIMESTAMP %q: want %s", line, rec[0], timeLayout)
		}
		ctx, err1 := strconv.Atoi(strings.TrimSpace(rec[1]))
		gen, err2 := strconv.Atoi(strings.TrimSpace(rec[2]))
		if err1 != nil || err2 != nil || ctx < 1 || ctx > MaxContextTokens || gen < 1 || gen > MaxGeneratedTokens {
			return nil, fmt.Errorf("line %d: tokens %q,%q: want integers in 1..%d and 1..%d",
				line, rec[1], rec[2], MaxContextTokens, MaxGeneratedTokens)
		}
		if len(out) == 0 {
			first = ts
		}
		at := ts.Sub(first)
		if len(out) > 0 && at < out[len(out)-1].At {
			return nil, fmt.Errorf("line %d: %s is earlier than the previous record (want arrival order)", line, rec[0])
		}
		out = append(out, Record{At: at, ContextTokens: ctx, GeneratedTokens: gen})
	}
	if len(out) == 0 {
		return nil, errors.New("trace has no records after the header")
	}
	return out, nil
}

// Read parses the trace file at path; errors name the file.
func Read(path string) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("request trace: %w", err)
	}
	defer f.Close()
	recs, err := Parse(bufio.NewReader(f))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return recs, nil
}
