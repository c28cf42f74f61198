package main

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestIdleClientCannotStarveOthers: `ferry proxy --replica` at a limit of 256 file descriptors
// (so 128 client connections by default), one client address opens 300 connections and sends
// nothing. With the default per-address cap it holds at most a quarter of the slots, and a
// keyed request from another address is served at once. With the cap off (as it was by
// default) the idle client held every slot and keyed requests got 503 until the idle
// connections timed out, 60 s later.
func TestIdleClientCannotStarveOthers(t *testing.T) {
	const key = "sk-ferry-starve-0123456789"
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(replica.Close)
	addr, logs, _ := startLimitedProxy(t, replica.Listener.Addr().String(), key)
	keyed := func() error { return keyedRequest("http://"+addr, key) }
	if err := pollFor(10*time.Second, keyed); err != nil {
		t.Fatalf("ferry proxy never served: %v\n%s", err, lastLines(logs.String(), 8))
	}

	// The idle client, on a loopback address of its own; the proxy answers its connections
	// beyond the cap 429 and closes them, so it keeps the ones that are still open.
	idle := openIdleFrom(t, "127.0.0.2", addr, 300)
	held := countOpen(idle, time.Now().Add(time.Second))
	if held == 0 || held > 128/4 {
		t.Errorf("the idle client holds %d connections, want 1 to %d (a quarter of 128)\n%s", held, 128/4, logs.String())
	}
	for i := range 5 {
		if err := keyedRequest("http://"+addr, key); err != nil {
			t.Fatalf("keyed request %d from another address while one client idles on %d connections: %v\n%s",
				i, held, err, lastLines(logs.String(), 8))
		}
	}
}

// openIdleFrom opens n connections from the loopback address local to addr, which send
// nothing.
func openIdleFrom(t *testing.T, local, addr string, n int) []net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	conns := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial from %s: %v", local, err)
		}
		conns = append(conns, c)
	}
	return conns
}

// countOpen counts the connections the proxy keeps open until deadline: a refused one reads
// its 429 and then EOF, an admitted idle one reads nothing. They are read at once, each until
// EOF or the deadline.
func countOpen(conns []net.Conn, deadline time.Time) int {
	open := make(chan bool, len(conns))
	for _, c := range conns {
		go func() {
			_ = c.SetReadDeadline(deadline)
			_, err := io.ReadAll(c)
			var ne net.Error
			open <- errors.As(err, &ne) && ne.Timeout()
		}()
	}
	n := 0
	for range conns {
		if <-open {
			n++
		}
	}
	return n
}
