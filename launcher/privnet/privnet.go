// Package privnet is Ferry's private network on one host: a network namespace that only Ferry's
// own processes can make sockets in, where local replicas listen on their serving ports.
//
// A local replica used to listen on loopback with no credential, so every user of the host could
// send it requests past the service's API keys. Now its serving socket lives in a namespace of
// its own: a helper process (the ferry binary re-executed as HelperCommand in a new user and
// network namespace, with lo up) makes sockets there on request and passes them back over a Unix
// socket in FERRY_HOME (0700), as SCM_RIGHTS. A socket keeps the namespace it was made in, so
// whoever holds one can use it from anywhere; nobody else can reach an address there. The bind
// supervisor (launcher/local) puts such a socket in place of the replica's own for the bind of
// its serving port, and Ferry's dialers (the proxy, the readiness prober) connect with one.
//
// Replicas in the private network get addresses in Range (127.255.0.0/16), which nothing else
// uses: an address there says by itself that it is dialled through the helper, so an attached
// proxy that shares FERRY_HOME needs no list of which replica is where, and a dial there never
// falls back to the host's loopback, where another user could be listening in the replica's
// place.
package privnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// HelperCommand is the hidden ferry subcommand that runs Serve; the ferry binary's main must
// dispatch it.
const HelperCommand = "local-netns"

// SocketName is the helper's socket, in the local provider's directory ($FERRY_HOME/local).
const SocketName = "netns.sock"

// rangePrefix is the text form's prefix of every address in Range; Private checks it without
// parsing, as it runs on each dial.
const rangePrefix = "127.255."

// Range holds the addresses of replicas in the private network. randomLoopback (launcher/local)
// hands out 127.1–127.254 only, so no replica on the host's loopback is ever in it.
var Range = netip.MustParsePrefix("127.255.0.0/16")

// ErrUnreachable wraps every failure to get a socket in the private network: the helper is not
// running, or this process may not use its socket (another user, another FERRY_HOME).
var ErrUnreachable = errors.New("ferry's private network on this host is unreachable")

// Private reports whether addr (host:port) is an address in the private network, which only a
// socket from the helper reaches.
func Private(addr string) bool {
	return strings.HasPrefix(addr, rangePrefix)
}

// OpenToLocalUsers reports whether addr (host:port) is a replica address that every user of
// this host can connect to: loopback outside Range, where a local replica listens when the
// private network is unavailable (or for a multi-node replica's nodes).
func OpenToLocalUsers(addr string) bool {
	ap, err := netip.ParseAddrPort(addr)
	return err == nil && ap.Addr().Unmap().IsLoopback() && !Range.Contains(ap.Addr().Unmap())
}

var (
	defaultMu     sync.Mutex
	defaultClient *Client
)

// SetDefault makes c the client that Dial uses: the local provider sets its own, so that the
// controller's proxy and prober share the socket of the FERRY_HOME whose replicas they dial.
func SetDefault(c *Client) {
	defaultMu.Lock()
	defer defaultMu.Unlock()
	defaultClient = c
}

// Default is the client Dial uses: the one SetDefault set, else one for
// $FERRY_HOME/local/netns.sock (an attached proxy beside the controller).
func Default() (*Client, error) {
	defaultMu.Lock()
	defer defaultMu.Unlock()
	if defaultClient == nil {
		dir, err := ferryHome()
		if err != nil {
			return nil, err
		}
		defaultClient = NewClient(filepath.Join(dir, "local", SocketName))
	}
	return defaultClient, nil
}

// ferryHome is $FERRY_HOME, or ~/.ferry: internal/home's rule, which a launcher package may not
// import (docs/ARCHITECTURE.md, "Import rules").
func ferryHome() (string, error) {
	if d := os.Getenv("FERRY_HOME"); d != "" {
		return filepath.Abs(d)
	}
	h, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("find home directory (set FERRY_HOME): %w", err)
	}
	return filepath.Join(h, ".ferry"), nil
}

// Dial connects to addr, an address in Range, through the default client, within timeout.
func Dial(addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return DialContext(ctx, addr)
}

// DialContext is Dial bounded by ctx.
func DialContext(ctx context.Context, addr string) (net.Conn, error) {
	c, err := Default()
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.Join(ErrUnreachable, err)}
	}
	return c.DialContext(ctx, addr)
}
