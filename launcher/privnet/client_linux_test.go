package privnet

import (
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// A signal that reaches the client while it waits for the helper's answer does not cost it its
// connection: the helper's socket has SO_RCVTIMEO, so the kernel does not restart the
// interrupted receive, and a client that gave the connection up would end the helper when it
// was its last client (found by BenchmarkDial under load). The helper here is a stand-in on a
// real socket that answers only after the client's thread has been signalled.
func TestRequestSurvivesSignals(t *testing.T) {
	path := filepath.Join(t.TempDir(), SocketName)
	ln, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ln)
	if err := unix.Bind(ln, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(ln, 4); err != nil {
		t.Fatal(err)
	}
	c := NewClient(path)
	defer c.Close()
	if err := c.Connect(); err != nil {
		t.Fatal(err)
	}
	conn, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(conn)

	tid := make(chan int)
	got := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid <- unix.Gettid()
		fd, err := c.Socket(unix.AF_INET)
		if err == nil {
			unix.Close(fd)
		}
		got <- err
	}()
	thread := <-tid
	var req [1]byte
	if _, err := unix.Read(conn, req[:]); err != nil { // the client now waits for the answer
		t.Fatal(err)
	}
	for range 20 {
		// SIGURG: the runtime's own preemption signal, which it handles and ignores otherwise.
		if err := unix.Tgkill(unix.Getpid(), thread, unix.SIGURG); err != nil {
			t.Fatal(err)
		}
	}
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(s)
	if err := unix.Sendmsg(conn, []byte{0}, unix.UnixRights(s), nil, 0); err != nil {
		t.Fatalf("answer the client: %v (it gave up its connection)", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the client's request: %v", err)
	}
}
