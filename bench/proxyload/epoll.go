package main

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The `epoll` subcommand, the target of that name: the least an HTTP/1.1 reverse proxy in Go
// costs when it is not built on goroutines per connection. One OS thread runs one
// level-triggered epoll loop over non-blocking sockets: client connections, and a keep-alive
// pool of upstream connections per upstream, picked round robin. Requests and answers pass
// byte for byte; only their heads are parsed, to find where each ends (Content-Length, the
// chunked terminator, or the upstream's close), and answer bytes go to the client as they are
// read, so SSE streams unbuffered.
//
// It answers one question of issue 39 (docs/measurements.md, "The proxy against nginx"):
// whether Go itself, rather than fasthttp's goroutine per connection, puts a floor above
// nginx's CPU per request. Measured beside nginx and `passthrough` it is the floor of an
// event-loop engine. It is a yardstick, not a proxy to serve with: no timeouts, retries, TLS,
// HTTP/2, header rewriting, smuggling checks, chunked request bodies or 1xx answers; a pooled
// upstream connection the upstream closed gives a 502; and an answer that starts while the
// request body is still going up, to a client not reading it, can stall that exchange (the
// load generator sends whole requests and reads every answer).
//
// Reads, writes and epoll_wait are raw syscalls: the Go runtime does not see them, so its
// sysmon does not take the thread's P back after each idle wait (what lifts a goroutine
// proxy's syscalls per stream; the x/sys wrappers measured 137 a stream against 91). The
// wait is bounded (epollWaitMillis), and an empty one yields, so that a garbage collection is
// never held up for long.

const (
	epollBufSize    = 16 << 10
	epollWaitMillis = 10
)

// A client connection's request state.
const (
	reqHead = iota // waiting for (the rest of) a request head
	reqBody        // head forwarded, body bytes still to forward
	reqWait        // request forwarded, waiting for the answer to end
)

// An upstream connection's answer state.
const (
	respHead    = iota // waiting for (the rest of) the answer's head
	respLength         // a Content-Length body
	respChunked        // a chunked body, scanned for its terminator
	respToClose        // a body that ends when the upstream closes
	respNone           // no body (HEAD, 204, 304)
)

var (
	crlf2    = []byte("\r\n\r\n")
	resp400  = []byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	resp431  = []byte("HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	resp501  = []byte("HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	resp502  = []byte("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	errUsage = errors.New("--listen (IPv4 loopback) and at least one --upstream (IPv4 host:port) are required")
)

// epConn is one socket, a client's or an upstream's, and the exchange it is in.
type epConn struct {
	fd       int
	gen      int32 // tells a reused slot from the connection an event was for
	upstream bool
	open     bool
	mask     uint32 // epoll interest registered now

	buf        []byte
	start, n   int // client: unprocessed bytes are buf[start:n]; upstream: buf[:n]
	wOff, wEnd int // buf[wOff:wEnd] still to be written to peer
	pending    bool
	peer       *epConn

	// client side
	rs         int
	remain     int64 // request body bytes still to forward
	closeAfter bool
	isHead     bool
	stalled    bool // buffer full of pipelined bytes while an answer is in flight

	// upstream side
	backend    int
	connecting bool
	inPool     bool
	ms         int
	bodyRemain int64
	chunks     chunkScanner
	upClose    bool
	sentAny    bool // some answer bytes already went to the client
	done       bool // the answer ends within the bytes being written
}

// epollProxy is the loop's state; only its own goroutine touches it.
type epollProxy struct {
	epfd, lfd, stopfd int
	backends          []unix.SockaddrInet4
	pools             [][]*epConn
	rr                int
	conns             []*epConn // by fd
	free              []*epConn
	gen               int32
}

func runEpoll(args []string) error {
	listen, upstreams, err := parseBareProxyFlags(targetEpoll, args)
	if err != nil {
		return err
	}
	p, err := newEpollProxy(listen, upstreams)
	if err != nil {
		return err
	}
	signal.Ignore(syscall.SIGPIPE)
	return p.run()
}

// newEpollProxy listens on listen; run serves until stop.
func newEpollProxy(listen string, upstreams []string) (*epollProxy, error) {
	la, err := netip.ParseAddrPort(listen)
	if err != nil || !la.Addr().IsLoopback() || !la.Addr().Is4() || len(upstreams) == 0 {
		return nil, errUsage
	}
	p := &epollProxy{lfd: -1, epfd: -1, stopfd: -1}
	for _, u := range upstreams {
		ap, err := netip.ParseAddrPort(strings.TrimPrefix(u, "http://"))
		if err != nil || !ap.Addr().Is4() {
			return nil, fmt.Errorf("upstream %q: %w", u, errUsage)
		}
		p.backends = append(p.backends, unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()})
	}
	p.pools = make([][]*epConn, len(p.backends))
	if err := p.open(la); err != nil {
		p.closeAll()
		return nil, err
	}
	return p, nil
}

func (p *epollProxy) open(la netip.AddrPort) error {
	var err error
	if p.lfd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0); err != nil {
		return err
	}
	if err = unix.SetsockoptInt(p.lfd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return err
	}
	if err = unix.Bind(p.lfd, &unix.SockaddrInet4{Port: int(la.Port()), Addr: la.Addr().As4()}); err != nil {
		return fmt.Errorf("listen %s: %w", la, err)
	}
	if err = unix.Listen(p.lfd, 4096); err != nil {
		return err
	}
	if p.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return err
	}
	if p.stopfd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return err
	}
	for _, fd := range []int{p.lfd, p.stopfd} {
		if err = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
			return err
		}
	}
	return nil
}

