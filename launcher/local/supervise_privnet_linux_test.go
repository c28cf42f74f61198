package local

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/privnet"
)

// privateProvider runs service replicas in Ferry's private network, under this test binary as
// `ferry local-supervise` and `ferry local-netns` (TestMain dispatches both), with
// ferry-test-bind on PATH.
func privateProvider(t *testing.T, dir string) *Provider {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, Options{Dir: dir, Supervisor: self, StopGrace: 5 * time.Second, PrivateNetwork: true})
	p.opts.PathPrepend = []string{buildBinder(t)}
	t.Cleanup(func() { _ = p.net.Close() })
	return p
}

// privateGreeting dials addr in the private network with c until it answers, and returns its
// one line.
func privateGreeting(t *testing.T, c *privnet.Client, addr string) string {
	t.Helper()
	var line string
	waitFor(t, 30*time.Second, "a greeting from "+addr+" in the private network", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn, err := c.DialContext(ctx, addr)
		if err != nil {
			return false
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		line, err = bufio.NewReader(conn).ReadString('\n')
		return err == nil
	})
	return strings.TrimSpace(line)
}

// refusedOnHost fails unless a plain connect to addr, from this process and from a process of
// another user (uid 65534), is refused: nothing listens there on the host's network.
func refusedOnHost(t *testing.T, addr string) {
	t.Helper()
	if c, err := net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
		c.Close()
		t.Errorf("a plain dial of %s connected: the replica's port is on the host's network", addr)
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a plain dial of %s: %v, want connection refused", addr, err)
	}
	host, port, _ := net.SplitHostPort(addr)
	out := asNobody(t, `exec 3<>/dev/tcp/`+host+`/`+port+` && echo connected || echo refused`)
	if !strings.HasSuffix(out, "\nrefused") || !strings.Contains(out, "Connection refused") {
		t.Errorf("another user's connect to %s: %q, want connection refused", addr, out)
	}
}

// asNobody runs script in bash as uid and gid 65534 and returns its output.
func asNobody(t *testing.T, script string) string {
	t.Helper()
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run as uid 65534: %v\n%s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// A service replica's serving port is in Ferry's private network, whatever it binds (0.0.0.0
// with a fixed port, $FERRY_HOST, 127.0.0.1:$FERRY_PORT): Ferry's dialer reaches it at its
// endpoint, an address in privnet.Range, while a plain connect there, from this process or
// from another user's, is refused, and another user cannot reach the helper's socket. The
// program's other ports stay on the host's network.
func TestPrivateNetworkServingPort(t *testing.T) {
	p := privateProvider(t, "")
	port, other := freePort(t), freePort(t)
	P, O := strconv.Itoa(port), strconv.Itoa(other)
	runs := map[string]string{
		"wild": "exec ferry-test-bind wild tcp4=0.0.0.0:" + P + " tcp4=0.0.0.0:" + O,
		"own":  "exec ferry-test-bind own tcp4=$FERRY_HOST:" + P,
		"v6":   "exec ferry-test-bind v6 tcp=[::]:" + P,
		"fp":   "exec ferry-test-bind fp tcp4=127.0.0.1:$FERRY_PORT",
	}
	for _, name := range []string{"wild", "own", "v6", "fp"} {
		in := launchFixed(t, p, name, port, runs[name])
		recordedIsSupervisor(t, p, in.ID)
		ap, err := netip.ParseAddrPort(in.Endpoint)
		if err != nil || !privnet.Range.Contains(ap.Addr()) || !privnet.Private(in.Endpoint) {
			t.Fatalf("%s's endpoint %q is not in the private network %s", name, in.Endpoint, privnet.Range)
		}
		if got, want := privateGreeting(t, p.net, in.Endpoint), name+" "+in.Endpoint; got != want {
			t.Errorf("%s answered %q, want %q", in.Endpoint, got, want)
		}
		logOf(t, p, in.ID, "in Ferry's private network")
		refusedOnHost(t, in.Endpoint)
	}
	refusedOnHost(t, "127.0.0.1:"+P)
	// The replica's other port is where it asked, on the host.
	if got := greeting(t, "127.0.0.1:"+O); !strings.HasPrefix(got, "wild ") {
		t.Errorf("the replica's other port answered %q", got)
	}
	sock := filepath.Join(p.opts.Dir, privnet.SocketName)
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("helper socket %s: %v, mode %v; want 0600", sock, err, fi.Mode())
	}
	if out := asNobody(t, `test -e `+sock+` && echo reachable || echo unreachable`); out != "unreachable" {
		t.Errorf("another user: the helper's socket is %s", out)
	}
}

