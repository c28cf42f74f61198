package childproc

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestStartAndStopGroup(t *testing.T) {
	g, err := NewGroup(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// A shell that starts a child of its own: stopping the group must end both.
	p, err := g.Start(Spec{Name: "sh", Argv: []string{"sh", "-c", "echo started; sleep 30 & wait"}, CPU: -1})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(p.LogTail(100), "started") {
		if time.Now().After(deadline) {
			t.Fatal("child produced no output")
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	g.Close()
	select {
	case <-p.Exited():
	default:
		t.Fatal("Close returned before the child exited")
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("stopping took %v; SIGTERM should end sh at once", took)
	}
	// The whole group goes, the shell's child included (it may linger a moment as a zombie
	// until its new parent reaps it).
	for syscall.Kill(-p.PID, 0) == nil {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("process group %d still exists", p.PID)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := g.Start(Spec{Name: "late", Argv: []string{"true"}, CPU: -1}); err == nil {
		t.Error("Start after Close succeeded")
	}
}

func TestStartErrors(t *testing.T) {
	g, err := NewGroup(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.Start(Spec{Name: "empty", CPU: -1}); err == nil {
		t.Error("empty argv accepted")
	}
	if _, err := g.Start(Spec{Name: "missing", Argv: []string{"/nonexistent/binary"}, CPU: -1}); err == nil {
		t.Error("missing binary accepted")
	}
}

func TestWaitHTTP(t *testing.T) {
	g, err := NewGroup(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ctx := context.Background()

	t.Run("process exits first", func(t *testing.T) {
		p, err := g.Start(Spec{Name: "fail", Argv: []string{"sh", "-c", "echo unknown policy >&2; exit 3"}, CPU: -1})
		if err != nil {
			t.Fatal(err)
		}
		err = WaitHTTP(ctx, p, "http://127.0.0.1:1/health", 10*time.Second)
		if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "unknown policy") {
			t.Errorf("WaitHTTP() = %v, want ErrExited with the log tail", err)
		}
	})

	t.Run("server ready", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {})}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		p, err := g.Start(Spec{Name: "sleeper", Argv: []string{"sleep", "30"}, CPU: -1})
		if err != nil {
			t.Fatal(err)
		}
		if err := WaitHTTP(ctx, p, "http://"+ln.Addr().String()+"/health", 10*time.Second); err != nil {
			t.Errorf("WaitHTTP() = %v", err)
		}
		g.Stop(p)
	})
}
