package local

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ferryserve/ferry/launcher/privnet"
)

// binder answers the workload's bind(2) and connect(2) notifications. A bind of the task's
// port on the wildcard address or loopback (0.0.0.0, 127.0.0.1, ::, ::1) is done to the
// replica's own address; so is a connect to one of those with the task's port, so that the
// replica's own processes still reach its server at localhost:8000 (SGLang's warm-up request,
// a run's `curl localhost:8000` wait loop). Other connects are left to the kernel.
//
// Every bind is done by the binder itself, on a duplicate of the program's socket, with the
// address it read, moved or not. Leaving a bind to the kernel would let it read the address
// again, and another thread of the program could have changed it meanwhile (to 0.0.0.0:8000,
// after the binder saw port 0): a replica could take the task's port on every address and
// keep the others off it. A bind is left to the kernel only when the binder cannot do it (the
// program's memory or socket out of its reach), and the replica's log says so.
//
// Only the task's port moves. A replica's internal ports (a metrics port, a worker's
// rendezvous) keep their addresses. 127.0.0.1 moves with the wildcard: two replicas binding
// 127.0.0.1:8000 collide just the same.
type binder struct {
	listener int
	host     string
	port     int
	// private puts the serving port in Ferry's private network (supervise_privnet_linux.go):
	// binds of it, and the replica's own connects to it, get a socket made there in place of
	// the program's. Binds of the replica's own address with the task's port go there too.
	private bool
	// net makes those sockets; nil when the helper could not be reached, and the serving port
	// then cannot be bound (the log says why).
	net *privnet.Client
	// recv receives the next notification; nil is the listener's ioctl (tests end the loop
	// through it).
	recv func(*seccompNotif) error
}

// maxSockaddrLen is sizeof(struct sockaddr_storage): the kernel refuses a longer address.
const maxSockaddrLen = 128

// serve handles notifications until the listener fails, then closes it: the kernel then
// fails the workload's binds and connects (ENOSYS) instead of leaving them waiting for an
// answer that would never come. Every connect the replica makes waits for it, so the common
// case, a call left to the kernel, is answered at once, with one read of the target's memory.
func (b *binder) serve() {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "ferry: the bind supervisor failed (%v): the program's binds and connects fail from now on\n", r)
		}
		_ = unix.Close(b.listener)
	}()
	// Switch straight to the target after answering (Linux 6.6+; older kernels refuse, fine).
	// This ioctl takes the flags themselves, not a pointer to them.
	_, _, _ = unix.Syscall(unix.SYS_IOCTL, uintptr(b.listener), seccompIoctlNotifSetFlags, unix.SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP)
	recv := b.recv
	if recv == nil {
		recv = func(n *seccompNotif) error {
			return ioctlPtr(b.listener, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(n))
		}
	}
	for {
		var n seccompNotif // the kernel wants it zeroed
		if err := recv(&n); err != nil {
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ENOENT) {
				continue // a signal, or the target died before we received
			}
			if !errors.Is(err, unix.ENOTCONN) { // ENOTCONN: every filtered process is gone
				fmt.Fprintf(os.Stderr, "ferry: the bind supervisor stopped (%v): the program's binds and connects fail from now on\n", err)
			}
			return
		}
		if n.Data.Nr == unix.SYS_BIND {
			b.send(b.bind(&n))
			continue
		}
		raw, to, ok := b.decide(&n)
		if !ok {
			b.send(seccompNotifResp{ID: n.ID, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE})
			continue
		}
		go func() { b.send(b.carryOut(&n, raw, to)) }() // a blocking connect may wait
	}
}

// send answers a notification. ENOENT, the target died (or its call was interrupted)
// meanwhile, needs no answer.
func (b *binder) send(resp seccompNotifResp) {
	_ = ioctlPtr(b.listener, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp))
}

func ioctlPtr(fd int, req uint, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}

