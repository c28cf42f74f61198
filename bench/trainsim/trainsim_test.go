package trainsim

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the two ranks' writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func runGang(ctx context.Context, t *testing.T, n, steps int, dir string, out *syncBuffer) []error {
	port := freePort(t)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = Run(ctx, Config{NNodes: n, NodeRank: r, MasterAddr: "127.0.0.1", MasterPort: port, Steps: steps,
				StepTime: time.Millisecond, CheckpointDir: dir, CheckpointEvery: 5, RendezvousTimeout: 10 * time.Second, Out: out})
		}()
	}
	wg.Wait()
	return errs
}

func TestGangRunsAndResumes(t *testing.T) {
	dir := t.TempDir()
	var out syncBuffer
	for _, err := range runGang(context.Background(), t, 3, 20, dir, &out) {
		if err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
	}
	if ck := load(dir); ck.Step != 20 {
		t.Errorf("checkpoint at step %d, want 20", ck.Step)
	}
	// A second run of the same job resumes at the end and has nothing left to do.
	out = syncBuffer{}
	for _, err := range runGang(context.Background(), t, 3, 30, dir, &out) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(out.String(), "resuming from checkpoint at step 20") {
		t.Errorf("did not resume:\n%s", out.String())
	}
}

func TestStopCheckpoints(t *testing.T) {
	dir := t.TempDir()
	var out syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	errs := runGang(ctx, t, 2, 1_000_000, dir, &out)
	if !errors.Is(errs[0], context.DeadlineExceeded) {
		t.Fatalf("rank 0: %v", errs[0])
	}
	if ck := load(dir); ck.Step == 0 || !strings.Contains(out.String(), "checkpoint saved") {
		t.Errorf("no checkpoint on stop (step %d):\n%s", ck.Step, out.String())
	}
}