// port is the port the proxy listens on (for a --listen port of 0).
func (p *epollProxy) port() (int, error) {
	sa, err := unix.Getsockname(p.lfd)
	if err != nil {
		return 0, err
	}
	return sa.(*unix.SockaddrInet4).Port, nil
}

// stop makes run return; safe from any goroutine.
func (p *epollProxy) stop() {
	one := [8]byte{1}
	unix.Write(p.stopfd, one[:])
}

// closeAll closes every socket the proxy holds.
func (p *epollProxy) closeAll() {
	for _, c := range p.conns {
		if c != nil && c.open {
			unix.Close(c.fd)
		}
	}
	for _, fd := range []int{p.lfd, p.epfd, p.stopfd} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// run is the loop, on one locked OS thread, until stop.
func (p *epollProxy) run() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer p.closeAll()
	events := make([]unix.EpollEvent, 512)
	for {
		r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_WAIT, uintptr(p.epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), epollWaitMillis, 0, 0)
		if r == 0 || e == syscall.EINTR {
			// Nothing in this loop lets the scheduler in when no event comes (the raw wait
			// is no preemption point, and the signal that asks for one only interrupts it),
			// so a garbage collection's stop-the-world would wait forever: yield here.
			runtime.Gosched()
			continue
		}
		if e != 0 {
			return fmt.Errorf("epoll_wait: %w", e)
		}
		for i := range int(r) {
			ev := &events[i]
			switch fd := int(ev.Fd); fd {
			case p.stopfd:
				return nil
			case p.lfd:
				p.accept()
			default:
				p.event(fd, ev.Pad, ev.Events)
			}
		}
	}
}

// event handles what epoll reported for one connection.
func (p *epollProxy) event(fd int, gen int32, events uint32) {
	c := p.conns[fd]
	if c == nil || c.gen != gen {
		return // closed, and maybe its slot reused, earlier in this batch
	}
	if events&(unix.EPOLLHUP|unix.EPOLLERR) != 0 && !c.connecting {
		// Reported whatever the interest: a connection paused for back-pressure would
		// otherwise come back on every wait.
		p.broken(c)
		return
	}
	if events&unix.EPOLLOUT != 0 {
		p.onWritable(c)
		if !c.open || c.gen != gen {
			return
		}
	}
	if events&unix.EPOLLIN != 0 {
		if c.upstream {
			p.upRead(c)
		} else {
			p.clientRead(c)
		}
	}
}

