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

// binder answers the workload's bind(2) notifications: a bind of the task's port on the
// wildcard address or 127.0.0.1 is done on a duplicate of the program's socket, to the
// replica's own address; the kernel carries out every other bind as the program asked.
//
// Only the task's port moves. A replica's internal ports (a metrics port, a worker's
// rendezvous) keep their addresses, so its processes that dial 127.0.0.1 still find them.
// 127.0.0.1 moves with the wildcard: two replicas binding 127.0.0.1:8000 collide just the same.
type binder struct {
	listener int
	host     string
	port     int
}

// serve handles notifications until the listener fails (every filtered process is gone).
func (b *binder) serve() {
	for {
		var n seccompNotif // the kernel wants it zeroed
		if err := ioctlPtr(b.listener, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(&n)); err != nil {
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ENOENT) {
				continue // a signal, or the target died before we received
			}
			return
		}
		resp := b.handle(&n)
		// ENOENT: the target died (or its bind was interrupted) meanwhile; nothing to answer.
		_ = ioctlPtr(b.listener, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp))
	}
}

func ioctlPtr(fd int, req uint, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}

// handle decides one bind: done here (the response carries its result) or left to the kernel.
func (b *binder) handle(n *seccompNotif) seccompNotifResp {
	pass := seccompNotifResp{ID: n.ID, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
	sockfd, addrPtr, addrLen := int(int32(n.Data.Args[0])), n.Data.Args[1], n.Data.Args[2]
	if addrLen < unix.SizeofSockaddrInet4 || addrLen > unix.SizeofSockaddrAny {
		return pass
	}
	// n.Pid is the calling thread; pidfd_open wants its process. Both are looked up before
	// the id is checked: if the id is still valid then, the thread was alive all along, so
	// neither id can have been reused by another process meanwhile.
	tgid, err := threadGroup(int(n.Pid))
	if err != nil {
		return pass
	}
	pidfd, err := unix.PidfdOpen(tgid, 0)
	if err != nil {
		return pass
	}
	defer unix.Close(pidfd)
	raw, err := readTargetMem(int(n.Pid), addrPtr, int(addrLen))
	if err != nil || !b.notifValid(n.ID) {
		return pass
	}
	to, ok := b.target(raw)
	if !ok {
		return pass
	}
	fd, err := unix.PidfdGetfd(pidfd, sockfd, 0)
	if err != nil {
		return pass // not ours to reach (another user's process); the kernel decides
	}
	defer unix.Close(fd)
	if _, ok := to.(*unix.SockaddrInet6); ok {
		if only, err := unix.GetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY); err != nil || only == 1 {
			return pass // an IPv6-only socket cannot take an IPv4 address; see README
		}
	}
	resp := seccompNotifResp{ID: n.ID}
	if err := unix.Bind(fd, to); err != nil {
		var errno unix.Errno
		if !errors.As(err, &errno) {
			errno = unix.EINVAL
		}
		resp.Error = -int32(errno)
		return resp
	}
	fmt.Fprintf(os.Stderr, "ferry: bind %s moved to %s, this replica's own address\n",
		describeSockaddr(raw), netip.AddrPortFrom(netip.MustParseAddr(b.host), uint16(b.port)))
	return resp
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

// readTargetMem reads n bytes at addr in process pid's memory.
func readTargetMem(pid int, addr uint64, n int) ([]byte, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/mem")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, int64(addr)); err != nil {
		return nil, err
	}
	return buf, nil
}

// target is where a bind of raw (a struct sockaddr) goes instead, if it moves at all: a bind
// of the task's port on 0.0.0.0 or 127.0.0.1 (IPv4), or on :: or their IPv4-mapped forms
// (IPv6, the replica's address mapped).
func (b *binder) target(raw []byte) (unix.Sockaddr, bool) {
	addr, ok := parseSockaddr(raw)
	if !ok || int(addr.Port()) != b.port {
		return nil, false
	}
	ip := addr.Addr()
	if !ip.Unmap().IsUnspecified() && ip.Unmap() != netip.AddrFrom4([4]byte{127, 0, 0, 1}) {
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
