package testcluster

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// An API server that goes away mid-run — restarted for an upgrade, its node lost — is the
// outage a Kubernetes provider meets most. Killing the shared cluster's kube-apiserver would
// show it, but to every test of the binary at once, and a restarted one must be waited for.
// APIProxy shows it to one test only: a loopback TCP proxy in front of the API server, which
// the test's clients reach through RESTConfig or Kubeconfig. Stop makes the API server look
// down to them, the way a dead process does: new connections are refused (the port has no
// listener) and open ones are cut, watches included. Start makes it answer again on the same
// address, so the clients reconnect by themselves, as they would to a restarted API server.
// Hang makes it look hung instead: connections are accepted and never answered, which only a
// client's own deadlines end. The cluster and every other test go on talking to the real
// address, undisturbed.
//
//	c := testcluster.Shared(t)
//	proxy := c.APIProxy(t) // closed when the test ends
//	p, _ := kubernetes.New(kubernetes.Options{RESTConfig: proxy.RESTConfig(), ...})
//	proxy.Stop()  // the API server is "down"
//	...
//	proxy.Start() // and back
type APIProxy struct {
	target     string // the API server's host:port
	addr       string // 127.0.0.1:PORT, the same across Stop and Start
	restConfig *rest.Config
	kubeconfig string

	mu      sync.Mutex
	ln      net.Listener          // nil while stopped
	hanging bool                  // connections are accepted and never answered
	conns   map[net.Conn]struct{} // both ends of every open connection
	closed  bool
	// gen counts changes of behaviour: a connection accepted before one is not served after it.
	gen int
	wg  sync.WaitGroup // accept loops and the goroutines serving connections
}

// APIProxy starts a proxy in front of the cluster's API server for one test, and closes it
// when the test ends. It fails the test if the proxy cannot listen.
func (c *Cluster) APIProxy(t testing.TB) *APIProxy {
	t.Helper()
	p, err := c.StartAPIProxy()
	if err != nil {
		t.Fatalf("start an API server proxy: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// StartAPIProxy starts a proxy in front of the cluster's API server, serving until Close.
func (c *Cluster) StartAPIProxy() (*APIProxy, error) {
	target := strings.TrimPrefix(c.server, "https://")
	ln, err := listenOutsideEphemeral()
	if err != nil {
		return nil, err
	}
	p := &APIProxy{target: target, addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}}
	p.restConfig = rest.CopyConfig(c.restConfig)
	p.restConfig.Host = "https://" + p.addr
	p.kubeconfig = filepath.Join(c.dir, "apiproxy-"+strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)+".kubeconfig")
	if err := writeKubeconfig(p.kubeconfig, p.restConfig.Host, c.restConfig.BearerToken); err != nil {
		_ = ln.Close()
		return nil, err
	}
	p.mu.Lock()
	p.ln = ln
	p.serveLocked(ln)
	p.mu.Unlock()
	return p, nil
}

// listenOutsideEphemeral listens on a loopback port below the kernel's ephemeral range, so
// that while the proxy is stopped no outgoing connection of this machine is given its port
// (the kernel hands those out from the ephemeral range only) and Start finds it free again.
// Where the range cannot be read, any free port does.
func listenOutsideEphemeral() (net.Listener, error) {
	const lowest = 20000
	highest := 32768 // Linux's default start of the ephemeral range
	if data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if fields := strings.Fields(string(data)); len(fields) == 2 {
			if lo, err := strconv.Atoi(fields[0]); err == nil {
				highest = lo
			}
		}
	}
	if highest-lowest >= 1000 {
		for range 50 {
			port := lowest + rand.IntN(highest-lowest)
			if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
				return ln, nil
			}
		}
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// Addr is the proxy's host:port on 127.0.0.1.
func (p *APIProxy) Addr() string { return p.addr }

// RESTConfig is a new copy of the admin's client configuration, pointed through the proxy.
func (p *APIProxy) RESTConfig() *rest.Config { return rest.CopyConfig(p.restConfig) }

// Kubeconfig is the path of a kubeconfig file (context ContextName) pointed through the proxy.
func (p *APIProxy) Kubeconfig() string { return p.kubeconfig }

// Stopped reports whether the proxy is stopped (or closed).
func (p *APIProxy) Stopped() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ln == nil
}

