package local

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ferryserve/ferry/launcher/privnet"
)

// What golang.org/x/sys/unix lacks from include/uapi/linux/seccomp.h.
type (
	// seccompData is struct seccomp_data.
	seccompData struct {
		Nr                 int32
		Arch               uint32
		InstructionPointer uint64
		Args               [6]uint64
	}
	// seccompNotif is struct seccomp_notif.
	seccompNotif struct {
		ID    uint64
		Pid   uint32
		Flags uint32
		Data  seccompData
	}
	// seccompNotifResp is struct seccomp_notif_resp.
	seccompNotifResp struct {
		ID    uint64
		Val   int64
		Error int32
		Flags uint32
	}
)

const (
	// seccompIoctlNotifIDValid is SECCOMP_IOCTL_NOTIF_ID_VALID, SECCOMP_IOW(2, __u64).
	seccompIoctlNotifIDValid = 0x40082102
	// seccompIoctlNotifSetFlags is SECCOMP_IOCTL_NOTIF_SET_FLAGS, SECCOMP_IOW(4, __u64).
	seccompIoctlNotifSetFlags = 0x40082104
)

// superviseSupported: the provider starts replicas under Supervise only where it works.
const superviseSupported = true

// supervisorFD is the workload stage's end of the socketpair that carries the listener.
const supervisorFD = 3

// auditArch is the seccomp_data.arch of this binary's system calls; 0 where the filter is not
// written for the architecture (the replica then runs unsupervised).
func auditArch() uint32 {
	switch runtime.GOARCH {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64
	}
	return 0
}

// Supervise is `ferry local-supervise`: args are what superviseArgs made. It returns only on
// a bad command line; otherwise it ends the process as the workload ended.
func Supervise(args []string) int {
	c, err := parseSuperviseArgs(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferry "+SuperviseCommand+":", err)
		return 2
	}
	if c.workload {
		runWorkload(c.argv)
		return 127 // runWorkload execs or exits
	}
	supervise(c)
	return 127
}

// runWorkload installs the bind filter, hands its listener to the supervisor on supervisorFD
// and execs argv. A filter that cannot be installed is reported instead, and argv runs anyway.
func runWorkload(argv []string) {
	// The filter applies to the thread that installs it (and, with TSYNC, the others); exec
	// from that same thread keeps it for argv and everything argv starts.
	runtime.LockOSThread()
	listener, err := installBindFilter()
	if err != nil {
		_, _ = unix.Write(supervisorFD, []byte(err.Error()))
	} else {
		_ = unix.Sendmsg(supervisorFD, []byte{0}, unix.UnixRights(listener), nil, 0)
		_ = unix.Close(listener)
	}
	_ = unix.Close(supervisorFD)
	path, err := exec.LookPath(argv[0])
	if err == nil {
		err = syscall.Exec(path, argv, os.Environ())
	}
	fmt.Fprintf(os.Stderr, "ferry: run %s: %v\n", argv[0], err)
	os.Exit(127)
}

// installBindFilter installs a filter that hands bind(2) and connect(2) to a listener and
// allows the rest, and returns the listener. Without CAP_SYS_ADMIN the kernel requires
// no_new_privs first.
func installBindFilter() (int, error) {
	arch := auditArch()
	if arch == 0 {
		return -1, fmt.Errorf("no bind filter for %s", runtime.GOARCH)
	}
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: uint32(unsafe.Offsetof(seccompData{}.Arch))},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jf: 4, K: arch}, // another ABI: allow
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: uint32(unsafe.Offsetof(seccompData{}.Nr))},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 1, K: unix.SYS_BIND},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jf: 1, K: unix.SYS_CONNECT},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_USER_NOTIF},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	// TSYNC_ESRCH lets TSYNC go with NEW_LISTENER (both would report through the return value).
	// WAIT_KILLABLE_RECV (Linux 5.19+): once the supervisor holds a call, only a fatal signal
	// interrupts it; another one would restart the call after the supervisor did it (a second
	// bind of the bound socket fails). Older kernels refuse the flag and go without.
	flags := uintptr(unix.SECCOMP_FILTER_FLAG_NEW_LISTENER | unix.SECCOMP_FILTER_FLAG_TSYNC |
		unix.SECCOMP_FILTER_FLAG_TSYNC_ESRCH | unix.SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV)
	install := func() (int, error) {
		fd, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
		runtime.KeepAlive(prog)
		if errno != 0 {
			return -1, errno
		}
		return int(fd), nil
	}
	fd, err := install()
	for retried := map[unix.Errno]bool{}; err != nil; fd, err = install() {
		errno, _ := err.(unix.Errno)
		if retried[errno] {
			break
		}
		retried[errno] = true
		switch errno {
		case unix.EINVAL: // checked before EACCES
			flags &^= unix.SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV
		case unix.EACCES:
			if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
				return -1, fmt.Errorf("set no_new_privs: %w", err)
			}
		default:
			return -1, fmt.Errorf("install seccomp filter: %w", err)
		}
	}
	if err != nil {
		return -1, fmt.Errorf("install seccomp filter: %w", err)
	}
	return fd, nil
}

