package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

// lockedBuffer is a bytes.Buffer a follow writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitUntil polls cond for up to a minute: a bound for a stuck test, not a speed assertion.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// CopyLogFile writes the tail, then with follow what is appended, until ctx ends.
func TestCopyLogFileTailAndFollow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.log")
	if err := os.WriteFile(path, []byte("one\ntwo\nthree\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var tail bytes.Buffer
	if err := CopyLogFile(context.Background(), path, LogOptions{Tail: 2}, &tail); err != nil || tail.String() != "two\nthree\n" {
		t.Fatalf("tail 2: %q, %v", tail.String(), err)
	}
	if err := CopyLogFile(context.Background(), filepath.Join(t.TempDir(), "none"), LogOptions{Tail: -1}, io.Discard); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a missing log: %v, want ErrNotFound", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var out lockedBuffer
	done := make(chan error, 1)
	go func() { done <- CopyLogFile(ctx, path, LogOptions{Tail: 1, Follow: true}, &out) }()
	waitUntil(t, "the tail", func() bool { return out.String() == "three\n" })
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(f, "four")
	f.Close()
	waitUntil(t, "the appended line", func() bool { return out.String() == "three\nfour\n" })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("follow ended with %v", err)
	}
}

// streamingBackend serves replica 1's log as a stream and knows no other replica.
type streamingBackend struct {
	countingBackend
}

func (b *streamingBackend) StreamReplicaLog(ctx context.Context, service string, id int, opts LogOptions, w io.Writer) error {
	if service != "svc" || id != 1 {
		return fmt.Errorf("service %q has no replica %d: %w", service, id, ErrNotFound)
	}
	if _, err := fmt.Fprintf(w, "tail=%d\n", opts.Tail); err != nil || !opts.Follow {
		return err
	}
	<-ctx.Done() // a follow lasts until the client leaves
	return nil
}

var _ ReplicaLogStreamer = (*streamingBackend)(nil)

// The replica log route streams through a backend's StreamReplicaLog: options reach it, an
// unknown replica is a 404 whose message the client returns, and a follow writes as it goes.
func TestReplicaLogsThroughStreamer(t *testing.T) {
	b := &streamingBackend{}
	srv := httptest.NewServer(NewHandler(b, Tokens{Full: "tok"}, zaptest.NewLogger(t)))
	t.Cleanup(srv.Close)
	c := NewClient(srv.URL, "tok")

	var out bytes.Buffer
	if err := c.ReplicaLogs(context.Background(), "svc", 1, LogOptions{Tail: 5}, &out); err != nil || out.String() != "tail=5\n" {
		t.Fatalf("logs: %q, %v", out.String(), err)
	}
	err := c.ReplicaLogs(context.Background(), "svc", 9, LogOptions{Tail: -1}, io.Discard)
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "no replica 9") {
		t.Fatalf("logs of an unknown replica: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var followed lockedBuffer
	done := make(chan error, 1)
	go func() { done <- c.ReplicaLogs(ctx, "svc", 1, LogOptions{Tail: -1, Follow: true}, &followed) }()
	waitUntil(t, "the followed line", func() bool { return followed.String() == "tail=-1\n" })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("a follow the client ended: %v", err)
	}
}