// Stop makes the API server unreachable through the proxy: it stops listening, so a new
// connection is refused, and cuts every open one. It returns once nothing passes any more.
// Stopping a stopped proxy does nothing.
func (p *APIProxy) Stop() {
	p.mu.Lock()
	p.cutLocked()
	p.hanging = false
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Start makes the API server answer through the proxy again, on the same address, after Stop
// or Hang (whose connections it cuts, so that their clients reconnect). Starting a running
// proxy does nothing; a closed one cannot start.
func (p *APIProxy) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hanging {
		p.cutLocked()
		p.hanging = false
	}
	return p.listenLocked()
}

// Hang makes the API server look hung through the proxy: it cuts every open connection, and
// accepts new ones but never answers them — no TLS handshake, no byte — until Start or Stop.
func (p *APIProxy) Hang() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.listenLocked(); err != nil {
		return err
	}
	p.cutLocked()
	p.hanging = true
	return nil
}

// Close stops the proxy for good.
func (p *APIProxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Stop()
}

// cutLocked closes every open connection, and makes connections accepted before it go
// unserved. Callers hold mu.
func (p *APIProxy) cutLocked() {
	p.gen++
	for conn := range p.conns {
		_ = conn.Close()
	}
	clear(p.conns)
}

// listenLocked listens on the proxy's address again, unless it does already. Callers hold mu.
func (p *APIProxy) listenLocked() error {
	switch {
	case p.closed:
		return errors.New("testcluster: the API server proxy is closed")
	case p.ln != nil:
		return nil
	}
	// The port is outside the ephemeral range, but a connection the proxy just cut may still
	// hold it for a moment on some systems: try for a few seconds.
	for deadline := time.Now().Add(5 * time.Second); ; {
		ln, err := net.Listen("tcp", p.addr)
		if err == nil {
			p.ln = ln
			p.serveLocked(ln)
			return nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return fmt.Errorf("testcluster: restart the API server proxy on %s: %w", p.addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// serveLocked accepts connections on ln until it is closed, and relays each to the API server,
// or swallows it while hanging. Callers hold mu.
func (p *APIProxy) serveLocked(ln net.Listener) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			client, err := ln.Accept()
			if err != nil {
				return // closed by Stop
			}
			p.mu.Lock()
			if p.ln != ln { // accepted just before Stop closed ln: refused after all
				p.mu.Unlock()
				_ = client.Close()
				continue
			}
			gen, hanging := p.gen, p.hanging
			p.conns[client] = struct{}{}
			p.wg.Add(1)
			p.mu.Unlock()
			if hanging {
				go p.swallow(client)
			} else {
				go p.relay(gen, client)
			}
		}
	}()
}

// forget closes conns and stops tracking them.
func (p *APIProxy) forget(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// swallow reads what the client sends and never answers, until the connection is cut.
func (p *APIProxy) swallow(client net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(io.Discard, client)
	p.forget(client)
}

// relay connects client to the API server and copies both ways until either side ends or the
// proxy cuts both.
func (p *APIProxy) relay(gen int, client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		p.forget(client)
		return
	}
	p.mu.Lock()
	if p.gen != gen { // cut while dialling: client is closed already
		p.mu.Unlock()
		p.forget(client, server)
		return
	}
	p.conns[server] = struct{}{}
	p.mu.Unlock()
	var copiers sync.WaitGroup
	copiers.Go(func() {
		_, _ = io.Copy(server, client)
		p.forget(client, server)
	})
	copiers.Go(func() {
		_, _ = io.Copy(client, server)
		p.forget(client, server)
	})
	copiers.Wait()
}
