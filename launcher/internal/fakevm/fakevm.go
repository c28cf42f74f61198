// Package fakevm runs the VMs of Ferry's fake clouds (fakeec2, fakecompute): a VM is its boot
// script run by bash as a local process session, and the session stands for the machine, so
// what the script starts in process groups of its own (a job's run, for one) is still the
// VM's and dies with it. The guest's poweroff leaves a file instead of stopping anything, and
// the fake shuts the VM down, as its cloud would, once the script has ended (VM.PoweredOff).
// What a cloud does at a poweroff, a stop or a termination stays with its fake.
package fakevm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ferryserve/ferry/launcher/vmnode"
)

// Environment a VM's boot script gets besides the fake's and its cloud's, standing in for what
// a real machine has: a disk of its own, the region's shared filesystem, a poweroff.
const (
	// EnvStateDir is a directory of the VM's own where a job node keeps its boot state; on a
	// real VM it is /var/lib/ferry on the VM's disk.
	EnvStateDir = "FERRY_STATE_DIR"
	// EnvVMRoot prefixes absolute paths that are on the VM's disk (a job's checkpoint
	// directory), so that VMs sharing the host's file system do not share a disk: on a real VM
	// it is unset, and a new VM starts with an empty disk.
	EnvVMRoot = "FERRY_VM_ROOT"
	// envPowerOff is where the guest's poweroff leaves a file.
	envPowerOff = "FERRY_FAKE_POWEROFF"
)

// powerOffScript is the guest's poweroff, shutdown and halt on a fake VM: it asks the fake to
// shut the VM down once its boot script ends (which, on a real VM, poweroff does at once).
const powerOffScript = "#!/bin/sh\n: > \"$" + envPowerOff + "\"\n"

// Boot is how a VM boots.
type Boot struct {
	// Script is the boot script's path; Dir is its working directory.
	Script, Dir string
	// Env is the script's environment after the fake process's own (the fake's options, the
	// cloud's metadata endpoint, FERRY_HOST); the variables below come last.
	Env []string
	// StateDir, Disk and NFSRoot are the VM's EnvStateDir, EnvVMRoot and
	// vmnode.EnvFakeNFSRoot (one directory for every VM of a region, as one shared
	// filesystem would be).
	StateDir, Disk, NFSRoot string
	// PowerOffFile is the file the guest's poweroff leaves; Start removes a stale one.
	PowerOffFile string
	// GuestBin is a directory for the guest's poweroff, shutdown and halt, which PATH starts
	// with; the VMs of a fake share it.
	GuestBin string
	// Log is the file the script's output is appended to: the VM's console.
	Log string
}

// VM is a booted VM: its script's process session.
type VM struct {
	cmd      *exec.Cmd
	done     chan struct{}
	powerOff string
}

// Start boots a VM: bash runs the script in a session of its own (terminating it kills
// everything it started), which the kernel kills if the fake's process dies first. A script
// that cannot start is said in the log too.
func Start(b Boot) (*VM, error) {
	if err := writeGuestBin(b.GuestBin); err != nil {
		return nil, err
	}
	_ = os.Remove(b.PowerOffFile)
	logFile, err := os.OpenFile(b.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command("bash", b.Script)
	cmd.Dir = b.Dir
	env := append(os.Environ(), b.Env...)
	cmd.Env = append(env,
		"PATH="+b.GuestBin+string(os.PathListSeparator)+lastEnv(env, "PATH"),
		EnvStateDir+"="+b.StateDir, EnvVMRoot+"="+b.Disk, vmnode.EnvFakeNFSRoot+"="+b.NFSRoot,
		envPowerOff+"="+b.PowerOffFile)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_, _ = logFile.WriteString("fakevm: start " + b.Script + ": " + err.Error() + "\n")
		return nil, fmt.Errorf("start %s: %w", b.Script, err)
	}
	v := &VM{cmd: cmd, done: make(chan struct{}), powerOff: b.PowerOffFile}
	go func() {
		_ = cmd.Wait()
		close(v.done)
	}()
	return v, nil
}

// Done is closed once the boot script has ended.
func (v *VM) Done() <-chan struct{} { return v.done }

// PoweredOff reports whether the guest powered off: after Done, the fake shuts the VM down.
func (v *VM) PoweredOff() bool {
	_, err := os.Stat(v.powerOff)
	return err == nil
}

// Signal sends sig to every process of the VM's session and reports whether there was any.
// Signal 0 only checks.
func (v *VM) Signal(sig syscall.Signal) bool { return signalSession(v.cmd.Process.Pid, sig) }

// WaitEmpty waits, at most timeout, until the boot script has ended and every process of its
// session is gone (children may outlive bash for a moment).
func (v *VM) WaitEmpty(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	select {
	case <-v.done:
	case <-time.After(timeout):
	}
	for time.Now().Before(deadline) && v.Signal(0) {
		time.Sleep(5 * time.Millisecond)
	}
}

// Kill sends SIGKILL to the VM's whole session, waits (at most wait) for the script to be
// reaped, and kills again whatever is still there. A nil VM is one that ran nothing.
func (v *VM) Kill(wait time.Duration) {
	if v == nil {
		return
	}
	v.Signal(syscall.SIGKILL)
	select {
	case <-v.done:
	case <-time.After(wait):
	}
	for i := 0; i < 10 && v.Signal(syscall.SIGKILL); i++ {
		time.Sleep(5 * time.Millisecond)
	}
}

// writeGuestBin writes the guest's poweroff, shutdown and halt to dir, once.
func writeGuestBin(dir string) error {
	for _, name := range []string{"poweroff", "shutdown", "halt"} {
		path := filepath.Join(dir, name)
		if _, err := os.Stat(path); err == nil {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("make guest bin: %w", err)
		}
		if err := os.WriteFile(path, []byte(powerOffScript), 0o755); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// lastEnv is the value env gives key (the last one wins, as for exec).
func lastEnv(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v
		}
	}
	return ""
}

// signalSession sends sig to every process of session sid (Linux: read from /proc) and
// reports whether there was any.
func signalSession(sid int, sig syscall.Signal) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		_ = syscall.Kill(-sid, sig)
		return syscall.Kill(-sid, 0) == nil
	}
	found := false
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(stat[i+1:]))
		if len(fields) < 4 || fields[0] == "Z" || fields[3] != strconv.Itoa(sid) {
			continue
		}
		found = true
		_ = syscall.Kill(pid, sig)
	}
	return found
}
