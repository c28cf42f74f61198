package vmnode

import (
	"context"
	"errors"
	"io"
	"strings"
	"time"

	"github.com/ferryserve/ferry/launcher"
)

// PolledLog is an instance's output that its cloud serves only by being read again, never
// pushed: EC2's console output, GCE's serial port. Each cloud keeps what it needs to tell the
// new part of a read from the old (a moving window, a byte offset).
type PolledLog interface {
	// Read returns what the output gained since the previous Read, all of it the first time.
	// io.EOF after the first Read says the output is gone with its instance.
	Read(ctx context.Context) (string, error)
	// Ended reports whether the instance has ended (or is ending): a Read that follows returns
	// the rest of its output.
	Ended(ctx context.Context) (bool, error)
}

// StreamPolledLog serves LogStreamer.StreamLogs from a PolledLog: it writes the last opts.Tail
// lines of the output, then with opts.Follow what the output gains, read again every interval
// until the instance has ended (and its last output is written), its output is gone, or ctx
// ends.
func StreamPolledLog(ctx context.Context, log PolledLog, opts launcher.LogOptions, interval time.Duration, w io.Writer) error {
	output, err := log.Read(ctx)
	if err != nil {
		return err
	}
	opts.NotifyOpened()
	if _, err := io.WriteString(w, tailLines(output, opts.Tail)); err != nil || !opts.Follow {
		return err
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		ended, err := log.Ended(ctx)
		if err != nil {
			return err
		}
		more, err := log.Read(ctx)
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return err
		}
		if _, err := io.WriteString(w, more); err != nil {
			return err
		}
		if ended {
			return nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
		}
	}
}

// tailLines is the last n lines of s (all when n is negative).
func tailLines(s string, n int) string {
	if n < 0 || s == "" {
		return s
	}
	if n == 0 {
		return ""
	}
	end := len(s)
	if strings.HasSuffix(s, "\n") {
		end--
	}
	for i := 0; i < n; i++ {
		j := strings.LastIndexByte(s[:end], '\n')
		if j < 0 {
			return s
		}
		end = j
	}
	return s[end+1:]
}
