package local

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/privnet"
)

// Replicas on a fixed port. SkyPilot's serving tasks fix their port in the run command
// (`vllm serve ... --port 8000` with `ports: 8000`), as each replica has a machine of its own.
// Locally, such a replica gets a loopback address of its own (127.x.y.z, as a job's node does:
// Linux routes all of 127.0.0.0/8 to lo) and keeps the task's port, so two replicas both listen
// on 8000 and the proxy and probes dial each at its own address. A program that binds
// 0.0.0.0:8000 instead (the usual default) is moved there by the replica's supervisor
// (supervise.go); without one, such a bind holds the port on every address, so only one such
// replica runs per port, and the next launch says why.
//
// A network namespace per replica would let an unmodified 0.0.0.0 bind work too, but without
// root a fresh namespace has no route out (a model download fails). So only the serving socket
// moves into a namespace (Ferry's private network, launcher/privnet), which the proxy dials
// with sockets from its helper: with Options.PrivateNetwork a service replica gets an address
// in privnet.Range and runs under the supervisor whether or not it fixes its port, and its
// program's other sockets stay on the host's network.

// fixedPort reports whether spec's program serves on the task's port itself rather than on
// $FERRY_PORT: its setup and run never mention FERRY_PORT.
func fixedPort(spec launcher.Spec) bool {
	return spec.Port > 0 && !strings.Contains(spec.Setup+"\n"+spec.Run, "FERRY_PORT")
}

// hostQuarantine keeps an address handed to a replica from being handed out again before its
// instance.json names it.
const hostQuarantine = time.Minute

// ErrPortHeld is the launch error of a fixed-port replica whose port some program holds on
// every address (a 0.0.0.0 bind); it wraps launcher.ErrNoCapacity, as no address here can
// serve on it.
var ErrPortHeld = fmt.Errorf("%w: port held on all local addresses", launcher.ErrNoCapacity)

// replicaHost picks an unused loopback address on which port is free, and reserves it.
func (p *Provider) replicaHost(port int) (string, error) {
	used, err := p.hostsInUse()
	if err != nil {
		return "", err
	}
	var lastErr error
	for range 100 {
		ip, err := randomLoopback()
		if err != nil {
			return "", err
		}
		if used[ip] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
		if errors.Is(err, syscall.EADDRINUSE) {
			// A supervised replica's 0.0.0.0 bind is on its own address: this is another
			// program, or a replica that runs without a supervisor (see its log).
			return "", fmt.Errorf("%w: a program listens on *:%d, so no replica can have port %d on an address of its own; "+
				"a local replica on a fixed port must bind $FERRY_HOST (e.g. --host $FERRY_HOST), not 0.0.0.0", ErrPortHeld, port, port)
		}
		if err != nil {
			used[ip], lastErr = true, err // not bindable here (or the port is privileged)
			continue
		}
		_ = l.Close()
		if p.reserveHost(ip) {
			return ip, nil
		}
	}
	return "", fmt.Errorf("%w: no loopback address here takes a replica on port %d (last: %v)", launcher.ErrNoCapacity, port, lastErr)
}

// reserveHost records ip as handed out, unless it was handed out within hostQuarantine.
func (p *Provider) reserveHost(ip string) bool {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for h, at := range p.recentHosts {
		if now.Sub(at) > hostQuarantine {
			delete(p.recentHosts, h)
		}
	}
	if _, taken := p.recentHosts[ip]; taken {
		return false
	}
	p.recentHosts[ip] = now
	return true
}

// recentlyHanded adds the addresses reserved within hostQuarantine to used.
func (p *Provider) recentlyHanded(used map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for h := range p.recentHosts {
		used[h] = true
	}
}

// privateNet returns the private network's helper socket when spec's replica listens there,
// starting the helper if needed; "" when it listens on the host's loopback: a job's node
// (its nodes reach each other on the host), a provider without PrivateNetwork or the
// supervisor, a Host off loopback, or a host without user namespaces (logged once per cause).
func (p *Provider) privateNet(spec launcher.Spec) string {
	if !p.opts.PrivateNetwork || spec.Job != nil || p.opts.Supervisor == "" || p.net == nil {
		return ""
	}
	err := privateSupported()
	if err == nil {
		err = p.net.Start(p.opts.Supervisor, filepath.Join(p.opts.Dir, privnetLog))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if msg := err.Error(); msg != p.netWarned {
			p.netWarned = msg
			p.log.Warn("local replicas listen on loopback, where every user of this host can send them requests past the service's API keys: "+
				"Ferry's private network is unavailable", zap.Error(err))
		}
		return ""
	}
	p.netWarned = ""
	return p.net.Path()
}

// privnetLog is the private network helper's output, in Options.Dir.
const privnetLog = "netns.log"

// privateHost picks an address in privnet.Range that no instance has, and reserves it. No bind
// is tried: only the supervisor puts sockets there, each on its own replica's address.
func (p *Provider) privateHost() (string, error) {
	used, err := p.hostsInUse()
	if err != nil {
		return "", err
	}
	for range 100 {
		var b [2]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", err
		}
		ip := privnet.Range.Addr().As4()
		ip[2], ip[3] = b[0], 1+b[1]%254
		host := netip.AddrFrom4(ip).String()
		if !used[host] && p.reserveHost(host) {
			return host, nil
		}
	}
	return "", fmt.Errorf("%w: no free address in Ferry's private network %s", launcher.ErrNoCapacity, privnet.Range)
}
