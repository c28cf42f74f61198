package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/ferryserve/ferry/internal/rpc"
)

// ReplicaLogStreamer is an optional Backend capability: a replica's output on any infra (a
// local file, a pod's log, a VM's console), with opts.Follow until the replica ends or ctx
// ends. A backend without it serves only replicas whose log is a local file (ReplicaLogPath).
type ReplicaLogStreamer interface {
	StreamReplicaLog(ctx context.Context, service string, id int, opts LogOptions, w io.Writer) error
}

func (s *server) replicaLogs(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.Atoi(r.PathValue("id"))
	if err != nil {
		rpc.WriteErrorCode(w, http.StatusBadRequest, "invalid_request", "replica id must be an integer")
		return
	}
	opts, bad := logOptions(r)
	if bad != "" {
		rpc.WriteErrorCode(w, http.StatusBadRequest, "invalid_request", bad)
		return
	}
	ls, ok := s.b.(ReplicaLogStreamer)
	if !ok {
		path, err := s.b.ReplicaLogPath(r.PathValue("name"), id)
		if err != nil {
			s.fail(w, err)
			return
		}
		s.streamFile(w, r, path, opts)
		return
	}
	out := &headerWriter{w: w}
	out.f, _ = w.(http.Flusher)
	// An error before any output is answered as one; after, the stream just ends.
	if err := ls.StreamReplicaLog(r.Context(), r.PathValue("name"), id, opts, out); err != nil && !out.started {
		s.fail(w, err)
		return
	}
	if !out.started {
		out.start() // an empty log is still a 200
	}
}

// logOptions reads tail and follow; bad says what is wrong with them.
func logOptions(r *http.Request) (LogOptions, string) {
	opts := LogOptions{Tail: -1}
	if v := r.URL.Query().Get("tail"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return opts, "tail must be a non-negative integer"
		}
		opts.Tail = n
	}
	opts.Follow = r.URL.Query().Get("follow") == "1" || r.URL.Query().Get("follow") == "true"
	return opts, ""
}

// headerWriter sends the 200 and text headers on the first write, so that an error before any
// output can still be answered as an error; it flushes after every write.
type headerWriter struct {
	w       http.ResponseWriter
	f       http.Flusher
	started bool
}

func (h *headerWriter) start() {
	h.w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	h.w.WriteHeader(http.StatusOK)
	h.started = true
	if h.f != nil {
		h.f.Flush()
	}
}

// Flush commits the response: a follow that has nothing to write yet still answers 200, so
// the client knows it is following.
func (h *headerWriter) Flush() {
	if !h.started {
		h.start()
	} else if h.f != nil {
		h.f.Flush()
	}
}

func (h *headerWriter) Write(p []byte) (int, error) {
	if !h.started {
		h.start()
	}
	n, err := h.w.Write(p)
	if h.f != nil {
		h.f.Flush()
	}
	return n, err
}

func (s *server) controllerLogs(w http.ResponseWriter, r *http.Request) {
	opts, bad := logOptions(r)
	if bad != "" {
		rpc.WriteErrorCode(w, http.StatusBadRequest, "invalid_request", bad)
		return
	}
	path := s.b.ControllerLogPath()
	if path == "" {
		s.fail(w, fmt.Errorf("controller logs to its terminal, not a file: %w", ErrNotFound))
		return
	}
	s.streamFile(w, r, path, opts)
}

// streamFile answers CopyLogFile of path until the client goes away.
func (s *server) streamFile(w http.ResponseWriter, r *http.Request, path string, opts LogOptions) {
	out := &headerWriter{w: w}
	out.f, _ = w.(http.Flusher)
	if err := CopyLogFile(r.Context(), path, opts, out); err != nil && !out.started {
		s.fail(w, err)
		return
	}
	if !out.started {
		out.start()
	}
}

// logPoll paces a follow of a local file: polling every 250 ms is simple and cheap, and
// inotify would save little here.
const logPoll = 250 * time.Millisecond

// CopyLogFile writes the last opts.Tail lines of path (all when negative) to w, then with
// opts.Follow what is appended, until ctx ends; what was appended by then is written too. A
// missing file is ErrNotFound. A w with a Flush method is flushed once the follow starts. A
// file renamed meanwhile (local keeps a terminated replica's
// log under another name) is still followed through its open descriptor.
func CopyLogFile(ctx context.Context, path string, opts LogOptions, w io.Writer) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("open log: %w", ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	defer f.Close()
	offset, err := tailOffset(f, opts.Tail)
	if err != nil {
		return err
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return err
	}
	if _, err := io.Copy(w, f); err != nil || !opts.Follow {
		return err
	}
	if fl, ok := w.(interface{ Flush() }); ok {
		fl.Flush()
	}
	tick := time.NewTicker(logPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			_, err := io.Copy(w, f)
			return err
		case <-tick.C:
			if _, err := io.Copy(w, f); err != nil {
				return err
			}
		}
	}
}

// tailOffset returns where the last n lines of f start (0 for n < 0 or a short file).
func tailOffset(f *os.File, n int) (int64, error) {
	if n < 0 {
		return 0, nil
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size := fi.Size()
	if n == 0 {
		return size, nil
	}
	// Read backwards in blocks, counting newlines; a trailing newline ends the last line.
	const block = 64 << 10
	buf := make([]byte, block)
	lines := 0
	pos := size
	for pos > 0 {
		start := max(pos-block, 0)
		chunk := buf[:pos-start]
		if _, err := f.ReadAt(chunk, start); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		for i := len(chunk) - 1; i >= 0; i-- {
			if chunk[i] != '\n' || start+int64(i) == size-1 {
				continue
			}
			lines++
			if lines == n {
				return start + int64(i) + 1, nil
			}
		}
		pos = start
	}
	return 0, nil
}
