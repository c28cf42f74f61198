package privnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Requests and answers on the helper's socket (SOCK_SEQPACKET, one message each): the client
// sends the address family it wants, reqInet or reqInet6; the helper answers a byte 0 with the
// new socket as SCM_RIGHTS, or an errno byte with none.
const (
	reqInet  byte = '4'
	reqInet6 byte = '6'
)

// helperTimeout bounds one request to the helper, which answers in microseconds.
const helperTimeout = 3 * time.Second

// Client gets sockets from the helper of one FERRY_HOME. It keeps one connection, which also
// keeps the helper running (the helper ends with its last client), and reconnects once when
// the connection broke. It is safe for concurrent use; requests take turns on the connection.
type Client struct {
	path string

	mu sync.Mutex
	fd int // -1 until connected
}

// NewClient returns a client of the helper listening at path. It connects on first use.
func NewClient(path string) *Client { return &Client{path: path, fd: -1} }

// Path is the helper's socket.
func (c *Client) Path() string { return c.path }

// Connect connects now, so that a caller learns at once whether the helper is there (and so
// that the connection keeps it running).
func (c *Client) Connect() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd >= 0 {
		return nil
	}
	return c.connectLocked()
}

func (c *Client) connectLocked() error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnreachable, err)
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: c.path}); err != nil {
		_ = unix.Close(fd)
		return fmt.Errorf("%w: connect %s: %v", ErrUnreachable, c.path, err)
	}
	// A helper that stops answering (stopped, wedged) fails dials after helperTimeout rather
	// than holding every dial of this process.
	tv := unix.NsecToTimeval(helperTimeout.Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	c.fd = fd
	return nil
}

// Close drops the connection; the helper ends once no client is left.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd < 0 {
		return nil
	}
	err := unix.Close(c.fd)
	c.fd = -1
	return err
}

// Socket returns a new SOCK_STREAM socket of family domain (AF_INET or AF_INET6) made in the
// private network, close-on-exec and blocking.
func (c *Client) Socket(domain int) (int, error) {
	req := reqInet
	if domain == unix.AF_INET6 {
		req = reqInet6
	} else if domain != unix.AF_INET {
		return -1, fmt.Errorf("privnet: no sockets of family %d", domain)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var err error
	for range 2 { // a broken connection (the helper restarted) is redone once
		if c.fd < 0 {
			if err = c.connectLocked(); err != nil {
				return -1, err
			}
		}
		var fd int
		if fd, err = c.request(req); err == nil {
			return fd, nil
		}
		var refused *helperError
		if errors.As(err, &refused) {
			return -1, err // the helper answered: no point asking again
		}
		_ = unix.Close(c.fd)
		c.fd = -1
	}
	return -1, fmt.Errorf("%w: %v", ErrUnreachable, err)
}

// helperError is the helper's refusal to make a socket.
type helperError struct{ errno unix.Errno }

func (e *helperError) Error() string {
	return "the private network's helper could not make a socket: " + e.errno.Error()
}
func (e *helperError) Unwrap() error { return e.errno }

// request sends one request on the connection and receives its answer. EINTR is retried: with
// SO_RCVTIMEO set the kernel does not restart the call after a signal (the Go runtime's
// preemption signal among them).
func (c *Client) request(req byte) (int, error) {
	for {
		_, err := unix.Write(c.fd, []byte{req})
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EINTR) {
			return -1, err
		}
	}
	var buf [1]byte
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(c.fd, buf[:], oob, unix.MSG_CMSG_CLOEXEC)
	for errors.Is(err, unix.EINTR) {
		n, oobn, _, _, err = unix.Recvmsg(c.fd, buf[:], oob, unix.MSG_CMSG_CLOEXEC)
	}
	if err != nil {
		return -1, err
	}
	if n == 0 {
		return -1, errors.New("the helper closed the connection")
	}
	if oobn > 0 {
		if fd, ok := oneRight(oob[:oobn]); ok {
			return fd, nil
		}
	}
	if buf[0] != 0 {
		return -1, &helperError{errno: unix.Errno(buf[0])}
	}
	return -1, errors.New("the helper's answer carried no socket")
}

// oneRight is the one descriptor an SCM_RIGHTS message carries.
func oneRight(oob []byte) (int, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil || len(msgs) != 1 {
		return -1, false
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
		return -1, false
	}
	return fds[0], true
}

// DialContext connects to addr (IP:port) in the private network with a socket from the helper.
// Errors are *net.OpError, as net.Dialer's are; a refused connection is ECONNREFUSED.
func (c *Client) DialContext(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := c.dial(ctx, addr)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: opAddr(addr), Err: err}
	}
	return conn, nil
}

func opAddr(addr string) net.Addr {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return net.TCPAddrFromAddrPort(ap)
	}
	return nil
}

func (c *Client) dial(ctx context.Context, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, err
	}
	domain, sa := unix.AF_INET, unix.Sockaddr(&unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()})
	if !ap.Addr().Unmap().Is4() {
		domain, sa = unix.AF_INET6, &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	fd, err := c.Socket(domain)
	if err != nil {
		return nil, err
	}
	if err := connect(ctx, fd, sa); err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "privnet")
	conn, err := net.FileConn(f) // a duplicate, registered with the runtime's poller
	_ = f.Close()
	if err != nil {
		return nil, err
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetKeepAlive(true) // as net.Dialer does
	}
	return conn, nil
}

// connect connects fd to sa, waiting at most until ctx's deadline (loopback answers at once
// unless the listener's backlog is full).
func connect(ctx context.Context, fd int, sa unix.Sockaddr) error {
	if err := unix.SetNonblock(fd, true); err != nil {
		return err
	}
	err := unix.Connect(fd, sa)
	if err == nil || !errors.Is(err, unix.EINPROGRESS) {
		return err
	}
	for {
		wait := -1
		if d, ok := ctx.Deadline(); ok {
			left := time.Until(d)
			if left <= 0 {
				return context.DeadlineExceeded
			}
			wait = int(left/time.Millisecond) + 1
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		if _, err := unix.Poll(fds, wait); err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if fds[0].Revents == 0 {
			continue
		}
		soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return err
		}
		switch e := unix.Errno(soErr); e {
		case 0:
			return nil
		case unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
			continue
		default:
			return e
		}
	}
}
