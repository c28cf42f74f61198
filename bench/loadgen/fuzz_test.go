package loadgen

import (
	"bufio"
	"bytes"
	"errors"
	"testing"
	"time"
)

// FuzzReadEvents checks the SSE reader the load generators and benchmarks trust for their
// counts against a line-by-line reading of the same bytes, with buffers small enough that long
// lines take the overflow path: it must never panic, count every data event, see [DONE] exactly
// when it is there, and keep the last payload. Seeds: testdata/fuzz/FuzzReadEvents.
func FuzzReadEvents(f *testing.F) {
	f.Add([]byte("data: {\"a\":1}\n\ndata: [DONE]\n\n"), uint8(0))
	f.Add([]byte(": comment\nevent: x\nid: 1\ndata:[DONE]"), uint8(3))
	f.Fuzz(func(t *testing.T, stream []byte, size uint8) {
		bufSize := 16 + int(size)%64 // bufio's minimum is 16
		res, err := ReadEvents(bufio.NewReaderSize(bytes.NewReader(stream), bufSize), time.Now())

		wantEvents, wantDone, wantLast := 0, false, []byte(nil)
		for rest := stream; len(rest) > 0; {
			line := rest
			if i := bytes.IndexByte(rest, '\n'); i >= 0 {
				line = rest[:i+1]
			}
			rest = rest[len(line):]
			if len(line) > bufSize { // read in pieces: only the first is interpreted
				line = line[:bufSize]
			}
			payload, ok := bytes.CutPrefix(line, []byte("data:"))
			if !ok {
				continue
			}
			wantEvents++
			if payload = bytes.TrimSpace(payload); bytes.Equal(payload, []byte("[DONE]")) {
				wantDone = true
			} else {
				wantLast = append(wantLast[:0], payload...)
			}
		}
		if res.Events != wantEvents {
			t.Fatalf("Events = %d, want %d in %q", res.Events, wantEvents, stream)
		}
		if done := err == nil; done != wantDone || err != nil && !errors.Is(err, ErrIncompleteStream) {
			t.Fatalf("err = %v, want [DONE] seen = %v in %q", err, wantDone, stream)
		}
		if !bytes.Equal(res.Last, wantLast) {
			t.Fatalf("Last = %q, want %q", res.Last, wantLast)
		}
	})
}
