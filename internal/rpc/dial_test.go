package rpc

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/internal/home"
)

// TestClientFor: the socket in the home wins when there is one this process may use; without
// it the TCP address; with neither, ErrUnreachable.
func TestClientFor(t *testing.T) {
	const token = "t0ken-for-the-dial-test"
	h := home.Home{Dir: t.TempDir()}
	tcp := httptest.NewServer(NewHandler(Tokens{Full: token}, testRoutes()))
	defer tcp.Close()
	info := home.Info{Addr: tcp.Listener.Addr().String()}

	c, err := ClientFor(h, info, token)
	if err != nil || c.Where != tcp.URL {
		t.Fatalf("no socket: client for %q, %v; want %s", whereOf(c), err, tcp.URL)
	}
	if err := c.Do(context.Background(), http.MethodGet, "/v1/controller", nil, nil); err != nil {
		t.Fatal(err)
	}

	ln, err := net.Listen("unix", h.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(NewHandler(Tokens{Full: token}, testRoutes()), 0, nil)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	c, err = ClientFor(h, info, token)
	if err != nil || !strings.HasPrefix(c.Where, "unix:") {
		t.Fatalf("with the socket: client for %q, %v; want the socket", whereOf(c), err)
	}
	if err := c.Do(context.Background(), http.MethodGet, "/v1/controller", nil, nil); err != nil {
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

// testRoutes answer 200 on the paths these tests call, as the controller's routes would.
func testRoutes() []Route {
	ok := func(w http.ResponseWriter, _ *http.Request) { WriteJSON(w, http.StatusOK, map[string]string{}) }
	decode := func(w http.ResponseWriter, r *http.Request) {
		var v map[string]any
		if err := DecodeBody(w, r, 1<<20, &v); err != nil {
			WriteErrorCode(w, http.StatusBadRequest, "invalid_request", "decode request: "+err.Error())
			return
		}
		ok(w, r)
	}
	return []Route{
		{Method: http.MethodGet, Pattern: "/v1/controller", Handler: ok},
		{Method: http.MethodPost, Pattern: "/v1/services", Handler: decode},
		{Method: http.MethodGet, Pattern: "/v1/services", Handler: ok},
		{Method: http.MethodGet, Pattern: "/v1/services/{name}/replicaset", Handler: ok, Scope: ScopeAttach},
	}
}
