package proxy

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Accept backoff after a temporary error, as net/http's Server.Serve waits: from
// acceptBackoffMin doubling to acceptBackoffMax.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// retryingListener is what every listener of the proxy package accepts through. Accept never
// returns a temporary error: out of file descriptors (EMFILE, ENFILE), of buffers, or a client
// gone before its connection was taken, it waits and tries again, because fasthttp's Serve and
// the Handover stop for good on an error, and descriptors come back as connections close.
type retryingListener struct {
	net.Listener
	log *zap.Logger

	closeOnce sync.Once
	closed    chan struct{}
}

func newRetryingListener(ln net.Listener, log *zap.Logger) *retryingListener {
	return &retryingListener{Listener: ln, log: log, closed: make(chan struct{})}
}

// Accept implements net.Listener.
func (l *retryingListener) Accept() (net.Conn, error) {
	var backoff time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if !retryableAccept(err) {
				return nil, err
			}
			backoff = min(max(2*backoff, acceptBackoffMin), acceptBackoffMax)
			l.log.Warn("accepting a connection failed; retrying", zap.Error(err), zap.Duration("in", backoff))
			select {
			case <-time.After(backoff):
			case <-l.closed:
				return nil, net.ErrClosed
			}
			continue
		}
		return c, nil
	}
}

// Close implements net.Listener; it also ends a backoff wait.
func (l *retryingListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// retryableAccept reports whether an Accept error passes: the process or the system out of
// descriptors or buffers, a client that hung up before its connection was taken, a timeout.
// A closed listener, or one that fails otherwise, is not retried.
func retryableAccept(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return false
	}
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
		syscall.ECONNABORTED, syscall.ECONNRESET, syscall.EINTR, syscall.EAGAIN} {
		if errors.Is(err, errno) {
			return true
		}
	}
	var temporary interface{ Temporary() bool }
	return errors.As(err, &temporary) && temporary.Temporary()
}