func (p *epollProxy) broken(c *epConn) {
	if c.upstream {
		p.failUp(c)
	} else {
		p.closeClient(c)
	}
}

func rawRead(fd int, b []byte) (int, syscall.Errno) {
	r, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	return int(r), e
}

func rawWrite(fd int, b []byte) (int, syscall.Errno) {
	r, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	return int(r), e
}

func (p *epollProxy) setMask(c *epConn, m uint32) {
	if c.mask == m {
		return
	}
	c.mask = m
	unix.EpollCtl(p.epfd, unix.EPOLL_CTL_MOD, c.fd, &unix.EpollEvent{Events: m, Fd: int32(c.fd), Pad: c.gen})
}

func (p *epollProxy) newConn(fd int, upstream bool, mask uint32) *epConn {
	var c *epConn
	if k := len(p.free); k > 0 {
		c = p.free[k-1]
		p.free = p.free[:k-1]
		*c = epConn{buf: c.buf}
	} else {
		c = &epConn{buf: make([]byte, epollBufSize)}
	}
	p.gen++
	c.fd, c.upstream, c.open, c.gen, c.mask = fd, upstream, true, p.gen, mask
	for fd >= len(p.conns) {
		p.conns = append(p.conns, nil)
	}
	p.conns[fd] = c
	unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: mask, Fd: int32(fd), Pad: c.gen})
	return c
}

func (p *epollProxy) release(c *epConn) {
	if !c.open {
		return
	}
	c.open = false
	unix.Close(c.fd)
	p.conns[c.fd] = nil
	c.peer = nil
	p.free = append(p.free, c)
}

func (p *epollProxy) closeUp(u *epConn) {
	if !u.open {
		return
	}
	if u.inPool {
		pool := p.pools[u.backend]
		for i, x := range pool {
			if x == u {
				pool[i] = pool[len(pool)-1]
				p.pools[u.backend] = pool[:len(pool)-1]
				break
			}
		}
		u.inPool = false
	}
	if c := u.peer; c != nil {
		c.peer = nil
	}
	p.release(u)
}

func (p *epollProxy) closeClient(c *epConn) {
	if !c.open {
		return
	}
	if u := c.peer; u != nil {
		u.peer = nil
		p.closeUp(u) // mid-exchange: the upstream connection cannot be reused
	}
	p.release(c)
}

// refuse writes a canned answer (best effort) and closes the client.
func (p *epollProxy) refuse(c *epConn, msg []byte) {
	rawWrite(c.fd, msg)
	p.closeClient(c)
}

// failUp ends an exchange whose upstream broke: 502 if nothing was sent yet.
func (p *epollProxy) failUp(u *epConn) {
	c, sent := u.peer, u.sentAny
	p.closeUp(u)
	switch {
	case c == nil:
	case sent:
		p.closeClient(c)
	default:
		p.refuse(c, resp502)
	}
}

func (p *epollProxy) accept() {
	for range 64 {
		fd, _, err := unix.Accept4(p.lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			return
		}
		unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		p.newConn(fd, false, unix.EPOLLIN)
	}
}

func (p *epollProxy) onWritable(c *epConn) {
	if c.upstream && c.connecting {
		if v, err := unix.GetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || v != 0 {
			p.failUp(c)
			return
		}
		c.connecting = false
		p.setMask(c, unix.EPOLLIN)
	}
	src := c.peer
	if src == nil || !src.pending {
		return
	}
	if !p.flush(src) || src.pending {
		return
	}
	p.setMask(c, unix.EPOLLIN)
	p.setMask(src, unix.EPOLLIN)
	if src.upstream {
		p.upFlushed(src)
	} else {
		p.clientFlushed(src)
	}
}