// passThrough leaves n's call to the kernel because the binder could not do it, and says so in
// the replica's log, unless the call is gone anyway (the target died or was interrupted).
func (b *binder) passThrough(n *seccompNotif, why error) seccompNotifResp {
	if b.notifValid(n.ID) {
		call := "bind"
		if n.Data.Nr == unix.SYS_CONNECT {
			call = "connect"
		}
		fmt.Fprintf(os.Stderr, "ferry: %s of thread %d left to the kernel as the program asked: %v\n", call, n.Pid, why)
	}
	return seccompNotifResp{ID: n.ID, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
}

// decide reads the address of n's connect and says where it goes instead, if anywhere.
// Leaving a connect to the kernel is always safe, so what is read is checked only before
// acting on it (socketOf).
func (b *binder) decide(n *seccompNotif) ([]byte, unix.Sockaddr, bool) {
	addrPtr, addrLen := n.Data.Args[1], n.Data.Args[2]
	if addrLen < unix.SizeofSockaddrInet4 || addrLen > unix.SizeofSockaddrAny {
		return nil, nil, false
	}
	raw, err := readTargetMem(int(n.Pid), addrPtr, int(addrLen))
	if err != nil {
		b.passThrough(n, fmt.Errorf("read its address: %w", err))
		return nil, nil, false
	}
	to, ok := b.target(raw)
	return raw, to, ok
}

// bind does n's bind itself, on a duplicate of the target's socket, with the address read
// once from the target's memory: moved to the replica's own address when it is the task's
// port on the wildcard or loopback, else as it is.
func (b *binder) bind(n *seccompNotif) seccompNotifResp {
	fail := func(errno unix.Errno) seccompNotifResp { return seccompNotifResp{ID: n.ID, Error: -int32(errno)} }
	addrPtr, addrLen := n.Data.Args[1], n.Data.Args[2]
	if addrLen > maxSockaddrLen {
		return fail(unix.EINVAL)
	}
	raw := []byte{}
	if addrLen > 0 {
		var err error
		if raw, err = readTargetMem(int(n.Pid), addrPtr, int(addrLen)); errors.Is(err, unix.EFAULT) {
			return fail(unix.EFAULT) // as the kernel would answer
		} else if err != nil {
			return b.passThrough(n, fmt.Errorf("read its address: %w", err))
		}
	}
	fd, err := b.socketOf(n)
	if errors.Is(err, unix.EBADF) {
		return fail(unix.EBADF) // no such descriptor in the program, as the kernel would answer
	}
	if err != nil {
		return b.passThrough(n, fmt.Errorf("reach its socket: %w", err))
	}
	defer unix.Close(fd)
	addr, moved, errno := b.bindAddress(fd, int(n.Pid), raw)
	if errno != 0 {
		return fail(errno)
	}
	if moved && b.private && streamSocket(fd) {
		return b.bindPrivate(n, fd, raw, addr)
	}
	if err := bindAs(fd, int(n.Pid), addr); err != nil {
		errno := unix.EINVAL
		errors.As(err, &errno)
		return fail(errno)
	}
	if moved {
		fmt.Fprintf(os.Stderr, "ferry: bind %s moved to %s, this replica's own address\n",
			describeSockaddr(raw), netip.AddrPortFrom(netip.MustParseAddr(b.host), uint16(b.port)))
	}
	return seccompNotifResp{ID: n.ID}
}

// bindAddress is the address the binder binds fd to for raw: the replica's own address in
// place of the task's port on the wildcard or loopback, a relative Unix socket path made
// absolute through the target's working directory (the binder's own differs), else raw.
func (b *binder) bindAddress(fd, tid int, raw []byte) ([]byte, bool, unix.Errno) {
	if len(raw) >= unix.SizeofSockaddrInet4 && binary.NativeEndian.Uint16(raw) == unix.AF_UNSPEC {
		// An AF_INET socket takes AF_UNSPEC with INADDR_ANY as AF_INET (inet_bind): so does
		// the binder, or 0.0.0.0:8000 would go through unmoved that way.
		if domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN); err == nil && domain == unix.AF_INET {
			raw = append([]byte(nil), raw...)
			binary.NativeEndian.PutUint16(raw, unix.AF_INET)
		}
	}
	if to, ok := b.target(raw); ok {
		if _, v6 := to.(*unix.SockaddrInet6); v6 {
			if only, err := unix.GetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY); err != nil || only == 1 {
				return raw, false, 0 // an IPv6-only socket cannot take an IPv4 address; see docs/yaml.md, the `ports` field
			}
		}
		return sockaddrBytes(to), true, 0
	}
	if len(raw) > 2 && binary.NativeEndian.Uint16(raw) == unix.AF_UNIX && raw[2] != 0 && raw[2] != '/' {
		path, _, _ := strings.Cut(string(raw[2:]), "\x00")
		abs := "/proc/" + strconv.Itoa(tid) + "/cwd/" + path
		if len(abs) >= len(unix.RawSockaddrUnix{}.Path) {
			return nil, false, unix.ENAMETOOLONG
		}
		out := make([]byte, 2, 2+len(abs)+1)
		binary.NativeEndian.PutUint16(out, unix.AF_UNIX)
		return append(append(out, abs...), 0), false, 0
	}
	return raw, false, 0
}

