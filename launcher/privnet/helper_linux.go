package privnet

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Available: the private network can exist on this OS (it still needs user namespaces).
const Available = true

const (
	// readyFD is the helper's end of the pipe on which it says it listens ("ok"), that another
	// helper serves FERRY_HOME ("busy"), or why it cannot start.
	readyFD = 3
	// firstClientWait bounds how long a helper nobody connected to stays.
	firstClientWait = time.Minute
	// startWait bounds how long Start waits for a new helper's word.
	startWait = 10 * time.Second
)

// Open returns a connected client of the helper at path, starting the helper first when none
// listens there (see Client.Start).
func Open(binary, path, logPath string) (*Client, error) {
	c := NewClient(path)
	if err := c.Start(binary, logPath); err != nil {
		return nil, err
	}
	return c, nil
}

// Start makes sure the client is connected to a helper that makes sockets: it asks the one it
// is connected to, else connects again, else starts one (binary, re-executed as HelperCommand
// in a new user and network namespace) and connects to it. The helper runs in a session of its
// own and outlives this process for as long as any client (a replica's supervisor, a
// controller) is connected; its output goes to logPath.
func (c *Client) Start(binary, logPath string) error {
	if fd, err := c.Socket(unix.AF_INET); err == nil {
		_ = unix.Close(fd)
		return nil
	}
	for range 3 { // a helper that was ending as we asked may say "busy" once
		busy, err := start(binary, c.path, logPath)
		if err != nil {
			return err
		}
		if err := c.Connect(); err == nil {
			return nil
		} else if !busy {
			return err
		}
	}
	return fmt.Errorf("%w: another helper holds %s.lock but does not answer", ErrUnreachable, c.path)
}

// start starts a helper for path and waits for its word; busy means another helper holds the
// path's lock.
func start(binary, path, logPath string) (busy bool, err error) {
	if len(path) >= len(unix.RawSockaddrUnix{}.Path) {
		return false, fmt.Errorf("%w: its socket path %s is longer than a Unix socket address takes; use a shorter FERRY_HOME", ErrUnreachable, path)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return false, err
	}
	defer r.Close()
	out, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		w.Close()
		return false, err
	}
	defer out.Close()
	cmd := exec.Command(binary, HelperCommand, path)
	cmd.Stdout, cmd.Stderr, cmd.ExtraFiles = out, out, []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setsid:     true, // no signal of the caller's terminal or session reaches it
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET,
		// Root inside, as the caller outside: enough to bring lo up, nothing on the host.
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		GidMappingsEnableSetgroups: false,
	}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return false, fmt.Errorf("%w: start its helper in a new user and network namespace: %v (are unprivileged user namespaces disabled? see kernel.unprivileged_userns_clone, user.max_user_namespaces)", ErrUnreachable, err)
	}
	go func() { _ = cmd.Wait() }() // reaped if it ends before we do
	_ = r.SetReadDeadline(time.Now().Add(startWait))
	word, err := io.ReadAll(r)
	switch {
	case string(word) == "ok":
		return false, nil
	case string(word) == "busy":
		return true, nil
	case len(word) > 0:
		return false, fmt.Errorf("%w: its helper: %s", ErrUnreachable, word)
	case err != nil:
		_ = cmd.Process.Kill()
		return false, fmt.Errorf("%w: its helper did not start within %v: %v", ErrUnreachable, startWait, err)
	}
	return false, fmt.Errorf("%w: its helper ended at start (see %s)", ErrUnreachable, logPath)
}

// Serve is the helper, `ferry local-netns PATH`, run by Open in a new user and network
// namespace: it brings lo up, listens at PATH and makes sockets for its clients until the last
// one has gone. It returns the process's exit status.
func Serve(args []string) int {
	ready := os.NewFile(readyFD, "ready")
	say := func(word string) {
		if ready != nil {
			_, _ = ready.WriteString(word)
			_ = ready.Close()
			ready = nil
		}
	}
	if len(args) != 1 {
		say("usage: ferry " + HelperCommand + " SOCKET")
		return 2
	}
	path := args[0]
	lock, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		say(err.Error())
		return 1
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		say("busy") // another helper serves this FERRY_HOME
		return 0
	}
	ln, err := listen(path)
	if err != nil {
		say(err.Error())
		return 1
	}
	say("ok")
	h := &helper{ln: ln, path: path}
	h.serve()
	return 0
}

// listen brings lo up and listens at path (0600; FERRY_HOME is 0700 anyway).
func listen(path string) (int, error) {
	if err := loopbackUp(); err != nil {
		return -1, fmt.Errorf("bring lo up in the new network namespace: %w", err)
	}
	_ = os.Remove(path) // a helper that ended without removing it: we hold the lock
	ln, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	old := unix.Umask(0o177)
	err = unix.Bind(ln, &unix.SockaddrUnix{Name: path})
	unix.Umask(old)
	if err == nil {
		err = unix.Listen(ln, 128)
	}
	if err != nil {
		_ = unix.Close(ln)
		return -1, fmt.Errorf("listen at %s: %w", path, err)
	}
	return ln, nil
}

// loopbackUp sets IFF_UP on lo: a new network namespace has it down.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// helper serves one FERRY_HOME's clients.
type helper struct {
	ln   int
	path string

	mu      sync.Mutex
	clients int
}

// serve accepts clients, each served on its own goroutine, until the process ends: when the
// last client has gone, or when none came within firstClientWait.
func (h *helper) serve() {
	first := time.AfterFunc(firstClientWait, h.leaveIfIdle)
	for {
		fd, _, err := unix.Accept4(h.ln, unix.SOCK_CLOEXEC)
		if err != nil {
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
				continue
			}
			fmt.Fprintf(os.Stderr, "ferry %s: accept: %v\n", HelperCommand, err)
			_ = os.Remove(h.path)
			os.Exit(1)
		}
		h.mu.Lock()
		h.clients++
		h.mu.Unlock()
		first.Stop()
		go h.client(fd)
	}
}

// leaveIfIdle ends the helper when it has no client: its socket goes first, so a later Open
// starts a new helper rather than connecting to one that is ending. The namespace lives on
// for as long as a socket made in it does, but no new socket can be made in it.
func (h *helper) leaveIfIdle() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.clients > 0 {
		return
	}
	_ = os.Remove(h.path)
	fmt.Fprintf(os.Stderr, "ferry %s: no client left; leaving\n", HelperCommand)
	os.Exit(0)
}

// client answers one client's requests until it goes.
func (h *helper) client(fd int) {
	defer func() {
		_ = unix.Close(fd)
		h.mu.Lock()
		h.clients--
		h.mu.Unlock()
		h.leaveIfIdle()
	}()
	var req [1]byte
	for {
		n, err := unix.Read(fd, req[:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			return
		}
		domain := unix.AF_INET
		if req[0] == reqInet6 {
			domain = unix.AF_INET6
		}
		s, err := unix.Socket(domain, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			errno := unix.EINVAL
			errors.As(err, &errno)
			_, _ = unix.Write(fd, []byte{byte(errno)})
			continue
		}
		err = unix.Sendmsg(fd, []byte{0}, unix.UnixRights(s), nil, 0)
		for errors.Is(err, unix.EINTR) {
			err = unix.Sendmsg(fd, []byte{0}, unix.UnixRights(s), nil, 0)
		}
		_ = unix.Close(s)
		if err != nil {
			return
		}
	}
}
