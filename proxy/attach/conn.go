package attach

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"sync"

	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/internal/rpc"
)

// controllerConn finds the controller: through FERRY_HOME (its socket or address in the info
// file), or, with several controllers of which one leads (urls), the next URL in turn; the
// attach token is read from FERRY_HOME (home.AttachToken). forget drops the connection, so the
// next client reads FERRY_HOME again (a restarted controller listens elsewhere) or tries the
// next URL: a follower answers 503 and a dead leader refuses, and the leader is at most
// len(urls)-1 failures away.
type controllerConn struct {
	home home.Home
	urls []string

	mu   sync.Mutex
	next int
	// hint is the leader a follower named, tried once before the next of urls.
	hint string
	c    *rpc.Client
	addr string
}

func (cc *controllerConn) client() (*rpc.Client, string, error) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.c != nil {
		return cc.c, cc.addr, nil
	}
	info, err := cc.info()
	if err != nil {
		return nil, "", err
	}
	token, err := cc.home.AttachToken()
	if err != nil {
		return nil, "", err
	}
	var c *rpc.Client
	if len(cc.urls) > 0 && !info.TLS {
		c = rpc.NewClient("http://"+info.Addr, token) // never the home's socket: it is one controller's
	} else {
		c, err = rpc.ClientFor(cc.home, info, token)
	}
	if err != nil {
		return nil, "", err
	}
	cc.c, cc.addr = c, c.Where
	return cc.c, cc.addr, nil
}

// info is where the controller listens: FERRY_HOME's info file, or the next of urls.
func (cc *controllerConn) info() (home.Info, error) {
	if len(cc.urls) == 0 {
		info, err := cc.home.ReadInfo()
		if err != nil {
			return home.Info{}, fmt.Errorf("no controller address in %s: %w", cc.home.InfoPath(), err)
		}
		return info, nil
	}
	raw := cc.urls[cc.next%len(cc.urls)]
	if cc.hint != "" {
		raw = cc.hint
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return home.Info{}, fmt.Errorf("controller URL %q: want http://HOST:PORT or https://HOST:PORT", raw)
	}
	// No socket: a proxy given URLs reaches every controller over TCP, HTTPS pinned to
	// FERRY_HOME's controller.crt (the certificate the controllers share).
	return home.Info{Addr: u.Host, TLS: u.Scheme == "https"}, nil
}

// forget makes the next client() read FERRY_HOME again, or take the leader a follower named
// in err (NotLeaderError), else the next URL. A hint is taken once: if it fails too, the list
// goes on. So a single URL in front of every controller (a Kubernetes Service) works as well
// as one per controller.
func (cc *controllerConn) forget(err error) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.c = nil
	var nl *NotLeaderError
	switch {
	case errors.As(err, &nl) && cc.hint == "" && len(cc.urls) > 0:
		cc.hint = nl.Leader
	case cc.hint != "":
		cc.hint = ""
	default:
		cc.next++
	}
}

// newProxyID is random per process, so the controller tells a restarted proxy from the old.
func newProxyID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
