package api

import (
	"context"
	"errors"
	"net"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/internal/home"
)

// TestClientFor: the socket in the home wins when there is one this process may use; without
// it the TCP address; with neither, ErrUnreachable.
func TestClientFor(t *testing.T) {
	const token = "t0ken-for-the-dial-test"
	b := &countingBackend{}
	h := home.Home{Dir: t.TempDir()}
	tcp := httptest.NewServer(NewHandler(b, Tokens{Full: token}, nil))
	defer tcp.Close()
	info := home.Info{Addr: tcp.Listener.Addr().String()}

	c, err := ClientFor(h, info, token)
	if err != nil || c.Where != tcp.URL {
		t.Fatalf("no socket: client for %q, %v; want %s", whereOf(c), err, tcp.URL)
	}
	if _, err := c.ControllerStatus(context.Background()); err != nil {
		t.Fatal(err)
	}

	ln, err := net.Listen("unix", h.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(NewHandler(b, Tokens{Full: token}, nil), 0, nil)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	c, err = ClientFor(h, info, token)
	if err != nil || !strings.HasPrefix(c.Where, "unix:") {
		t.Fatalf("with the socket: client for %q, %v; want the socket", whereOf(c), err)
	}
	if _, err := c.ControllerStatus(context.Background()); err != nil {
		t.Fatal(err)
	}

	if _, err := ClientFor(home.Home{Dir: t.TempDir()}, home.Info{}, token); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("neither: %v, want ErrUnreachable", err)
	}
}

func whereOf(c *Client) string {
	if c == nil {
		return "<nil>"
	}
	return c.Where
}
