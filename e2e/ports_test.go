package e2e

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// Ports for what a test starts on an address it names (controller APIs, gateways, metrics,
// proxies, replica-sims, fixed-port replicas) are handed out once each per test binary, from
// below the kernel's ephemeral range.
//
// Asking the kernel for port 0 and closing the listener leaves a window, until the child
// process binds the port, in which another parallel test, a replica the controller started
// (launcher/local takes its replicas' ports the same way) or an outgoing connection can get
// the same port. Below the ephemeral range the kernel hands nothing out by itself, and the
// counter never gives one port to two tests; the bind check skips ports something else on the
// machine holds. Keeping the listener until the child takes it would be exact, but the ferry
// binary cannot inherit a listener; retrying on a child's bind failure would spread over
// every test.
//
// The range stays clear of Ferry's defaults (metrics 9464, the gateway 30000, service
// endpoints from 30001) and of testcluster's API proxy (20000 up to the ephemeral range).
const (
	lowestPort  = 10000
	highestPort = 20000 // exclusive
)

// portRange is [lowestPort, highestPort) cut at the start of this machine's ephemeral range.
func portRange() (lo, hi int) {
	lo, hi = lowestPort, highestPort
	if data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if fields := strings.Fields(string(data)); len(fields) == 2 {
			if start, err := strconv.Atoi(fields[0]); err == nil {
				hi = min(hi, start)
			}
		}
	}
	return lo, hi
}

// nextPort is the counter freePort walks; it starts at a random offset so that two test
// binaries on one machine (two checkouts' `go test ./e2e/`) rarely walk the same ports.
var nextPort = func() *atomic.Int64 {
	var n atomic.Int64
	n.Store(rand.Int64N(highestPort - lowestPort))
	return &n
}()

// freePort returns a port no other test of this binary has been given, free on every address
// a moment ago (so a program may bind it on 0.0.0.0 as well as on 127.0.0.1).
func freePort(t *testing.T) int {
	t.Helper()
	lo, hi := portRange()
	if hi-lo < 1000 {
		t.Fatalf("the ephemeral port range starts at %d: too little room below it for the tests' ports (%d up)", hi, lo)
	}
	for range hi - lo {
		port := lo + int(nextPort.Add(1)%int64(hi-lo))
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		ln.Close()
		return port
	}
	t.Fatalf("no free port in %d-%d", lo, hi-1)
	return 0
}
