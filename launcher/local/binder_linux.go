package local

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// binder answers the workload's bind(2) and connect(2) notifications. A bind of the task's
// port on the wildcard address or loopback (0.0.0.0, 127.0.0.1, ::, ::1) is done on a duplicate
// of the program's socket, to the replica's own address; so is a connect to one of those with
// the task's port, so that the replica's own processes still reach its server at
// localhost:8000 (SGLang's warm-up request, a run's `curl localhost:8000` wait loop). The
// kernel carries out every other bind and connect as the program asked.
//
// Only the task's port moves. A replica's internal ports (a metrics port, a worker's
// rendezvous) keep their addresses. 127.0.0.1 moves with the wildcard: two replicas binding
// 127.0.0.1:8000 collide just the same.
type binder struct {
	listener int
	host     string
	port     int
}

// serve handles notifications until the listener fails (every filtered process is gone).
// Every connect the replica makes waits for it, so the common case, a call left to the kernel,
// is answered at once, with one read of the target's memory.
func (b *binder) serve() {
	// Switch straight to the target after answering (Linux 6.6+; older kernels refuse, fine).
	// This ioctl takes the flags themselves, not a pointer to them.
	_, _, _ = unix.Syscall(unix.SYS_IOCTL, uintptr(b.listener), seccompIoctlNotifSetFlags, unix.SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP)
	for {
		var n seccompNotif // the kernel wants it zeroed
		if err := ioctlPtr(b.listener, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(&n)); err != nil {
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ENOENT) {
				continue // a signal, or the target died before we received
			}
			return
		}
		raw, to, ok := b.decide(&n)
		switch {
		case !ok:
			b.send(seccompNotifResp{ID: n.ID, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE})
		case n.Data.Nr == unix.SYS_CONNECT:
			go func() { b.send(b.carryOut(&n, raw, to)) }() // a blocking connect may wait
		default:
			b.send(b.carryOut(&n, raw, to))
		}
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

// decide reads the address of n's bind or connect and says where it goes instead, if anywhere.
// Leaving a call to the kernel is always safe, so what is read is checked only before acting
// on it (socketOf).
func (b *binder) decide(n *seccompNotif) ([]byte, unix.Sockaddr, bool) {
	addrPtr, addrLen := n.Data.Args[1], n.Data.Args[2]
	if addrLen < unix.SizeofSockaddrInet4 || addrLen > unix.SizeofSockaddrAny {
		return nil, nil, false
	}
	raw, err := readTargetMem(int(n.Pid), addrPtr, int(addrLen))
	if err != nil {
		return nil, nil, false
	}
	to, ok := b.target(raw)
	return raw, to, ok
}

// carryOut does n's call, whose address raw moves to to, on a duplicate of the target's socket;
// the response carries its result (or leaves the call to the kernel if that cannot be done).
func (b *binder) carryOut(n *seccompNotif, raw []byte, to unix.Sockaddr) seccompNotifResp {
	pass := seccompNotifResp{ID: n.ID, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
	fd, err := b.socketOf(n)
	if err != nil {
		return pass // not ours to reach (another user's process); the kernel decides
	}
	defer unix.Close(fd)
	if _, ok := to.(*unix.SockaddrInet6); ok {
		if only, err := unix.GetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY); err != nil || only == 1 {
			return pass // an IPv6-only socket cannot take an IPv4 address; see README
		}
	}
	op := unix.Bind
	if n.Data.Nr == unix.SYS_CONNECT {
		op = unix.Connect
	}
	resp := seccompNotifResp{ID: n.ID}
	// EISCONN: a connect restarted after we made it (a kernel without WAIT_KILLABLE_RECV) is
	// connected where it should be.
	if err := op(fd, to); err != nil && !(n.Data.Nr == unix.SYS_CONNECT && errors.Is(err, unix.EISCONN)) {
		var errno unix.Errno
		if !errors.As(err, &errno) {
			errno = unix.EINVAL
		}
		resp.Error = -int32(errno)
		return resp
	}
	if n.Data.Nr == unix.SYS_BIND {
		fmt.Fprintf(os.Stderr, "ferry: bind %s moved to %s, this replica's own address\n",
			describeSockaddr(raw), netip.AddrPortFrom(netip.MustParseAddr(b.host), uint16(b.port)))
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
// forms (IPv6, the replica's address mapped).
func (b *binder) target(raw []byte) (unix.Sockaddr, bool) {
	addr, ok := parseSockaddr(raw)
	if !ok || int(addr.Port()) != b.port {
		return nil, false
	}
	ip := addr.Addr()
	if !ip.Unmap().IsUnspecified() && ip.Unmap() != netip.AddrFrom4([4]byte{127, 0, 0, 1}) && ip != netip.IPv6Loopback() {
		return nil, false
	}
	own, err := netip.ParseAddr(b.host)
	if err != nil || !own.Is4() {
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