// supervise starts the workload stage, serves its binds and ends as it ends.
func supervise(c superviseConfig) {
	// Orphans of the workload stay our descendants (and so within reach of pidfd_getfd under
	// Yama's ptrace scope 1); we reap them.
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	// The group's signals reach the workload from the kernel; we outlive them to report its end.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		for range sigs {
		}
	}()
	pid, listener, err := startWorkload(c.argv, c.netns != "")
	if err != nil {
		fmt.Fprintf(os.Stderr, "ferry: %v\n", err)
		os.Exit(127)
	}
	if listener >= 0 {
		b := &binder{listener: listener, host: c.addr, port: c.port, private: c.netns != ""}
		if b.private {
			// The connection also keeps the helper running for as long as this replica runs.
			b.net = privnet.NewClient(c.netns)
			if err := b.net.Connect(); err != nil {
				fmt.Fprintf(os.Stderr, "ferry: binds of port %d fail: %v\n", c.port, err)
				b.net = nil
			}
		}
		go b.serve()
	}
	exitLike(waitWorkload(pid))
}

// startWorkload starts argv under the bind filter and returns its pid and the filter's
// listener; listener is -1 (and the log says why) when argv runs without the filter.
func startWorkload(argv []string, private bool) (int, int, error) {
	// This very binary, even if its file was replaced or removed since (an upgrade).
	const self = "/proc/self/exe"
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ferry: binds stay as the program makes them (no supervisor: %v)\n", err)
		pid, err := startPlain(argv)
		return pid, -1, err
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "supervisor"), os.NewFile(uintptr(fds[1]), "workload")
	defer ours.Close()
	proc, err := os.StartProcess(self, append([]string{self, SuperviseCommand, "--workload", "--"}, argv...), &os.ProcAttr{
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr, theirs},
	})
	theirs.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "ferry: binds stay as the program makes them (no supervisor: %v)\n", err)
		pid, err := startPlain(argv)
		return pid, -1, err
	}
	buf, oob := make([]byte, 512), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(fds[0], buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err == nil && oobn > 0 {
		if fd, ok := unixRight(oob[:oobn]); ok {
			return proc.Pid, fd, nil
		}
	}
	why := "the workload stage ended early"
	if err != nil {
		why = err.Error()
	} else if n > 0 {
		why = string(buf[:n])
	}
	fmt.Fprintf(os.Stderr, "ferry: seccomp user notification unavailable (%s): binds stay as the program makes them, "+
		"so a program binding 0.0.0.0 holds its port on every address\n", why)
	if private {
		fmt.Fprintf(os.Stderr, "ferry: so the serving port is not in Ferry's private network, where Ferry dials it: "+
			"the replica does not become ready\n")
	}
	return proc.Pid, -1, nil
}

// unixRight is the one descriptor an SCM_RIGHTS message carries.
func unixRight(oob []byte) (int, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil || len(msgs) != 1 {
		return -1, false
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return -1, false
	}
	return fds[0], true
}

// startPlain starts argv without the filter.
func startPlain(argv []string) (int, error) {
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return 0, err
	}
	proc, err := os.StartProcess(path, argv, &os.ProcAttr{Files: []*os.File{os.Stdin, os.Stdout, os.Stderr}})
	if err != nil {
		return 0, err
	}
	return proc.Pid, nil
}

// waitWorkload reaps children (orphans adopted as subreaper too) until pid ends, and returns
// how it ended.
func waitWorkload(pid int) unix.WaitStatus {
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			// ECHILD: nothing left to wait for, which cannot be before pid ended.
			return ws
		}
		if got == pid && (ws.Exited() || ws.Signaled()) {
			return ws
		}
	}
}

// exitLike ends this process as ws says the workload ended: with its status, or killed by its
// signal (so the controller's "signal: terminated" stays true).
func exitLike(ws unix.WaitStatus) {
	if ws.Signaled() {
		sig := ws.Signal()
		// The kernel's default action, not the Go runtime's (which ignores SIGUSR1, say): an
		// all-zero struct sigaction is SIG_DFL on every architecture.
		var dfl [4]uint64
		signal.Reset(sig)
		_, _, _ = unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&dfl)), 0, 8, 0, 0)
		_ = unix.Kill(os.Getpid(), sig)
		time.Sleep(100 * time.Millisecond) // a signal whose default is not to terminate
		os.Exit(128 + int(sig))
	}
	os.Exit(ws.ExitStatus())
}
