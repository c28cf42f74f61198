package local

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ferryserve/ferry/launcher"
)

// denySeccompCommand makes the test binary install a filter under which seccomp(2) fails, then
// exec the rest of its command line: a supervisor started so finds user notification
// unavailable, as under an older kernel or a container runtime's filter.
const denySeccompCommand = "deny-seccomp"

func denySeccompThenExec(argv []string) {
	runtime.LockOSThread()
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: uint32(unsafe.Offsetof(seccompData{}.Nr))},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jf: 1, K: unix.SYS_SECCOMP},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		os.Exit(3)
	}
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); errno != 0 {
		os.Exit(4)
	}
	_ = syscall.Exec(argv[0], argv, os.Environ())
	os.Exit(5)
}

// buildBinder builds ferry-test-bind GREETING NETWORK=ADDR...: it listens on each address,
// prints "bound NETWORK=ADDR LOCAL" for each (where the socket really is), then answers every
// connection with "GREETING LOCAL". With dial=ADDR arguments only, it dials each, prints
// "dialed ADDR: LINE" with the line read, and exits.
func buildBinder(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte(`package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

func init() {
	// With OFF_MAIN set, main() stays on the main thread and the binds happen on another one,
	// as in most multi-threaded servers (the kernel names the thread, not the process).
	if os.Getenv("OFF_MAIN") != "" {
		runtime.LockOSThread()
	}
}

func dial(addr string) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		fmt.Println("dial", addr, err)
		return
	}
	defer c.Close()
	line, err := bufio.NewReader(c).ReadString('\n')
	fmt.Printf("dialed %s: %s (%v)\n", addr, strings.TrimSpace(line), err)
}

// race binds fresh sockets to a struct sockaddr_in that another thread keeps switching
// between 0.0.0.0:OTHER, a port a socket of its own holds (so those binds fail and take no
// ephemeral port, which could be PORT), and 0.0.0.0:PORT, and says whether a bind ever got
// 0.0.0.0:PORT.
func race(port int) {
	holder, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		fmt.Println("hold a port:", err)
		os.Exit(5)
	}
	other := holder.Addr().(*net.TCPAddr).Port
	var sa [4]uint32
	word := func(p int) uint32 {
		var b [4]byte
		binary.NativeEndian.PutUint16(b[:], syscall.AF_INET)
		binary.BigEndian.PutUint16(b[2:], uint16(p))
		return binary.NativeEndian.Uint32(b[:])
	}
	zero, task := word(other), word(port)
	atomic.StoreUint32(&sa[0], zero)
	var stop atomic.Bool
	go func() {
		runtime.LockOSThread()
		for !stop.Load() {
			atomic.StoreUint32(&sa[0], task)
			atomic.StoreUint32(&sa[0], zero)
		}
	}()
	const tries = 20000
	for i := 1; i <= tries; i++ {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
		if err != nil {
			fmt.Println("socket:", err)
			os.Exit(5)
		}
		_, _, errno := syscall.Syscall(syscall.SYS_BIND, uintptr(fd), uintptr(unsafe.Pointer(&sa[0])), 16)
		if errno == 0 {
			got, _ := syscall.Getsockname(fd)
			if in, ok := got.(*syscall.SockaddrInet4); ok && in.Port == port && in.Addr == [4]byte{} {
				fmt.Printf("raced: bound 0.0.0.0:%d after %d tries\n", port, i)
				return
			}
		}
		syscall.Close(fd)
	}
	stop.Store(true)
	fmt.Printf("held: %d tries, none bound 0.0.0.0:%d\n", tries, port)
}

// badConnect connects with an address the kernel cannot read.
func badConnect() {
	fd, _ := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	_, _, errno := syscall.Syscall(syscall.SYS_CONNECT, uintptr(fd), 8, 16)
	fmt.Println("bad connect:", errno)
}

func main() {
	if p, ok := strings.CutPrefix(os.Args[2], "race="); ok {
		port, _ := strconv.Atoi(p)
		race(port)
		select {}
	}
	if os.Args[2] == "badconnect" {
		badConnect()
		select {}
	}
	if strings.HasPrefix(os.Args[2], "dial=") {
		listen()
		return
	}
	if os.Getenv("OFF_MAIN") != "" {
		done := make(chan struct{})
		go func() { listen(); close(done) }()
		<-done
	} else {
		listen()
	}
	select {}
}

func listen() {
	if os.Getenv("OFF_MAIN") != "" && syscall.Gettid() == os.Getpid() {
		fmt.Println("binding on the main thread")
		os.Exit(6)
	}
	for _, a := range os.Args[2:] {
		network, addr, _ := strings.Cut(a, "=")
		if network == "dial" {
			dial(addr)
			continue
		}
		l, err := net.Listen(network, addr)
		if err != nil {
			fmt.Println("listen", a, err)
			os.Exit(5)
		}
		fmt.Println("bound", a, l.Addr())
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				fmt.Fprintln(c, os.Args[1], l.Addr())
				c.Close()
			}
		}()
	}
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "ferry-test-bind"), src).CombinedOutput()
	if err != nil {
		t.Fatalf("build binder: %v\n%s", err, out)
	}
	return dir
}

// supervisedProvider runs fixed-port replicas under this test binary as `ferry local-supervise`
// (TestMain dispatches it), with ferry-test-bind on PATH.
func supervisedProvider(t *testing.T, bin string) *Provider {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if bin == "" {
		bin = self
	}
	p := newProvider(t, Options{Supervisor: bin, StopGrace: 5 * time.Second})
	p.opts.PathPrepend = []string{buildBinder(t)}
	return p
}

// launchFixed launches a replica on port whose run is run, terminated at the test's end.
func launchFixed(t *testing.T, p *Provider, name string, port int, run string) launcher.Instance {
	t.Helper()
	in, err := p.Launch(context.Background(), launcher.Spec{Name: name, Labels: map[string]string{"service": "bind"}, Port: port, Run: run})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Terminate(context.Background(), in.ID) })
	return in
}

// recordedIsSupervisor fails unless the process the provider recorded for id is the
// supervisor, so a test cannot pass on a replica that ran without one.
func recordedIsSupervisor(t *testing.T, p *Provider, id string) *metadata {
	t.Helper()
	meta, err := loadMetadata(filepath.Join(p.opts.Dir, id))
	if err != nil {
		t.Fatal(err)
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(meta.PID) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Split(string(cmdline), "\x00"); len(args) < 2 || args[1] != SuperviseCommand {
		t.Fatalf("%s's recorded process %d runs %q, not the supervisor", id, meta.PID, args)
	}
	return meta
}

// logOf waits until id's log holds want and returns it.
func logOf(t *testing.T, p *Provider, id, want string) string {
	t.Helper()
	path, err := p.LogPath(id)
	if err != nil {
		t.Fatal(err)
	}
	var got string
	waitFor(t, 30*time.Second, want+" in "+id+"'s log", func() bool {
		got = readFile(t, path)
		return strings.Contains(got, want)
	})
	return got
}

// Unmodified programs binding the task's port on 0.0.0.0 (IPv4), [::] (dual-stack IPv6, from a
// thread other than the main one) or 127.0.0.1 all get it, each at its replica's own address, where the provider's endpoint
// reaches it; the program's other binds (another port, an ephemeral one) stay as asked; a
// restarted controller adopts the replicas and Terminate stops each whole tree.
func TestSupervisorMovesWildcardBinds(t *testing.T) {
	p := supervisedProvider(t, "")
	port, other := freePort(t), freePort(t)
	P, O := strconv.Itoa(port), strconv.Itoa(other)
	runs := map[string]string{
		"v4": "exec ferry-test-bind v4 tcp4=0.0.0.0:" + P + " tcp4=0.0.0.0:" + O + " tcp4=127.0.0.1:0",
		"v6": "OFF_MAIN=1 exec ferry-test-bind v6 tcp=[::]:" + P,
		"lo": "exec ferry-test-bind lo tcp4=127.0.0.1:" + P,
	}
	asked := map[string]string{"v4": "0.0.0.0:" + P, "v6": "[::]:" + P, "lo": "127.0.0.1:" + P}
	insts := map[string]launcher.Instance{}
	for _, name := range []string{"v4", "v6", "lo"} {
		insts[name] = launchFixed(t, p, name, port, runs[name])
	}
	for name, in := range insts {
		recordedIsSupervisor(t, p, in.ID)
		// Go shows the dual-stack socket's ::ffff:127.x.y.z as 127.x.y.z.
		if got, want := greeting(t, in.Endpoint), name+" "+in.Endpoint; got != want {
			t.Errorf("%s answered %q, want %q", in.Endpoint, got, want)
		}
		moved := "ferry: bind " + asked[name] + " moved to " + in.Endpoint + ","
		if log := logOf(t, p, in.ID, "bound"); !strings.Contains(log, moved) {
			t.Errorf("%s's log does not say %q:\n%s", name, moved, log)
		}
	}
	log := logOf(t, p, insts["v4"].ID, "bound tcp4=127.0.0.1:0")
	for _, want := range []string{"bound tcp4=0.0.0.0:" + O + " 0.0.0.0:" + O + "\n", "bound tcp4=127.0.0.1:0 127.0.0.1:"} {
		if !strings.Contains(log, want) {
			t.Errorf("v4's other binds moved; want %q in its log:\n%s", want, log)
		}
	}

	list, err := newProvider(t, Options{Dir: p.opts.Dir}).List(context.Background(), map[string]string{"service": "bind"})
	if err != nil || len(list) != 3 {
		t.Fatalf("adopted %v (%v), want 3", list, err)
	}
	for _, in := range list {
		if in.State != launcher.StateRunning || in.Endpoint != insts[in.Name].Endpoint {
			t.Errorf("adopted %s %s at %s; launched at %s", in.Name, in.State, in.Endpoint, insts[in.Name].Endpoint)
		}
	}
	for _, in := range insts {
		meta := recordedIsSupervisor(t, p, in.ID)
		if err := p.Terminate(context.Background(), in.ID); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(-meta.PGID, 0); err != syscall.ESRCH {
			t.Errorf("%s's process group %d outlived Terminate (%v)", in.Name, meta.PGID, err)
		}
	}
}

// A program cannot race the supervisor: while one thread binds fresh sockets to an address
// another thread switches between 0.0.0.0:OTHER and 0.0.0.0:PORT, no bind gets 0.0.0.0:PORT. (The
// supervisor used to leave binds it did not move to the kernel, which read the address again:
// one got 0.0.0.0:PORT within a few hundred tries.) A connect whose address cannot be read is
// left to the kernel, and the log says so.
func TestSupervisorBindCannotBeRaced(t *testing.T) {
	p := supervisedProvider(t, "")
	port := freePort(t)
	in := launchFixed(t, p, "racer", port, "exec ferry-test-bind racer race="+strconv.Itoa(port))
	recordedIsSupervisor(t, p, in.ID)
	log := logOf(t, p, in.ID, "tries")
	if !strings.Contains(log, "held: 20000 tries") {
		t.Errorf("a racing thread made a bind of 0.0.0.0:%d go through unmoved:\n%s", port, log)
	}

	bad := launchFixed(t, p, "badconnect", freePort(t), "exec ferry-test-bind bad badconnect")
	recordedIsSupervisor(t, p, bad.ID)
	log = logOf(t, p, bad.ID, "bad connect:")
	if !strings.Contains(log, "ferry: connect of thread ") || !strings.Contains(log, "left to the kernel as the program asked: read its address") {
		t.Errorf("a connect left to the kernel after an error was not logged:\n%s", log)
	}
}

// TestSupervisorBindsUnixSockets: the supervisor binds Unix sockets too, as the program would:
// a relative path in the program's working directory, the file's mode from the program's
// umask, and an abstract name; and the program serves on them.
func TestSupervisorBindsUnixSockets(t *testing.T) {
	p := supervisedProvider(t, "")
	dir := t.TempDir()
	abstract := "@ferry-test-" + strconv.Itoa(os.Getpid())
	in := launchFixed(t, p, "unix", freePort(t), "cd "+dir+" && umask 077 && exec ferry-test-bind unix unix=rel.sock unix="+abstract)
	recordedIsSupervisor(t, p, in.ID)
	logOf(t, p, in.ID, "bound unix="+abstract)
	info, err := os.Stat(filepath.Join(dir, "rel.sock"))
	if err != nil {
		t.Fatalf("the relative socket is not in the program's working directory: %v", err)
	}
	if info.Mode().Type() != os.ModeSocket || info.Mode().Perm() != 0o700 {
		t.Errorf("rel.sock is %v, want a socket with mode 0700 (umask 077)", info.Mode())
	}
	for _, addr := range []string{filepath.Join(dir, "rel.sock"), abstract} {
		c, err := net.DialTimeout("unix", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		line, _ := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if !strings.HasPrefix(line, "unix ") {
			t.Errorf("%s answered %q", addr, line)
		}
	}
}

// TestBinderLoopEndFailsCalls: when the supervisor's loop ends (here its receive fails), the
// workload's binds fail with ENOSYS instead of waiting forever for an answer.
func TestBinderLoopEndFailsCalls(t *testing.T) {
	dir := buildBinder(t)
	pid, listener, err := startWorkload([]string{filepath.Join(dir, "ferry-test-bind"), "x", "tcp4=127.0.0.1:0"}, false)
	if err != nil || listener < 0 {
		t.Fatalf("start the workload: pid %d, listener %d, %v", pid, listener, err)
	}
	b := &binder{listener: listener, host: "127.0.0.1", port: 1, recv: func(*seccompNotif) error { return unix.EIO }}
	go b.serve()
	exited := make(chan unix.WaitStatus, 1)
	go func() {
		var ws unix.WaitStatus
		for {
			if _, err := unix.Wait4(pid, &ws, 0, nil); !errors.Is(err, unix.EINTR) {
				break
			}
		}
		exited <- ws
	}()
	select {
	case ws := <-exited:
		if ws.ExitStatus() != 5 { // ferry-test-bind: listen failed
			t.Errorf("the workload ended with %v, want exit status 5 (its bind failed)", ws)
		}
	case <-time.After(20 * time.Second):
		_ = unix.Kill(pid, unix.SIGKILL)
		<-exited
		t.Fatal("the workload's bind still waits 20 s after the supervisor's loop ended")
	}
}

// An IPv6-only wildcard bind cannot take the replica's IPv4 address: it goes through as asked.
func TestSupervisorPassesIPv6OnlyThrough(t *testing.T) {
	p := supervisedProvider(t, "")
	port := freePort(t)
	in := launchFixed(t, p, "v6only", port, "exec ferry-test-bind v6only tcp6=[::]:"+strconv.Itoa(port))
	recordedIsSupervisor(t, p, in.ID)
	want := "v6only [::]:" + strconv.Itoa(port)
	if got := greeting(t, net.JoinHostPort("::1", strconv.Itoa(port))); got != want {
		t.Errorf("[::1]:%d answered %q, want %q", port, got, want)
	}
	if log := logOf(t, p, in.ID, "bound"); strings.Contains(log, "moved") {
		t.Errorf("an IPv6-only bind moved:\n%s", log)
	}
}

// The supervisor ends as the workload does: its exit status, its fatal signal; and the
// group's SIGTERM reaches the workload once, not once more through the supervisor.
func TestSupervisorExitStatusAndSignals(t *testing.T) {
	p := supervisedProvider(t, "")
	port := freePort(t)
	exits := launchFixed(t, p, "exits", port, "sleep 0.5; exit 7")
	killed := launchFixed(t, p, "killed", port, "sleep 0.5; kill -USR1 $$")
	term := launchFixed(t, p, "term", port, "trap 'echo got TERM; exit 0' TERM\necho ready\nsleep 300 & wait")
	for _, in := range []launcher.Instance{exits, killed, term} {
		recordedIsSupervisor(t, p, in.ID)
	}
	var ended map[string]launcher.Instance
	listEnded := func() bool {
		list, err := p.List(context.Background(), map[string]string{"service": "bind"})
		if err != nil {
			t.Fatal(err)
		}
		ended = map[string]launcher.Instance{}
		for _, in := range list {
			if in.State == launcher.StateTerminated {
				ended[in.Name] = in
			}
		}
		return len(ended) == 2
	}
	waitFor(t, 30*time.Second, "two replicas ending by themselves", listEnded)
	listEnded() // the listing that saw them end may have read instance.json just before the exit code

	if in := ended["exits"]; in.ExitCode == nil || *in.ExitCode != 7 || in.Reason != "exit status 7" {
		t.Errorf("exits ended with %v (%q), want exit status 7", in.ExitCode, in.Reason)
	}
	if in := ended["killed"]; in.ExitCode != nil || in.Reason != "signal: user defined signal 1" {
		t.Errorf("killed ended with %v (%q), want killed by SIGUSR1", in.ExitCode, in.Reason)
	}
	logOf(t, p, term.ID, "ready")
	if err := p.Terminate(context.Background(), term.ID); err != nil {
		t.Fatal(err)
	}
	kept := readFile(t, filepath.Join(p.opts.Dir, logsDir, "term.log"))
	if n := strings.Count(kept, "got TERM"); n != 1 {
		t.Errorf("the workload got SIGTERM %d times, want once; its log:\n%s", n, kept)
	}
}

// Without seccomp user notification the replica runs as it would without a supervisor, and
// its log says why; a supervisor binary that does not start at all changes nothing either.
func TestSupervisorUnavailableFallsBack(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(t.TempDir(), "ferry")
	script := "#!/bin/sh\nexec '" + self + "' " + denySeccompCommand + " '" + self + "' \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, bin, note string }{
		{"denied", wrapper, "seccomp user notification unavailable"},
		{"missing", filepath.Join(t.TempDir(), "no-such-ferry"), ""},
	} {
		p := supervisedProvider(t, tc.bin)
		port := freePort(t)
		in := launchFixed(t, p, tc.name, port, `exec ferry-test-bind `+tc.name+` "tcp4=$FERRY_HOST:`+strconv.Itoa(port)+`"`)
		if got, want := greeting(t, in.Endpoint), tc.name+" "+in.Endpoint; got != want {
			t.Errorf("%s answered %q, want %q", in.Endpoint, got, want)
		}
		log := logOf(t, p, in.ID, "bound")
		if tc.note != "" && !strings.Contains(log, tc.note) {
			t.Errorf("%s: the log does not say %q:\n%s", tc.name, tc.note, log)
		}
		if strings.Contains(log, "moved") {
			t.Errorf("%s: a bind moved without a supervisor:\n%s", tc.name, log)
		}
	}
}

// The replica's own processes still reach its server where they expect it, on localhost with
// the task's port (SGLang's warm-up request, a run's wait loop): blocking (bash) and
// non-blocking (Go) connects to 127.0.0.1, localhost, 0.0.0.0 and [::1] go to its address; a
// connect to another port is left alone.
func TestSupervisorMovesLoopbackConnects(t *testing.T) {
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
	p := supervisedProvider(t, "")
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

// Which addresses move: the task's port on a wildcard or loopback address, IPv4 or IPv6; not
// another port, not another address, not another family, not a truncated sockaddr.
func TestBinderTarget(t *testing.T) {
	b := &binder{host: "127.7.8.9", port: 8000}
	v4 := func(a [4]byte, port int) []byte {
		sa := make([]byte, unix.SizeofSockaddrInet4)
		binary.NativeEndian.PutUint16(sa, unix.AF_INET)
		binary.BigEndian.PutUint16(sa[2:], uint16(port))
		copy(sa[4:], a[:])
		return sa
	}
	v6 := func(a string, port int) []byte {
		sa := make([]byte, unix.SizeofSockaddrInet6)
		binary.NativeEndian.PutUint16(sa, unix.AF_INET6)
		binary.BigEndian.PutUint16(sa[2:], uint16(port))
		ip := netip.MustParseAddr(a).As16()
		copy(sa[8:], ip[:])
		return sa
	}
	own4 := &unix.SockaddrInet4{Port: 8000, Addr: [4]byte{127, 7, 8, 9}}
	own6 := &unix.SockaddrInet6{Port: 8000, Addr: netip.MustParseAddr("::ffff:127.7.8.9").As16()}
	unixSock := make([]byte, 110)
	binary.NativeEndian.PutUint16(unixSock, unix.AF_UNIX)
	for _, tc := range []struct {
		name string
		raw  []byte
		want unix.Sockaddr
	}{
		{"0.0.0.0", v4([4]byte{}, 8000), own4},
		{"127.0.0.1", v4([4]byte{127, 0, 0, 1}, 8000), own4},
		{"::", v6("::", 8000), own6},
		{"::1", v6("::1", 8000), own6},
		{"::ffff:0.0.0.0", v6("::ffff:0.0.0.0", 8000), own6},
		{"::ffff:127.0.0.1", v6("::ffff:127.0.0.1", 8000), own6},
		{"another port", v4([4]byte{}, 8001), nil},
		{"port 0", v4([4]byte{}, 0), nil},
		{"its own address", v4([4]byte{127, 7, 8, 9}, 8000), nil},
		{"another loopback", v4([4]byte{127, 0, 0, 2}, 8000), nil},
		{"a real address", v6("fd00::2", 8000), nil},
		{"AF_UNIX", unixSock, nil},
		{"truncated v6", v6("::", 8000)[:20], nil},
		{"truncated v4", v4([4]byte{}, 8000)[:6], nil},
	} {
		got, ok := b.target(tc.raw)
		if ok != (tc.want != nil) || ok && fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: target = %v, %v; want %v", tc.name, got, ok, tc.want)
		}
	}
}

// Only a replica on the task's own port runs supervised: one taking $FERRY_PORT, which shares
// 127.0.0.1, runs as before, its recorded process the shell itself.
func TestFerryPortReplicaUnsupervised(t *testing.T) {
	p := supervisedProvider(t, "")
	in, err := p.Launch(context.Background(), launcher.Spec{Name: "dyn", Port: 8000, Run: `sleep 30 # --port $FERRY_PORT`})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Terminate(context.Background(), in.ID) })
	meta, err := loadMetadata(filepath.Join(p.opts.Dir, in.ID))
	if err != nil {
		t.Fatal(err)
	}
	// A process just started may show an empty cmdline for a moment (seen under load).
	var cmdline []byte
	for range 50 {
		if cmdline, err = os.ReadFile("/proc/" + strconv.Itoa(meta.PID) + "/cmdline"); err != nil {
			t.Fatal(err)
		}
		if len(cmdline) > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if args := strings.Split(string(cmdline), "\x00"); args[0] != "bash" {
		t.Errorf("a $FERRY_PORT replica runs %q, want bash directly", args)
	}
}

// The nodes of a multi-node replica (a service's gang: each node at an address of its own)
// that all bind the task's port on 0.0.0.0, as SkyPilot's multi-node serving examples do, each
// get it at their own address; a job's gang is left as it is.
func TestSupervisorMovesAServiceGangsWildcardBinds(t *testing.T) {
	p := supervisedProvider(t, "")
	port := freePort(t)
	P := strconv.Itoa(port)
	spec := launcher.Spec{Name: "gang", Labels: map[string]string{launcher.LabelService: "gang", "service": "bind"}, Port: port,
		Run: "exec ferry-test-bind node$SKYPILOT_NODE_RANK tcp4=0.0.0.0:" + P, Job: &launcher.JobSpec{Priority: launcher.ServingPriority}}
	nodes, err := launcher.LaunchGang(context.Background(), p, spec, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range nodes {
		t.Cleanup(func() { _ = p.Terminate(context.Background(), in.ID) })
	}
	for rank, in := range nodes {
		recordedIsSupervisor(t, p, in.ID)
		if got, want := greeting(t, in.Endpoint), "node"+strconv.Itoa(rank)+" "+in.Endpoint; got != want {
			t.Errorf("node %d at %s answered %q, want %q", rank, in.Endpoint, got, want)
		}
	}
	if !supervised(spec) {
		t.Fatal("a service gang's node is not supervised")
	}
	job := spec
	job.Labels = map[string]string{launcher.LabelJob: "7"}
	if supervised(job) {
		t.Fatal("a job's node is supervised")
	}
}

// TestBindAddressUnspec: Linux binds an AF_INET socket given AF_UNSPEC with INADDR_ANY as
// AF_INET, so the binder moves that form of 0.0.0.0:PORT too (left as it is, it held the port
// on every address); on an IPv6 socket the kernel refuses it, and so it stays as it is.
func TestBindAddressUnspec(t *testing.T) {
	b := &binder{host: "127.7.8.9", port: 8000}
	unspec := make([]byte, unix.SizeofSockaddrInet4)
	binary.NativeEndian.PutUint16(unspec, unix.AF_UNSPEC)
	binary.BigEndian.PutUint16(unspec[2:], 8000)
	for _, tc := range []struct {
		domain    int
		wantMoved bool
	}{{unix.AF_INET, true}, {unix.AF_INET6, false}} {
		fd, err := unix.Socket(tc.domain, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		addr, moved, errno := b.bindAddress(fd, os.Getpid(), unspec)
		unix.Close(fd)
		if errno != 0 || moved != tc.wantMoved {
			t.Errorf("domain %d: moved %v (errno %v), want %v", tc.domain, moved, errno, tc.wantMoved)
		}
		if moved {
			if sa, ok := parseSockaddr(addr); !ok || sa.String() != "127.7.8.9:8000" {
				t.Errorf("moved to %v, want 127.7.8.9:8000", sa)
			}
		}
	}
}
