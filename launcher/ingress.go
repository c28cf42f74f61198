package launcher

import (
	"fmt"
	"net"
	"net/netip"
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
