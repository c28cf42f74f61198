//go:build darwin

package proxy

import "syscall"

// peekGone peeks at one byte of the socket without taking it and without blocking: 0 bytes is
// the peer's FIN, a reset or a dead connection an error; data or EAGAIN mean it is there (a FIN
// behind unread data, such as a TLS close_notify, is missed here; Linux's POLLRDHUP sees it).
func peekGone(rc syscall.RawConn) bool {
	gone := false
	err := rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == nil:
			gone = n == 0
		case err == syscall.EAGAIN, err == syscall.EINTR:
		default:
			gone = true // ECONNRESET, ENOTCONN, ETIMEDOUT...
		}
	})
	return err == nil && gone
}