// The replica's own processes still reach its server on localhost with the task's port
// (a run's wait loop, SGLang's warm-up): blocking (bash) and non-blocking (Go) connects to
// 127.0.0.1, localhost, 0.0.0.0 and [::1] get a socket in the private network, connected to the
// replica's address there; a connect to another port stays on the host.
func TestPrivateNetworkLocalhostConnects(t *testing.T) {
	outside, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer outside.Close()
	go func() {
		for {
			c, err := outside.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("outside\n"))
			c.Close()
		}
	}()
	p := privateProvider(t, "")
	port := freePort(t)
	P, O := strconv.Itoa(port), strconv.Itoa(outside.Addr().(*net.TCPAddr).Port)
	in := launchFixed(t, p, "conn", port, `ferry-test-bind conn tcp4=0.0.0.0:`+P+` &
for i in $(seq 300); do read -r line </dev/tcp/127.0.0.1/`+P+` && break; sleep 0.1; done 2>/dev/null
echo "bash got: $line"
ferry-test-bind dial dial=localhost:`+P+` dial=0.0.0.0:`+P+` dial=[::1]:`+P+` dial=127.0.0.1:`+O+`
echo done
wait`)
	log := logOf(t, p, in.ID, "done\n")
	server := "conn " + in.Endpoint
	for _, want := range []string{
		"bash got: " + server + "\n",
		"dialed localhost:" + P + ": " + server + " (<nil>)\n",
		"dialed 0.0.0.0:" + P + ": " + server + " (<nil>)\n",
		"dialed [::1]:" + P + ": " + server + " (<nil>)\n",
		"dialed 127.0.0.1:" + O + ": outside (<nil>)\n",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("want %q in the replica's log:\n%s", want, log)
		}
	}
}

// A controller that restarts adopts replicas in the private network: the replicas'
// supervisors keep the helper running after the first controller's connection is gone, and
// the successor's dialer (privnet's default, as the proxy and prober use it) reaches them
// there. Once the replicas and the last controller are gone, so is the helper.
func TestPrivateNetworkAdoption(t *testing.T) {
	dir := t.TempDir()
	first := privateProvider(t, dir)
	port := freePort(t)
	in := launchFixed(t, first, "adopt", port, "exec ferry-test-bind adopt tcp4=0.0.0.0:"+strconv.Itoa(port))
	privateGreeting(t, first.net, in.Endpoint)
	if err := first.net.Close(); err != nil { // the first controller is gone
		t.Fatal(err)
	}
	next := privateProvider(t, dir)
	insts, err := next.List(context.Background(), map[string]string{"service": "bind"})
	if err != nil || len(insts) != 1 || insts[0].State != launcher.StateRunning || insts[0].Endpoint != in.Endpoint {
		t.Fatalf("adopted %+v (%v), want %s running at %s", insts, err, in.ID, in.Endpoint)
	}
	var line string
	waitFor(t, 30*time.Second, "the adopted replica answering through privnet.Dial", func() bool {
		c, err := privnet.Dial(in.Endpoint, time.Second)
		if err != nil {
			t.Logf("dial %s: %v", in.Endpoint, err)
			return false
		}
		defer c.Close()
		line, err = bufio.NewReader(c).ReadString('\n')
		return err == nil
	})
	if want := "adopt " + in.Endpoint + "\n"; line != want {
		t.Errorf("adopted replica answered %q, want %q", line, want)
	}
	if err := next.Terminate(context.Background(), in.ID); err != nil {
		t.Fatal(err)
	}
	_ = next.net.Close()
	sock := filepath.Join(dir, privnet.SocketName)
	waitFor(t, 10*time.Second, "the helper gone with its last client", func() bool {
		_, err := os.Stat(sock)
		return errors.Is(err, os.ErrNotExist)
	})
}

// netnsFailEnv makes the test binary's `ferry local-netns` fail as it does on a host without
// unprivileged user namespaces.
const netnsFailEnv = "FERRY_TEST_NETNS_FAIL"

// On a host where the private network cannot start, a service replica still runs, on loopback
// as before, and the controller's log says why and what it means.
func TestPrivateNetworkUnavailableFallsBack(t *testing.T) {
	t.Setenv(netnsFailEnv, "1")
	core, logs := observer.New(zap.WarnLevel)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, Options{Supervisor: self, StopGrace: 5 * time.Second, PrivateNetwork: true, Logger: zap.New(core)})
	p.opts.PathPrepend = []string{buildBinder(t)}
	port := freePort(t)
	in := launchFixed(t, p, "fallback", port, "exec ferry-test-bind fallback tcp4=0.0.0.0:"+strconv.Itoa(port))
	if privnet.Private(in.Endpoint) {
		t.Fatalf("endpoint %s is in the private network, which did not start", in.Endpoint)
	}
	if got, want := greeting(t, in.Endpoint), "fallback "+in.Endpoint; got != want {
		t.Errorf("%s answered %q, want %q", in.Endpoint, got, want)
	}
	warned := logs.FilterMessageSnippet("local replicas listen on loopback").All()
	if len(warned) != 1 || !strings.Contains(warned[0].ContextMap()["error"].(string), "no user namespaces here") {
		t.Errorf("warnings %+v, want one that says why", logs.All())
	}
}