// sockaddrBytes is the struct sockaddr of the replica's address a bind moves to.
func sockaddrBytes(to unix.Sockaddr) []byte {
	switch sa := to.(type) {
	case *unix.SockaddrInet4:
		out := make([]byte, unix.SizeofSockaddrInet4)
		binary.NativeEndian.PutUint16(out, unix.AF_INET)
		binary.BigEndian.PutUint16(out[2:], uint16(sa.Port))
		copy(out[4:8], sa.Addr[:])
		return out
	case *unix.SockaddrInet6:
		out := make([]byte, unix.SizeofSockaddrInet6)
		binary.NativeEndian.PutUint16(out, unix.AF_INET6)
		binary.BigEndian.PutUint16(out[2:], uint16(sa.Port))
		copy(out[8:24], sa.Addr[:])
		return out
	}
	return nil
}

// bindAs binds fd to addr, a Unix socket path with thread tid's umask (the file's mode is the
// binder's umask otherwise; a program that narrows its umask to keep its socket private must
// get what it asked). Binds are served one at a time, so the binder's umask is its own
// meanwhile.
func bindAs(fd, tid int, addr []byte) error {
	if len(addr) > 2 && binary.NativeEndian.Uint16(addr) == unix.AF_UNIX && addr[2] != 0 {
		mask, err := umaskOf(tid)
		if err != nil {
			return unix.EACCES
		}
		old := unix.Umask(mask)
		defer unix.Umask(old)
	}
	return rawBind(fd, addr)
}

// umaskOf is thread tid's umask, from /proc/TID/status (Linux 4.7+).
func umaskOf(tid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Umask:"); ok {
			m, err := strconv.ParseInt(strings.TrimSpace(v), 8, 32)
			return int(m), err
		}
	}
	return 0, fmt.Errorf("no Umask in /proc/%d/status", tid)
}

// rawBind is bind(2) with a struct sockaddr as bytes, whatever its family.
func rawBind(fd int, addr []byte) error {
	var p unsafe.Pointer
	if len(addr) > 0 {
		p = unsafe.Pointer(&addr[0])
	}
	_, _, errno := unix.Syscall(unix.SYS_BIND, uintptr(fd), uintptr(p), uintptr(len(addr)))
	runtime.KeepAlive(addr)
	if errno != 0 {
		return errno
	}
	return nil
}

// carryOut does n's connect, whose address raw moves to to, on a duplicate of the target's
// socket; the response carries its result (or leaves the call to the kernel if that cannot be
// done).
func (b *binder) carryOut(n *seccompNotif, raw []byte, to unix.Sockaddr) seccompNotifResp {
	fd, err := b.socketOf(n)
	if err != nil {
		return b.passThrough(n, fmt.Errorf("reach its socket: %w", err))
	}
	defer unix.Close(fd)
	if _, ok := to.(*unix.SockaddrInet6); ok {
		if only, err := unix.GetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY); err != nil || only == 1 {
			// an IPv6-only socket cannot reach an IPv4 address; see docs/yaml.md, the `ports` field
			return seccompNotifResp{ID: n.ID, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
		}
	}
	if b.private && streamSocket(fd) {
		return b.connectPrivate(n, fd, to)
	}
	resp := seccompNotifResp{ID: n.ID}
	// EISCONN: a connect restarted after we made it (a kernel without WAIT_KILLABLE_RECV) is
	// connected where it should be.
	if err := unix.Connect(fd, to); err != nil && !errors.Is(err, unix.EISCONN) {
		var errno unix.Errno
		if !errors.As(err, &errno) {
			errno = unix.EINVAL
		}
		resp.Error = -int32(errno)
	}
	return resp
}

