package launcher

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// RouteSource is the address this host sends from when it connects to ip: the source a
// replica at ip sees for the controller's probes and its in-process proxy, unless a NAT sits
// between them. It returns it as a one-address prefix (a.b.c.d/32, or /128), the narrowest
// rule a cloud's firewall can hold. No packet is sent: connecting a UDP socket only asks the
// kernel for a route.
//
// Providers use it to admit the controller to a replica's service port when the operator has
// listed no sources: narrower than any private range, and right for a controller that runs in
// the replicas' network or reaches it over a routed VPN. Behind a NAT it is wrong (the replica
// sees the NAT's address), and the port stays closed to the controller: fail safe.
func RouteSource(ip string) (netip.Prefix, error) {
	dst, err := netip.ParseAddr(ip)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("route source: %q is not an IP address", ip)
	}
	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 9)))
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("route source for %s: %w", ip, err)
	}
	defer conn.Close()
	src := conn.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
	if !src.IsValid() || src.IsUnspecified() {
		return netip.Prefix{}, fmt.Errorf("route source for %s: the kernel chose no address", ip)
	}
	return netip.PrefixFrom(src, src.BitLen()), nil
}

// IngressAdoption makes sure, once per key in this process, that the service port of each
// running instance an earlier controller launched admits the proxies: an upgraded controller
// narrows an old wide rule, and one that moved admits its new address, without waiting for a
// launch. A key that failed is tried again after Retry. The zero value is ready (Retry: a
// minute); safe for concurrent use.
type IngressAdoption struct {
	Retry time.Duration

	mu     sync.Mutex
	failed map[string]time.Time // key → zero when done, else when it last failed
}

// Adopt calls ensure for each running instance in insts with an endpoint, under the key that
// key gives its port (false: skip it), unless that key was done or failed less than Retry ago.
// ensure's error is logged by ensure's caller through failed.
func (a *IngressAdoption) Adopt(insts []Instance, key func(in Instance, port int) (string, bool),
	ensure func(in Instance, host string, port int) error, failed func(in Instance, port int, err error)) {
	retry := a.Retry
	if retry <= 0 {
		retry = time.Minute
	}
	for _, in := range insts {
		if in.State != StateRunning || in.Endpoint == "" {
			continue
		}
		host, portStr, err := net.SplitHostPort(in.Endpoint)
		port, perr := strconv.Atoi(portStr)
		if err != nil || perr != nil {
			continue
		}
		k, ok := key(in, port)
		if !ok {
			continue
		}
		a.mu.Lock()
		failedAt, seen := a.failed[k]
		a.mu.Unlock()
		if seen && (failedAt.IsZero() || time.Since(failedAt) < retry) {
			continue
		}
		at := time.Time{}
		if err := ensure(in, host, port); err != nil {
			at = time.Now()
			failed(in, port, err)
		}
		a.mu.Lock()
		if a.failed == nil {
			a.failed = map[string]time.Time{}
		}
		a.failed[k] = at
		a.mu.Unlock()
	}
}
