package controller

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/internal/testhttp"
)

// TestListenAPI: the socket is 0600 in the home, a socket file left by a killed controller is
// replaced, no TCP listener opens unless asked for, and a home whose path is too long for a
// socket gets one in a private directory of its own, removed on close.
func TestListenAPI(t *testing.T) {
	t.Run("socket only", func(t *testing.T) {
		h := home.Home{Dir: t.TempDir()}
		stale, err := net.Listen("unix", h.SocketPath())
		if err != nil {
			t.Fatal(err)
		}
		stale.(*net.UnixListener).SetUnlinkOnClose(false)
		stale.Close() // as SIGKILL leaves it: the file without a listener
		l, err := listenAPI(h, "", apiTLS{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.close()
		if l.socketPath != h.SocketPath() || l.tcp != nil {
			t.Fatalf("socket %q, tcp %v; want %q and none", l.socketPath, l.tcp, h.SocketPath())
		}
		fi, err := os.Stat(l.socketPath)
		if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
			t.Fatalf("socket %s: %v, %v; want srw-------", l.socketPath, fi.Mode(), err)
		}
	})
	t.Run("tcp when asked", func(t *testing.T) {
		l, err := listenAPI(home.Home{Dir: t.TempDir()}, "127.0.0.1:0", apiTLS{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.close()
		if !strings.HasPrefix(l.tcpAddr(), "127.0.0.1:") {
			t.Fatalf("tcp address %q", l.tcpAddr())
		}
	})
	t.Run("long home path", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
		h := home.Home{Dir: dir}
		if err := h.Ensure(); err != nil {
			t.Fatal(err)
		}
		l, err := listenAPI(h, "", apiTLS{})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.socketPath) > maxSocketPath || !strings.HasPrefix(filepath.Base(filepath.Dir(l.socketPath)), socketDirPrefix) {
			t.Fatalf("socket %q", l.socketPath)
		}
		fi, err := os.Stat(filepath.Dir(l.socketPath))
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("socket directory: %v, %v; want drwx------", fi.Mode(), err)
		}
		// A client that reads controller.json finds it.
		if err := h.WriteInfo(home.Info{PID: 1, Socket: l.socketPath}); err != nil {
			t.Fatal(err)
		}
		b := New(Options{Home: h})
		srv := api.NewServer(api.NewHandler(b, api.Tokens{Full: "tok"}, nil), 0, nil)
		go func() { _ = srv.Serve(l.socket) }()
		defer srv.Close()
		c, err := api.ClientFor(h, home.Info{Socket: l.socketPath}, "tok")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.ControllerStatus(context.Background()); err != nil {
			t.Fatalf("status over the private socket: %v", err)
		}
		l.close()
		if _, err := os.Stat(filepath.Dir(l.socketPath)); !os.IsNotExist(err) {
			t.Fatalf("private socket directory still there after close: %v", err)
		}
	})
}

// TestAPIOffLoopbackNeedsTLS: a TCP address off loopback is refused without TLS (the token
// would cross the network in clear text); with a certificate the API serves HTTPS there, a
// client that reads the home pins the published certificate, and plain HTTP gets no answer.
func TestAPIOffLoopbackNeedsTLS(t *testing.T) {
	h := home.Home{Dir: t.TempDir()}
	if _, err := listenAPI(h, "0.0.0.0:0", apiTLS{}); err == nil || !strings.Contains(err.Error(), "TLS") {
		t.Fatalf("0.0.0.0 without TLS: %v, want a refusal that asks for TLS", err)
	}
	if _, err := os.Stat(h.SocketPath()); !os.IsNotExist(err) {
		t.Fatalf("a refused start left its socket: %v", err)
	}
	certFile, keyFile := testhttp.WriteSelfSigned(t, t.TempDir())
	l, err := listenAPI(h, "0.0.0.0:0", apiTLS{certFile, keyFile})
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	if l.tlsConfig == nil {
		t.Fatal("no TLS on the TCP listener")
	}
	published, err := os.ReadFile(h.CertPath())
	if err != nil || strings.Contains(string(published), "PRIVATE KEY") || !strings.Contains(string(published), "CERTIFICATE") {
		t.Fatalf("published certificate: %v\n%s", err, published)
	}
	b := New(Options{Home: h})
	srv := api.NewServer(api.NewHandler(b, api.Tokens{Full: "tok"}, nil), 0, nil)
	go func() { _ = srv.ServeTLS(l.tcp, l.tlsConfig) }()
	defer srv.Close()
	_, port, _ := net.SplitHostPort(l.tcpAddr())
	info := home.Info{Addr: net.JoinHostPort("127.0.0.1", port), TLS: true}
	// Another machine's view of the home: no socket, the certificate beside controller.json.
	remote := home.Home{Dir: t.TempDir()}
	if err := os.WriteFile(remote.CertPath(), published, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := api.ClientFor(remote, info, "tok")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ControllerStatus(context.Background()); err != nil {
		t.Fatalf("HTTPS with the pinned certificate: %v", err)
	}
	plain := api.NewClient("http://"+info.Addr, "tok")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := plain.ControllerStatus(ctx); err == nil {
		t.Fatal("plain HTTP to the TLS listener was answered")
	}
	// A certificate other than the published one is refused.
	otherCert, _ := testhttp.WriteSelfSigned(t, t.TempDir())
	other, _ := os.ReadFile(otherCert)
	if err := os.WriteFile(remote.CertPath(), other, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = api.ClientFor(remote, info, "tok")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ControllerStatus(context.Background()); err == nil {
		t.Fatal("a client pinned to another certificate reached the controller")
	}
}
