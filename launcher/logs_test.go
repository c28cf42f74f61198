package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// streamer answers StreamLogs from a script: each call takes the next step.
type streamer struct {
	steps []func(w io.Writer) error
	calls int
}

func (s *streamer) StreamLogs(_ context.Context, _ string, _ LogOptions, w io.Writer) error {
	step := s.steps[min(s.calls, len(s.steps)-1)]
	s.calls++
	return step(w)
}

var errPending = errors.New("container is waiting to start")

// TestStreamLogsRetrying: following a log that is not there yet asks again; once output was
// written an error is final (asking again would repeat the output); a gone instance is
// ErrNotFound at any point; without follow nothing is retried.
func TestStreamLogsRetrying(t *testing.T) {
	pending := func(io.Writer) error { return errPending }
	cut := func(w io.Writer) error { _, _ = io.WriteString(w, "line\n"); return errors.New("stream cut") }
	gone := func(io.Writer) error { return fmt.Errorf("pod gone: %w", ErrNotFound) }
	done := func(w io.Writer) error { _, _ = io.WriteString(w, "all\n"); return nil }
	for _, tc := range []struct {
		name      string
		steps     []func(io.Writer) error
		follow    bool
		wantErr   string
		wantCalls int
		wantOut   string
	}{
		{"pending then output", []func(io.Writer) error{pending, pending, done}, true, "", 3, "all\n"},
		{"cut after output", []func(io.Writer) error{pending, cut, done}, true, "stream cut", 2, "line\n"},
		{"gone", []func(io.Writer) error{pending, gone}, true, "not found", 2, ""},
		{"no follow", []func(io.Writer) error{pending, done}, false, errPending.Error(), 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &streamer{steps: tc.steps}
			var out strings.Builder
			err := StreamLogsRetrying(context.Background(), s, "i-1", LogOptions{Tail: -1, Follow: tc.follow}, &out, time.Millisecond)
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("error %v, want %q", err, tc.wantErr)
			}
			if s.calls != tc.wantCalls || out.String() != tc.wantOut {
				t.Errorf("%d calls, output %q; want %d, %q", s.calls, out.String(), tc.wantCalls, tc.wantOut)
			}
		})
	}

	// A follower that leaves while the log is still not there gets nil, at once.
	ctx, cancel := context.WithCancel(context.Background())
	s := &streamer{steps: []func(io.Writer) error{func(io.Writer) error { cancel(); return errPending }}}
	if err := StreamLogsRetrying(ctx, s, "i-1", LogOptions{Follow: true}, io.Discard, time.Hour); err != nil {
		t.Errorf("follower left: %v, want nil", err)
	}
}
