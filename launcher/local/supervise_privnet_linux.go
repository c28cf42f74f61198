package local

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The serving port in Ferry's private network (launcher/privnet). A supervised replica whose
// address is in privnet.Range gets, for the bind of its serving port, a socket made in the
// private network in place of its own: the binder asks the helper for one of the same family,
// carries over what the program set on its socket (blocking mode, SO_REUSEADDR, SO_REUSEPORT,
// SO_KEEPALIVE, TCP_NODELAY, IPV6_V6ONLY), binds it to the replica's address there and installs
// it under the program's descriptor number (SECCOMP_IOCTL_NOTIF_ADDFD with
// SECCOMP_ADDFD_FLAG_SETFD, which closes the program's socket), with the program's
// close-on-exec flag. The program's listen and accepts then use it as its own. Only that one
// socket moves: the replica's other ports and its outbound connections (model downloads) stay
// on the host's network. The replica's own connects to its serving port (a `curl
// localhost:8000` wait loop, SGLang's warm-up) get a private socket the same way, connected
// to its address there.

// seccompNotifAddfd is struct seccomp_notif_addfd.
type seccompNotifAddfd struct {
	ID         uint64
	Flags      uint32
	SrcFD      uint32
	NewFD      uint32
	NewFDFlags uint32
}

// streamSocket reports whether fd is a SOCK_STREAM socket: only those go to the private
// network (a UDP socket on the task's port is not the serving port).
func streamSocket(fd int) bool {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	return err == nil && typ == unix.SOCK_STREAM
}

// bindPrivate does n's bind of the serving port (raw, moved to addr) on a private socket put in
// place of the program's socket, whose duplicate is fd.
func (b *binder) bindPrivate(n *seccompNotif, fd int, raw, addr []byte) seccompNotifResp {
	priv, errno := b.privateSocket(fd)
	if errno != 0 {
		return seccompNotifResp{ID: n.ID, Error: -int32(errno)}
	}
	defer unix.Close(priv)
	if err := rawBind(priv, addr); err != nil {
		errno := unix.EINVAL
		errors.As(err, &errno)
		return seccompNotifResp{ID: n.ID, Error: -int32(errno)}
	}
	if errno := b.install(n, priv); errno != 0 {
		return seccompNotifResp{ID: n.ID, Error: -int32(errno)}
	}
	fmt.Fprintf(os.Stderr, "ferry: bind %s moved to %s in Ferry's private network, which only Ferry reaches\n",
		describeSockaddr(raw), netip.AddrPortFrom(netip.MustParseAddr(b.host), uint16(b.port)))
	return seccompNotifResp{ID: n.ID}
}

// connectPrivate does n's connect to the serving port on a private socket put in place of the
// program's socket, whose duplicate is fd: the result, EINPROGRESS for a non-blocking socket,
// is the program's.
func (b *binder) connectPrivate(n *seccompNotif, fd int, to unix.Sockaddr) seccompNotifResp {
	priv, errno := b.privateSocket(fd)
	if errno != 0 {
		return seccompNotifResp{ID: n.ID, Error: -int32(errno)}
	}
	defer unix.Close(priv)
	if errno := b.install(n, priv); errno != 0 {
		return seccompNotifResp{ID: n.ID, Error: -int32(errno)}
	}
	resp := seccompNotifResp{ID: n.ID}
	if err := unix.Connect(priv, to); err != nil && !errors.Is(err, unix.EISCONN) {
		errno := unix.EINVAL
		errors.As(err, &errno)
		resp.Error = -int32(errno)
	}
	return resp
}

// privateSocket is a socket made in the private network like the program's socket fd: same
// family, blocking mode and options. The errno is the call's when there is none.
func (b *binder) privateSocket(fd int) (int, unix.Errno) {
	if b.net == nil {
		return -1, unix.EACCES // the supervisor said at start why (supervise)
	}
	domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return -1, unix.EBADF
	}
	priv, err := b.net.Socket(domain)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ferry: the serving port cannot be bound: %v\n", err)
		return -1, unix.EACCES
	}
	if err := copySocketOptions(fd, priv, domain); err != nil {
		_ = unix.Close(priv)
		fmt.Fprintf(os.Stderr, "ferry: the serving port cannot be bound: carry the program's socket options over: %v\n", err)
		return -1, unix.EINVAL
	}
	return priv, 0
}

// copySocketOptions sets on to what a program may have set on from before a bind or connect.
func copySocketOptions(from, to, domain int) error {
	type opt struct{ level, name int }
	opts := []opt{{unix.SOL_SOCKET, unix.SO_REUSEADDR}, {unix.SOL_SOCKET, unix.SO_REUSEPORT},
		{unix.SOL_SOCKET, unix.SO_KEEPALIVE}, {unix.IPPROTO_TCP, unix.TCP_NODELAY}}
	if domain == unix.AF_INET6 {
		opts = append(opts, opt{unix.IPPROTO_IPV6, unix.IPV6_V6ONLY})
	}
	for _, o := range opts {
		v, err := unix.GetsockoptInt(from, o.level, o.name)
		if err != nil {
			return err
		}
		if err := unix.SetsockoptInt(to, o.level, o.name, v); err != nil {
			return err
		}
	}
	fl, err := unix.FcntlInt(uintptr(from), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	return unix.SetNonblock(to, fl&unix.O_NONBLOCK != 0)
}

// install puts priv in the calling process under the descriptor number n's call names, in
// place of what is there, with its close-on-exec flag.
func (b *binder) install(n *seccompNotif, priv int) unix.Errno {
	target := int(int32(n.Data.Args[0]))
	var flags uint32
	if closeOnExec(int(n.Pid), target) {
		flags = unix.O_CLOEXEC
	}
	add := seccompNotifAddfd{ID: n.ID, Flags: unix.SECCOMP_ADDFD_FLAG_SETFD, SrcFD: uint32(priv), NewFD: uint32(target), NewFDFlags: flags}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(b.listener), unix.SECCOMP_IOCTL_NOTIF_ADDFD, uintptr(unsafe.Pointer(&add)))
	if errno != 0 {
		if errno != unix.ENOENT { // ENOENT: the call is gone (the thread died or was interrupted)
			fmt.Fprintf(os.Stderr, "ferry: put the private socket in place of descriptor %d: %v\n", target, errno)
		}
		return errno
	}
	return 0
}

// closeOnExec reports whether thread tid's descriptor fd is close-on-exec (its fdinfo's flags
// hold O_CLOEXEC then). Unknown is false, as a socket's default.
func closeOnExec(tid, fd int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "flags:"); ok {
			f, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			return err == nil && f&unix.O_CLOEXEC != 0
		}
	}
	return false
}

// privateSupported says why this kernel cannot keep serving ports in the private network, or
// nil: SECCOMP_ADDFD_FLAG_SETFD came with Linux 5.9.
func privateSupported() error {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return err
	}
	release := unix.ByteSliceToString(u.Release[:])
	var major, minor int
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		return fmt.Errorf("kernel release %q unreadable: %w", release, err)
	}
	if major < 5 || major == 5 && minor < 9 {
		return fmt.Errorf("kernel %s lacks SECCOMP_ADDFD_FLAG_SETFD (Linux 5.9+)", release)
	}
	return nil
}
