package proxy

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// TestDeadlineConnMeasuresIdleness checks the coarse idle deadline: steady traffic longer than
// the idle timeout keeps the connection, silence ends it, and the owner's own deadline wins
// until the next read.
func TestDeadlineConnMeasuresIdleness(t *testing.T) {
	const idle = 300 * time.Millisecond
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	c := &deadlineConn{Conn: a, readIdle: idle, writeIdle: idle}

	// A peer that writes a byte every 20 ms for 3 idle periods.
	go func() {
		for range 45 {
			if _, err := b.Write([]byte{'x'}); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	buf := make([]byte, 1)
	for i := range 45 {
		if _, err := c.Read(buf); err != nil {
			t.Fatalf("read %d of a steady stream: %v", i, err)
		}
	}

	// Then silence: the read must end with a timeout, not hang.
	start := time.Now()
	_, err := c.Read(buf)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after silence: %v, want a deadline error", err)
	}
	if waited := time.Since(start); waited < idle-idle/deadlineSlackDiv {
		t.Errorf("timed out after %v of silence, want about %v", waited, idle)
	}

	// The owner's deadline replaces ours; the next read sets ours again.
	if err := c.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if c.readUntil.Load() != 0 {
		t.Error("the owner's deadline left the wrapper believing its own was in force")
	}
	go func() { _, _ = b.Write([]byte{'y'}) }()
	if _, err := c.Read(buf); err != nil || buf[0] != 'y' {
		t.Fatalf("read after the owner's past deadline: %q %v; the wrapper should have set its own", buf, err)
	}
}

// BenchmarkIdleDeadline compares moving a TCP connection's write deadline on every call with
// deadlineConn's coarse extension, without the write itself (whose syscall would drown both).
func BenchmarkIdleDeadline(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			_, _ = c.Read(make([]byte, 1))
		}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	b.Run("every_call", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := raw.SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("coarse", func(b *testing.B) {
		c := &deadlineConn{Conn: raw, writeIdle: time.Minute}
		b.ReportAllocs()
		for b.Loop() {
			if err := c.extend(&c.writeUntil, c.writeIdle, raw.SetWriteDeadline); err != nil {
				b.Fatal(err)
			}
		}
	})
}
