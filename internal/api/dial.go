package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"

	"golang.org/x/sys/unix"

	"github.com/ferryserve/ferry/internal/home"
)

// ErrUnreachable means controller.json names no listener this process can use.
var ErrUnreachable = errors.New("controller unreachable from here")

// ClientFor returns a client that sends token to the controller that h's controller.json
// (info) describes: over its Unix socket when this process may use it (the same machine and
// user, which is how the CLI and local attached proxies talk to it), else over its TCP
// address, which a controller has only when asked for one.
func ClientFor(h home.Home, info home.Info, token string) (*Client, error) {
	// The home's own path first: a home mounted at another path (a container's) still holds
	// the socket where this process sees it.
	for _, path := range []string{h.SocketPath(), info.Socket} {
		if path != "" && usableSocket(path) {
			return NewSocketClient(path, token), nil
		}
	}
	if info.Addr != "" {
		return NewClient("http://"+info.Addr, token), nil
	}
	return nil, fmt.Errorf("%w: the controller of %s listens on no socket this process may use (%s) and on no TCP address", ErrUnreachable, h.Dir, h.SocketPath())
}

// usableSocket reports whether path is a socket this process may connect to.
func usableSocket(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode()&os.ModeSocket != 0 && unix.Access(path, unix.W_OK) == nil
}

// NewSocketClient returns a client for the controller listening on the Unix socket at path.
func NewSocketClient(path, token string) *Client {
	var d net.Dialer
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		},
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     IdleTimeout / 2,
	}
	// The host in the URL is never dialled; it names the controller in messages.
	return &Client{Base: "http://ferry-controller", Token: token, HTTP: &http.Client{Transport: tr}, Where: "unix:" + path}
}
