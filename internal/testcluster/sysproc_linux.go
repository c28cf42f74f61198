package testcluster

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// sysProcAttr puts a child in its own process group, so that stopping it also stops anything
// it started, and asks the kernel to kill it when its parent dies, so that a test binary that
// crashes or is killed by `go test -timeout` leaves no API server or replica behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// Pdeathsig fires when the OS thread that forked the child exits, not when the process does
// (golang/go#27505). The Go runtime can retire threads, so every child is started from one
// goroutine that locks its thread and never returns: that thread lives as long as the process.
var (
	spawnOnce     sync.Once
	spawnRequests chan spawnRequest
)

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

// startCmd starts cmd from the spawner thread.
func startCmd(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnRequests = make(chan spawnRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread must outlive every child
			for req := range spawnRequests {
				req.done <- req.cmd.Start()
			}
		}()
	})
	req := spawnRequest{cmd: cmd, done: make(chan error, 1)}
	spawnRequests <- req
	return <-req.done
}
