package proxy

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// peekGone asks the socket, without reading or blocking, whether the peer has shut down its
// side (POLLRDHUP: its FIN arrived, even behind unread bytes such as a TLS close_notify or a
// pipelined request) or the connection is broken (POLLHUP, POLLERR: a reset).
func peekGone(rc syscall.RawConn) bool {
	gone := false
	err := rc.Control(func(fd uintptr) {
		fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		n, err := unix.Poll(fds[:], 0)
		gone = err == nil && n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
	})
	return err == nil && gone
}
