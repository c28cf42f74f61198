package controller

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
)

// A restarted controller waits for a restored service's endpoint while a stopping predecessor
// still holds it, and binds it once released; a port that stays taken fails after the wait.
func TestListenRestoredWaitsForThePort(t *testing.T) {
	holder, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := holder.Addr().String()
	time.AfterFunc(300*time.Millisecond, func() { holder.Close() })
	ln, err := listenRestored(context.Background(), zap.NewNop(), addr, 10*time.Second)
	if err != nil {
		t.Fatalf("after the holder let go: %v", err)
	}
	defer ln.Close()

	start := time.Now()
	if _, err := listenRestored(context.Background(), zap.NewNop(), addr, 400*time.Millisecond); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("a port that stays taken: %v, want EADDRINUSE", err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("gave up after %v, want about the 400ms asked for", waited)
	}
}
