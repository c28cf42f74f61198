package local

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher"
)

// freePort is a port nothing listens on, on any address, right now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// greeting dials addr until it answers and returns its one line.
func greeting(t *testing.T, addr string) string {
	t.Helper()
	var line string
	waitFor(t, 30*time.Second, "a greeting from "+addr, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		line, err = bufio.NewReader(c).ReadString('\n')
		return err == nil
	})
	return strings.TrimSpace(line)
}

// Two replicas whose run fixes the task's port both serve on it, each on a loopback address of
// its own that FERRY_HOST and SKYPILOT_NODE_IPS name, with FERRY_PORT the task's port; a
// restarted controller finds them at the same endpoints.
func TestReplicasShareFixedPort(t *testing.T) {
	p := newProvider(t, Options{})
	p.opts.PathPrepend = []string{buildListener(t)}
	port := freePort(t)
	spec := func(name string) launcher.Spec {
		return launcher.Spec{
			Name:   name,
			Labels: map[string]string{"service": "fixed"},
			Port:   port,
			// The run must not name that variable, or it would be taken to choose its port:
			// its environment goes to the log, checked below.
			Run: `printenv | grep -E '^(FERRY_(HOST|PORT)|SKYPILOT_NODE_IPS)=' | sort
exec ferry-test-listen "$FERRY_HOST:` + strconv.Itoa(port) + `" "` + name + ` on $FERRY_HOST"`,
		}
	}
	var insts []launcher.Instance
	for _, name := range []string{"fixed-1", "fixed-2"} {
		in, err := p.Launch(context.Background(), spec(name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Terminate(context.Background(), in.ID) })
		insts = append(insts, in)
	}
	if insts[0].IP == insts[1].IP {
		t.Fatalf("both replicas on %s", insts[0].IP)
	}
	for _, in := range insts {
		if !strings.HasPrefix(in.IP, "127.") || in.IP == DefaultHost || in.Endpoint != net.JoinHostPort(in.IP, strconv.Itoa(port)) {
			t.Fatalf("replica %s at %s (ip %s): want a loopback address of its own on port %d", in.Name, in.Endpoint, in.IP, port)
		}
	}
	// A controller started later finds each at the endpoint it was launched on.
	adopted := map[string]string{}
	list, err := newProvider(t, Options{Dir: p.opts.Dir}).List(context.Background(), map[string]string{"service": "fixed"})
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range list {
		adopted[in.Name] = in.Endpoint
	}
	for _, in := range insts {
		if adopted[in.Name] != in.Endpoint {
			t.Errorf("adopted %s at %q, launched at %q", in.Name, adopted[in.Name], in.Endpoint)
		}
		if got, want := greeting(t, in.Endpoint), in.Name+" on "+in.IP; got != want {
			t.Errorf("%s answered %q, want %q", in.Endpoint, got, want)
		}
		path, err := p.LogPath(in.ID)
		if err != nil {
			t.Fatal(err)
		}
		want := "FERRY_HOST=" + in.IP + "\nFERRY_PORT=" + strconv.Itoa(port) + "\nSKYPILOT_NODE_IPS=" + in.IP + "\n"
		if got := readFile(t, path); got != want {
			t.Errorf("%s's environment:\n%s\nwant:\n%s", in.Name, got, want)
		}
	}
}

// A replica whose run takes $FERRY_PORT still gets a free port on the shared address.
func TestReplicaOnFerryPortSharesHost(t *testing.T) {
	p := newProvider(t, Options{})
	in, err := p.Launch(context.Background(), launcher.Spec{Name: "dyn", Port: 8000, Run: `sleep 30 # --port $FERRY_PORT`})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Terminate(context.Background(), in.ID) })
	host, portStr, _ := net.SplitHostPort(in.Endpoint)
	if in.IP != DefaultHost || host != DefaultHost || portStr == "8000" {
		t.Fatalf("replica at %s (ip %s): want a port of its own on %s", in.Endpoint, in.IP, DefaultHost)
	}
}

// A program holding the port on every address (another replica's 0.0.0.0 bind) leaves no
// address for a fixed-port replica: the launch says so and what to bind instead.
func TestFixedPortHeldOnAllAddresses(t *testing.T) {
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	p := newProvider(t, Options{})
	_, err = p.Launch(context.Background(), launcher.Spec{Name: "blocked", Port: port, Run: "sleep 30"})
	if !errors.Is(err, ErrPortHeld) || !errors.Is(err, launcher.ErrNoCapacity) || !strings.Contains(err.Error(), "$FERRY_HOST") {
		t.Fatalf("launch on a port held on 0.0.0.0: %v; want ErrPortHeld naming $FERRY_HOST", err)
	}
	list, err := p.List(context.Background(), nil)
	if err != nil || len(list) != 0 {
		t.Fatalf("a refused launch left instances %v (%v)", list, err)
	}
}
