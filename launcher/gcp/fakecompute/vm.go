package fakecompute

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"
)

// vm is a booted instance: its startup script running as a local process session (the session
// is the machine: what the script starts in process groups of its own dies with it too).
type vm struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// Environment a VM's startup script gets from the fake besides Options.Env, standing in for
// what a real machine has.
const (
	// EnvMetadataURL is the base URL of the VM's metadata server; unset on GCE, where it is
	// http://metadata.google.internal. The fake serves each VM under a path of its own,
	// because every fake VM shares the host's loopback and the fake cannot tell them apart by
	// address as GCE does.
	EnvMetadataURL = "FERRY_GCE_METADATA_URL"
	// EnvPreemptionNotice is Options.PreemptionNotice in seconds, what a VM's watcher takes
	// for GCE's 30 s between a preemption notice and the stop (GCE does not say it).
	EnvPreemptionNotice = "FERRY_GCE_PREEMPTION_NOTICE_SECONDS"
	// EnvStateDir is a directory of the VM's own for boot state (/var/lib/ferry on GCE).
	EnvStateDir = "FERRY_STATE_DIR"
	// EnvVMRoot prefixes absolute paths on the VM's disk, so that VMs sharing the host's file
	// system do not share a disk.
	EnvVMRoot = "FERRY_VM_ROOT"
	// EnvFakeNFSRoot is launcher.EnvFakeNFSRoot: the host directory standing for the
	// region's shared checkpoint filesystem (launcher.CheckpointShell).
	EnvFakeNFSRoot = "FERRY_FAKE_NFS_ROOT"
	// envPowerOff is where the fake's poweroff leaves a file: the VM stops once its script
	// ends.
	envPowerOff = "FERRY_FAKE_POWEROFF"
)

// powerOffScript is the guest's poweroff, shutdown and halt on a fake VM.
const powerOffScript = "#!/bin/sh\n: > \"$" + envPowerOff + "\"\n"

// startupScript returns the instance's startup-script metadata value.
func startupScript(pb *computepb.Instance) string {
	for _, it := range pb.GetMetadata().GetItems() {
		if it.GetKey() == "startup-script" {
			return it.GetValue()
		}
	}
	return ""
}

// boot runs the startup script with bash in the VM's own directory, as its own process
// session, with FERRY_HOST set to the VM's address. A VM without a script, or a server without
// a Dir, runs nothing (and is still RUNNING, as a real VM would be). A script that powers the
// guest off stops the VM (TERMINATED) when it ends. Called with s.mu held.
func (s *Server) boot(zone string, in *instance) *vm {
	pb := in.pb
	script := startupScript(pb)
	if script == "" || s.opts.Dir == "" {
		return nil
	}
	dir := s.vmDir(zone, pb.GetName())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil
	}
	path := filepath.Join(dir, "startup-script")
	if err := os.WriteFile(path, []byte(script), 0o700); err != nil {
		return nil
	}
	bin, err := s.guestBin()
	if err != nil {
		return nil
	}
	powerOff := filepath.Join(dir, "poweroff")
	_ = os.Remove(powerOff)
	logFile, err := os.OpenFile(s.LogPath(zone, pb.GetName()), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil
	}
	cmd := exec.Command("bash", path)
	cmd.Dir = dir
	env := append(os.Environ(), s.opts.Env...)
	cmd.Env = append(env, "FERRY_HOST="+pb.GetNetworkInterfaces()[0].GetNetworkIP(), "HOME="+dir,
		"PATH="+bin+string(os.PathListSeparator)+lastEnv(env, "PATH"),
		EnvMetadataURL+"=http://"+s.metadataHost+metadataPrefix+zone+"/"+pb.GetName(),
		EnvPreemptionNotice+"="+strconv.Itoa(int(s.opts.PreemptionNotice/time.Second)),
		EnvStateDir+"="+filepath.Join(dir, "state"), EnvVMRoot+"="+filepath.Join(dir, "disk"),
		// One region's VMs share one network filesystem, as they would one Filestore share.
		EnvFakeNFSRoot+"="+filepath.Join(s.opts.Dir, "nfs", regionOf(zone)),
		envPowerOff+"="+powerOff)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		_, _ = logFile.WriteString("fakecompute: start startup script: " + err.Error() + "\n")
		_ = logFile.Close()
		return nil
	}
	v := &vm{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		_ = logFile.Close()
		close(v.done)
		if _, err := os.Stat(powerOff); err == nil {
			s.powerOff(zone, in, v)
		}
	}()
	return v
}

// powerOff stops a VM whose guest powered off, as GCE does: STOPPING, then TERMINATED (the
// VM stays, stopped, until deleted).
func (s *Server) powerOff(zone string, in *instance, v *vm) {
	s.mu.Lock()
	if s.closed || in.vm != v || in.pb.GetStatus() != "RUNNING" {
		s.mu.Unlock()
		return
	}
	in.pb.Status = proto.String("STOPPING")
	in.vm = nil
	s.mu.Unlock()
	v.kill()
	s.mu.Lock()
	defer s.mu.Unlock()
	if in.pb.GetStatus() == "STOPPING" {
		in.pb.Status = proto.String("TERMINATED")
		in.pb.LastStopTimestamp = proto.String(time.Now().Format(timeLayout))
	}
}

// guestBin is the directory of commands a fake VM's PATH starts with: poweroff, shutdown and
// halt. Called with s.mu held.
func (s *Server) guestBin() (string, error) {
	dir := filepath.Join(s.opts.Dir, "guest-bin")
	for _, name := range []string{"poweroff", "shutdown", "halt"} {
		path := filepath.Join(dir, name)
		if _, err := os.Stat(path); err == nil {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", fmt.Errorf("make guest bin: %w", err)
		}
		if err := os.WriteFile(path, []byte(powerOffScript), 0o755); err != nil {
			return "", fmt.Errorf("write %s: %w", name, err)
		}
	}
	return dir, nil
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

// kill ends the VM's whole session and waits (bounded) for the script to be reaped.
// A nil vm is a VM that ran nothing.
func (v *vm) kill() {
	if v == nil {
		return
	}
	sid := v.cmd.Process.Pid
	signalSession(sid, syscall.SIGKILL)
	select {
	case <-v.done:
	case <-time.After(killWait):
	}
	for i := 0; i < 10 && signalSession(sid, syscall.SIGKILL); i++ {
		time.Sleep(5 * time.Millisecond)
	}
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