// flush writes src's pending bytes to its peer; false when the exchange was torn down.
func (p *epollProxy) flush(src *epConn) bool {
	dst := src.peer
	if dst.connecting {
		p.setMask(src, 0) // the request waits for the connect (EPOLLOUT is registered)
		return true
	}
	nw, e := rawWrite(dst.fd, src.buf[src.wOff:src.wEnd])
	if e != 0 && e != syscall.EAGAIN {
		p.broken(dst)
		return false
	}
	if nw > 0 {
		src.wOff += nw
	}
	if src.wOff == src.wEnd {
		src.pending = false
		return true
	}
	p.setMask(dst, unix.EPOLLIN|unix.EPOLLOUT) // wait for room, and stop reading src meanwhile
	p.setMask(src, 0)
	return true
}

func (p *epollProxy) clientRead(c *epConn) {
	if c.pending {
		return
	}
	if c.n == len(c.buf) {
		switch {
		case c.start > 0:
			c.n = copy(c.buf, c.buf[c.start:c.n])
			c.start = 0
		case c.rs == reqHead:
			p.refuse(c, resp431)
			return
		default: // pipelined bytes fill the buffer while an answer is in flight
			c.stalled = true
			p.setMask(c, c.mask&^unix.EPOLLIN) // still writable, for the answer
			return
		}
	}
	nr, e := rawRead(c.fd, c.buf[c.n:])
	if e == syscall.EAGAIN {
		return
	}
	if e != 0 || nr == 0 {
		p.closeClient(c)
		return
	}
	c.n += nr
	p.clientProcess(c)
}

func (p *epollProxy) clientProcess(c *epConn) {
	for c.open && !c.pending {
		switch c.rs {
		case reqHead:
			if !p.startRequest(c) {
				return
			}
		case reqBody:
			avail := int64(c.n - c.start)
			if avail == 0 {
				return
			}
			k := min(avail, c.remain)
			c.remain -= k
			if c.remain == 0 {
				c.rs = reqWait
			}
			if !p.sendReq(c, int(k)) {
				return
			}
		default: // reqWait: later bytes (pipelined requests) wait in the buffer
			return
		}
	}
}

// startRequest binds the request whose head starts at c.start to an upstream and sends what
// of it is buffered; false when there is nothing more to do until the next event.
func (p *epollProxy) startRequest(c *epConn) bool {
	data := c.buf[c.start:c.n]
	hl := bytes.Index(data, crlf2)
	if hl < 0 {
		if c.start == 0 && c.n == len(c.buf) {
			p.refuse(c, resp431)
		}
		return false
	}
	hl += 4
	head, ok := parseHead(data[:hl], false)
	switch {
	case !ok:
		p.refuse(c, resp400)
		return false
	case head.chunked:
		p.refuse(c, resp501)
		return false
	}
	u := p.upstreamConn()
	if u == nil {
		p.refuse(c, resp502)
		return false
	}
	c.peer, u.peer = u, c
	c.closeAfter, c.isHead = head.close, head.isHead
	cl := max(head.length, 0)
	k := hl + int(min(cl, int64(len(data)-hl)))
	c.remain = cl - int64(k-hl)
	c.rs = reqBody
	if c.remain == 0 {
		c.rs = reqWait
	}
	return p.sendReq(c, k)
}

// sendReq forwards c.buf[c.start:c.start+k] to the bound upstream.
func (p *epollProxy) sendReq(c *epConn, k int) bool {
	c.wOff, c.wEnd = c.start, c.start+k
	c.start += k
	c.pending = true
	if !p.flush(c) {
		return false
	}
	if !c.pending && c.start == c.n {
		c.start, c.n = 0, 0
	}
	return true
}

func (p *epollProxy) clientFlushed(c *epConn) {
	if c.start == c.n {
		c.start, c.n = 0, 0
	}
	p.clientProcess(c)
}