// socketOf duplicates the socket that n's call is about, out of the calling process.
func (b *binder) socketOf(n *seccompNotif) (int, error) {
	// n.Pid is the calling thread; pidfd_open wants its process. The memory decide read, the
	// thread group and the pidfd all come before the id is checked: if the id is still valid
	// then, the thread was alive all along, so no id was reused by another process meanwhile.
	tgid, err := threadGroup(int(n.Pid))
	if err != nil {
		return -1, err
	}
	pidfd, err := unix.PidfdOpen(tgid, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pidfd)
	if !b.notifValid(n.ID) {
		return -1, unix.ESRCH
	}
	return unix.PidfdGetfd(pidfd, int(int32(n.Data.Args[0])), 0)
}

func (b *binder) notifValid(id uint64) bool {
	return ioctlPtr(b.listener, seccompIoctlNotifIDValid, unsafe.Pointer(&id)) == nil
}

// threadGroup is the process (thread group id) of thread tid.
func threadGroup(tid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Tgid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("no Tgid in /proc/%d/status", tid)
}

// readTargetMem reads n bytes at addr in thread tid's memory (one system call; the same
// access check as /proc/TID/mem).
func readTargetMem(tid int, addr uint64, n int) ([]byte, error) {
	buf := make([]byte, n)
	local := []unix.Iovec{{Base: &buf[0]}}
	local[0].SetLen(n)
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: n}}
	got, err := unix.ProcessVMReadv(tid, local, remote, 0)
	if err != nil {
		return nil, err
	}
	if got != n {
		return nil, unix.EFAULT
	}
	return buf, nil
}

// target is where a bind of or connect to raw (a struct sockaddr) goes instead, if it moves
// at all: the task's port on 0.0.0.0 or 127.0.0.1 (IPv4), or on ::, ::1 or the IPv4-mapped
// forms (IPv6, the replica's address mapped); in the private network also on the replica's own
// address, which there is reached only on a private socket (supervise_privnet_linux.go).
func (b *binder) target(raw []byte) (unix.Sockaddr, bool) {
	addr, ok := parseSockaddr(raw)
	if !ok || int(addr.Port()) != b.port {
		return nil, false
	}
	ip := addr.Addr()
	own, err := netip.ParseAddr(b.host)
	if err != nil || !own.Is4() {
		return nil, false
	}
	// In the private network the replica's own address on the host's loopback moves too: a
	// program that binds $FERRY_HOST must not listen where every user reaches it.
	ownBind := b.private && ip.Unmap() == own
	if !ownBind && !ip.Unmap().IsUnspecified() && ip.Unmap() != netip.AddrFrom4([4]byte{127, 0, 0, 1}) && ip != netip.IPv6Loopback() {
		return nil, false
	}
	if ip.Is4() {
		return &unix.SockaddrInet4{Port: b.port, Addr: own.As4()}, true
	}
	return &unix.SockaddrInet6{Port: b.port, Addr: own.As16()}, true // ::ffff:127.x.y.z
}

// parseSockaddr reads an AF_INET or AF_INET6 struct sockaddr; ok is false for other families.
func parseSockaddr(raw []byte) (netip.AddrPort, bool) {
	if len(raw) < 2 {
		return netip.AddrPort{}, false
	}
	switch binary.NativeEndian.Uint16(raw) {
	case unix.AF_INET:
		if len(raw) < unix.SizeofSockaddrInet4 {
			return netip.AddrPort{}, false
		}
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(raw[4:8])), binary.BigEndian.Uint16(raw[2:4])), true
	case unix.AF_INET6:
		// The kernel takes the 24-byte RFC 2133 form, without sin6_scope_id.
		if len(raw) < 24 {
			return netip.AddrPort{}, false
		}
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(raw[8:24])), binary.BigEndian.Uint16(raw[2:4])), true
	}
	return netip.AddrPort{}, false
}

func describeSockaddr(raw []byte) string {
	if a, ok := parseSockaddr(raw); ok {
		return a.String()
	}
	return "?"
}
