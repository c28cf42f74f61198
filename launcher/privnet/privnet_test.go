package privnet_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/ferryserve/ferry/launcher/privnet"
	"github.com/ferryserve/ferry/proxy"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == privnet.HelperCommand {
		os.Exit(privnet.Serve(os.Args[2:])) // the test binary stands in for `ferry local-netns`
	}
	os.Exit(m.Run())
}

// openHelper starts a helper (this test binary) for a fresh directory and returns its client.
func openHelper(tb testing.TB) *privnet.Client {
	tb.Helper()
	self, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "privnet-") // short: a Unix socket path is at most 107 bytes
	if err != nil {
		tb.Fatal(err)
	}
	helperLog = filepath.Join(dir, "netns.log")
	tb.Cleanup(func() {
		os.RemoveAll(dir)
	})
	c, err := privnet.Open(self, filepath.Join(dir, privnet.SocketName), filepath.Join(dir, "netns.log"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// helperLog is the output of the helper openHelper started last, for failures to quote.
var helperLog string

// failWithLog fails tb with err and the helper's output.
func failWithLog(tb testing.TB, err error) {
	tb.Helper()
	log, _ := os.ReadFile(helperLog)
	tb.Fatalf("%v\nthe helper's output:\n%s", err, log)
}

// privateListener listens on addr (port 0 for any) in c's private network.
func privateListener(tb testing.TB, c *privnet.Client, ip [4]byte) net.Listener {
	tb.Helper()
	fd, err := c.Socket(unix.AF_INET)
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: ip}); err != nil {
		tb.Fatal(err)
	}
	if err := unix.Listen(fd, 1024); err != nil {
		tb.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "listener")
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	return ln
}

// acceptAndClose accepts connections on ln and closes each.
func acceptAndClose(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		c.Close()
	}
}

// A listener in the private network is reached through the client and only through it: a
// plain dial of the same address is refused. A dial there through a helper that is gone fails
// with ErrUnreachable and never falls back to the host.
func TestPrivateOnlyThroughHelper(t *testing.T) {
	c := openHelper(t)
	ln := privateListener(t, c, [4]byte{127, 255, 0, 1})
	go acceptAndClose(ln)
	addr := ln.Addr().String()
	if !privnet.Private(addr) {
		t.Fatalf("%s is not private", addr)
	}
	conn, err := c.DialContext(context.Background(), addr)
	if err != nil {
		t.Fatalf("dial %s through the helper: %v", addr, err)
	}
	conn.Close()
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Fatalf("a plain dial of %s connected", addr)
	}
	gone := privnet.NewClient(filepath.Join(t.TempDir(), privnet.SocketName))
	if _, err := gone.DialContext(context.Background(), addr); err == nil || !errors.Is(err, privnet.ErrUnreachable) {
		t.Fatalf("dial through a missing helper: %v, want ErrUnreachable", err)
	}
}

// BenchmarkDial is the cost of a new connection to a replica: plain is net.Dialer on the host's
// loopback, as before; private is a socket from the helper (one round trip on its Unix socket,
// SCM_RIGHTS) connected in the private network. Each iteration dials and closes; the listener
// accepts and closes.
func BenchmarkDial(b *testing.B) {
	c := openHelper(b)
	host, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer host.Close()
	go acceptAndClose(host)
	priv := privateListener(b, c, [4]byte{127, 255, 0, 2})
	go acceptAndClose(priv)
	b.Run("plain", func(b *testing.B) {
		d := net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second}
		b.ReportAllocs()
		for b.Loop() {
			conn, err := d.Dial("tcp", host.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			conn.Close()
		}
	})
	b.Run("private", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			conn, err := c.DialContext(ctx, priv.Addr().String())
			cancel()
			if err != nil {
				failWithLog(b, err)
			}
			conn.Close()
		}
	})
}

var benchBody = []byte(`{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},"finish_reason":"stop"}]}`)

// serveUpstream serves a fixed chat completion on ln.
func serveUpstream(b *testing.B, ln net.Listener) {
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBody(benchBody)
	}}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Shutdown() })
}

// BenchmarkProxiedKeepAlive is a request through Ferry's proxy (real TCP on loopback from the
// client, kept alive) to a replica on the host's loopback (loopback) or in the private network
// (private): once connected, the proxy's connection to the replica is an ordinary TCP socket, so
// the two should match.
func BenchmarkProxiedKeepAlive(b *testing.B) {
	c := openHelper(b)
	privnet.SetDefault(c)
	proxy.SetPrivateDial(privnet.Private, privnet.Dial) // as the ferry binary does
	b.Cleanup(func() { privnet.SetDefault(nil) })
	for _, where := range []string{"loopback", "private"} {
		b.Run(where, func(b *testing.B) {
			var up net.Listener
			if where == "private" {
				up = privateListener(b, c, [4]byte{127, 255, 0, 3})
			} else {
				var err error
				if up, err = net.Listen("tcp4", "127.0.0.1:0"); err != nil {
					b.Fatal(err)
				}
			}
			serveUpstream(b, up)
			svc, err := proxy.NewService(proxy.ServiceConfig{Name: "bench", Logger: zap.NewNop()})
			if err != nil {
				b.Fatal(err)
			}
			svc.SetBackends([]proxy.Backend{{ID: 1, Addr: up.Addr().String(), Version: 1}})
			front, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go func() { _ = svc.Serve(front) }()
			b.Cleanup(func() { _ = svc.Shutdown(context.Background()) })
			client := &fasthttp.HostClient{Addr: front.Addr().String(), MaxConns: 1}
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			req.Header.SetMethod(fasthttp.MethodPost)
			req.SetRequestURI("http://" + front.Addr().String() + "/v1/chat/completions")
			req.Header.SetContentType("application/json")
			req.SetBody([]byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`))
			b.ReportAllocs()
			for b.Loop() {
				if err := client.Do(req, resp); err != nil {
					b.Fatal(err)
				}
				if resp.StatusCode() != fasthttp.StatusOK || len(resp.Body()) != len(benchBody) {
					b.Fatalf("got %d with %d bytes", resp.StatusCode(), len(resp.Body()))
				}
			}
		})
	}
}

// Which replica addresses are dialled through the helper (Private), and which are open to every
// user of the host (OpenToLocalUsers, for serve up's note).
func TestAddressKinds(t *testing.T) {
	for _, tc := range []struct {
		addr              string
		wantPrivate, open bool
	}{
		{"127.255.3.4:8000", true, false},
		{"127.0.0.1:8000", false, true},
		{"127.12.3.4:8000", false, true},
		{"[::1]:8000", false, true},
		{"10.0.0.5:8000", false, false},
		{"replica.example:8000", false, false},
		{"", false, false},
	} {
		if got := privnet.Private(tc.addr); got != tc.wantPrivate {
			t.Errorf("Private(%q) = %v, want %v", tc.addr, got, tc.wantPrivate)
		}
		if got := privnet.OpenToLocalUsers(tc.addr); got != tc.open {
			t.Errorf("OpenToLocalUsers(%q) = %v, want %v", tc.addr, got, tc.open)
		}
	}
}
