package launcher

import (
	"context"
	"errors"
	"io"
	"time"
)

// StreamLogsRetrying streams instance id's output to w through s. Following, a log that is not
// there yet (a pod still Pending) is asked for again every retry until output arrives, the
// stream ends or ctx ends; once output was written an error is returned as is, since starting
// over would repeat it. It returns nil when the stream ended, or ctx ended while following,
// and an error wrapping ErrNotFound when the instance is gone.
func StreamLogsRetrying(ctx context.Context, s LogStreamer, id string, opts LogOptions, w io.Writer, retry time.Duration) error {
	cw := &CountingWriter{W: w}
	for {
		err := s.StreamLogs(ctx, id, opts, cw)
		switch {
		case err == nil, opts.Follow && ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrNotFound), !opts.Follow, cw.N > 0:
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(retry):
		}
	}
}

// CountingWriter counts the bytes that reached W.
type CountingWriter struct {
	W io.Writer
	N int64
}

func (c *CountingWriter) Write(p []byte) (int, error) {
	n, err := c.W.Write(p)
	c.N += int64(n)
	return n, err
}
