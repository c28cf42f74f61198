package rpc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"

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
	switch {
	case info.Addr != "" && info.TLS:
		cfg, pin, err := pinnedTLS(h)
		if err != nil {
			return nil, err
		}
		c := NewClient("https://"+info.Addr, token)
		c.HTTP.Transport = sharedTransport("tls:"+info.Addr+"#"+pin, func() *http.Transport {
			return &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true, IdleConnTimeout: IdleTimeout / 2}
		})
		return c, nil
	case info.Addr != "":
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
	tr := sharedTransport("unix:"+path, func() *http.Transport {
		var d net.Dialer
		return &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return d.DialContext(ctx, "unix", path)
			},
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     IdleTimeout / 2,
		}
	})
	// The host in the URL is never dialled; it names the controller in messages.
	return &Client{Base: "http://ferry-controller", Token: token, HTTP: &http.Client{Transport: tr}, Where: "unix:" + path}
}

// transports are shared, per socket and per pinned TLS address, as http.DefaultTransport is for
// plain TCP: a caller that makes a client for every call (a status poll) reuses the idle
// connections of the last one instead of leaving each client's open on the controller.
var transports sync.Map // key → *http.Transport

func sharedTransport(key string, build func() *http.Transport) *http.Transport {
	if t, ok := transports.Load(key); ok {
		return t.(*http.Transport)
	}
	t, _ := transports.LoadOrStore(key, build())
	return t.(*http.Transport)
}

// pinnedTLS is how a client checks the controller's TLS certificate. With the certificate the
// controller published in h (CertPath), the server must present exactly that one, whatever the
// name or address it was reached by and whoever signed it, so a self-signed certificate works
// with no CA to install; without it, the system's roots and the address's name decide, as for
// any HTTPS server. pin names the pinned certificate (its SHA-256), "" for none.
func pinnedTLS(h home.Home) (cfg *tls.Config, pin string, err error) {
	data, err := os.ReadFile(h.CertPath())
	if errors.Is(err, os.ErrNotExist) {
		return &tls.Config{MinVersion: tls.VersionTLS12}, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("controller certificate: %w", err)
	}
	var pinned [][]byte
	for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
		if block.Type == "CERTIFICATE" {
			pinned = append(pinned, block.Bytes)
		}
	}
	if len(pinned) == 0 {
		return nil, "", fmt.Errorf("controller certificate %s holds no certificate", h.CertPath())
	}
	sum := sha256.Sum256(pinned[0])
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// The chain and name checks are replaced by VerifyConnection's comparison with the
		// pinned certificate, which is stricter: only that certificate is accepted.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) > 0 && bytes.Equal(cs.PeerCertificates[0].Raw, pinned[0]) {
				return nil
			}
			return fmt.Errorf("the controller presented a certificate other than the one in %s", h.CertPath())
		},
	}, hex.EncodeToString(sum[:]), nil
}
