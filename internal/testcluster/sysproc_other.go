//go:build unix && !linux

package testcluster

import (
	"os/exec"
	"syscall"
)

// sysProcAttr puts a child in its own process group, so that stopping it also stops anything
// it started. Only Linux can tie a child's life to its parent's (Pdeathsig).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

func startCmd(cmd *exec.Cmd) error { return cmd.Start() }