// upstreamConn is a pooled connection to the next upstream, or a new one (connecting).
func (p *epollProxy) upstreamConn() *epConn {
	b := p.rr % len(p.backends)
	p.rr++
	if pool := p.pools[b]; len(pool) > 0 {
		u := pool[len(pool)-1]
		p.pools[b] = pool[:len(pool)-1]
		u.inPool = false
		return u
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	if err := unix.Connect(fd, &p.backends[b]); err != nil && err != unix.EINPROGRESS {
		unix.Close(fd)
		return nil
	}
	u := p.newConn(fd, true, unix.EPOLLIN|unix.EPOLLOUT)
	u.backend, u.connecting = b, true
	return u
}

func (p *epollProxy) upRead(u *epConn) {
	switch {
	case u.peer == nil: // idle in the pool: readable means closed (or junk)
		p.closeUp(u)
		return
	case u.connecting: // an error or hang-up while connecting
		p.onWritable(u)
		return
	case u.pending:
		return
	case u.n == len(u.buf): // an answer head larger than the buffer
		p.failUp(u)
		return
	}
	nr, e := rawRead(u.fd, u.buf[u.n:])
	if e == syscall.EAGAIN {
		return
	}
	if e != 0 || nr == 0 {
		if u.ms == respToClose && e == 0 { // a body delimited by the close: done
			u.upClose, u.peer.closeAfter = true, true
			p.finish(u.peer, u)
			return
		}
		p.failUp(u)
		return
	}
	u.n += nr
	p.upProcess(u)
}

// upProcess passes on what the upstream sent, noting where its answer ends.
func (p *epollProxy) upProcess(u *epConn) {
	from, end := 0, -1
	if u.ms == respHead {
		hl := bytes.Index(u.buf[:u.n], crlf2)
		if hl < 0 {
			return // wait for the rest of the head
		}
		hl += 4
		head, ok := parseHead(u.buf[:hl], true)
		if !ok || head.status < 200 { // 1xx (100-continue, upgrades) are not handled
			p.failUp(u)
			return
		}
		u.upClose = head.close
		switch {
		case u.peer.isHead || head.status == 204 || head.status == 304:
			u.ms = respNone
		case head.chunked:
			u.ms, u.chunks = respChunked, chunkScanner{}
		case head.length >= 0:
			u.ms, u.bodyRemain = respLength, head.length
		default:
			u.ms = respToClose
		}
		from = hl
	}
	switch u.ms {
	case respNone:
		end = from
	case respLength:
		k := min(int64(u.n-from), u.bodyRemain)
		u.bodyRemain -= k
		if u.bodyRemain == 0 {
			end = from + int(k)
		}
	case respChunked:
		if e := u.chunks.scan(u.buf[from:u.n]); e >= 0 {
			end = from + e
		}
	}
	w := u.n
	if end >= 0 {
		u.done = true
		if end < u.n { // bytes past the answer's end: the connection is not reused
			u.upClose = true
			w = end
		}
	}
	u.wOff, u.wEnd, u.pending, u.sentAny = 0, w, true, true
	if p.flush(u) && !u.pending {
		p.upFlushed(u)
	}
}

func (p *epollProxy) upFlushed(u *epConn) {
	u.n = 0
	if u.done {
		p.finish(u.peer, u)
	}
}

// finish ends an exchange: the upstream connection goes back to its pool and the client's
// next request, if buffered, starts.
func (p *epollProxy) finish(c *epConn, u *epConn) {
	c.peer, u.peer = nil, nil
	if c.rs != reqWait || c.pending { // answered before the request was all sent
		c.closeAfter, u.upClose = true, true
	}
	u.n, u.ms, u.done, u.sentAny, u.pending = 0, respHead, false, false, false
	if u.upClose {
		p.closeUp(u)
	} else {
		u.inPool = true
		p.pools[u.backend] = append(p.pools[u.backend], u)
	}
	if c.closeAfter {
		p.closeClient(c)
		return
	}
	c.rs = reqHead
	if c.stalled {
		c.stalled = false
		p.setMask(c, unix.EPOLLIN)
	}
	if c.start < c.n {
		p.clientProcess(c)
	}
}

// chunkScanner follows a chunked body across reads to find its end.
type chunkScanner struct {
	state int
	size  int64
}

const (
	csSize = iota
	csExt
	csSizeLF
	csData
	csDataCR
	csDataLF
	csTrailer
	csTrailerLine
	csEndLF
)

// scan advances over b; it returns the index just past the terminating "0\r\n", trailers and
// "\r\n", or -1 while the body goes on.
func (s *chunkScanner) scan(b []byte) int {
	for i := 0; i < len(b); i++ {
		ch := b[i]
		switch s.state {
		case csSize:
			if d, ok := hexDigit(ch); ok {
				s.size = s.size<<4 | d
			} else if ch == '\r' {
				s.state = csSizeLF
			} else {
				s.state = csExt
			}
		case csExt:
			if ch == '\r' {
				s.state = csSizeLF
			}
		case csSizeLF:
			s.state = csData
			if s.size == 0 {
				s.state = csTrailer
			}
		case csData:
			k := min(int64(len(b)-i), s.size)
			s.size -= k
			i += int(k) - 1
			if s.size == 0 {
				s.state = csDataCR
			}
		case csDataCR:
			s.state = csDataLF
		case csDataLF:
			s.state, s.size = csSize, 0
		case csTrailer:
			s.state = csTrailerLine
			if ch == '\r' {
				s.state = csEndLF
			}
		case csTrailerLine:
			if ch == '\n' {
				s.state = csTrailer
			}
		case csEndLF:
			return i + 1
		}
	}
	return -1
}

func hexDigit(ch byte) (int64, bool) {
	switch {
	case ch >= '0' && ch <= '9':
		return int64(ch - '0'), true
	case ch >= 'a' && ch <= 'f':
		return int64(ch-'a') + 10, true
	case ch >= 'A' && ch <= 'F':
		return int64(ch-'A') + 10, true
	}
	return 0, false
}

// msgHead is what the loop reads from a request's or an answer's head.
type msgHead struct {
	status  int   // answers only
	length  int64 // Content-Length; -1 when absent
	chunked bool
	close   bool // Connection: close, or HTTP/1.0
	isHead  bool // requests only: a HEAD request, whose answer has no body
}

// parseHead reads a head ending in CRLF CRLF; answer selects the status line's form.
func parseHead(h []byte, answer bool) (msgHead, bool) {
	m := msgHead{length: -1}
	i := bytes.IndexByte(h, '\n')
	if i < 0 {
		return m, false
	}
	first := bytes.TrimRight(h[:i], "\r")
	for rest := h[i+1:]; len(rest) > 0; {
		j := bytes.IndexByte(rest, '\n')
		if j < 0 {
			break
		}
		line := bytes.TrimRight(rest[:j], "\r")
		rest = rest[j+1:]
		if len(line) == 0 {
			break
		}
		k := bytes.IndexByte(line, ':')
		if k <= 0 {
			return m, false
		}
		name, v := line[:k], bytes.TrimSpace(line[k+1:])
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			n, ok := atoi(v)
			if !ok {
				return m, false
			}
			m.length = n
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			m.chunked = bytes.Contains(v, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			m.close = bytes.EqualFold(v, []byte("close"))
		}
	}
	if answer {
		return m, parseStatusLine(first, &m)
	}
	sp := bytes.IndexByte(first, ' ')
	if sp <= 0 || len(first) < 14 || !bytes.HasPrefix(first[len(first)-8:], []byte("HTTP/1.")) {
		return m, false
	}
	m.isHead = string(first[:sp]) == "HEAD"
	m.close = m.close || first[len(first)-1] == '0' // HTTP/1.0: no keep-alive here
	return m, true
}

func parseStatusLine(first []byte, m *msgHead) bool {
	if len(first) < 12 || !bytes.HasPrefix(first, []byte("HTTP/1.")) {
		return false
	}
	n, ok := atoi(first[9:12])
	m.status = int(n)
	m.close = m.close || first[7] == '0'
	return ok
}

func atoi(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var n int64
	for _, d := range b {
		if d < '0' || d > '9' {
			return 0, false
		}
		n = n*10 + int64(d-'0')
	}
	return n, true
}

// epollMain is main's branch for the subcommand.
func epollMain(args []string) {
	if err := runEpoll(args); err != nil {
		fmt.Fprintln(os.Stderr, "proxyload epoll:", err)
		os.Exit(1)
	}
}
