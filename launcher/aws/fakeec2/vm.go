package fakeec2

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// vm is the local process session an instance's user-data runs in: the session stands for the
// machine, so what the user-data starts in process groups of its own (a job's run, for one) is
// still the VM's and dies with it.
type vm struct {
	cmd      *exec.Cmd
	done     chan struct{}
	killOnce sync.Once
	// wg is the server's: Close waits for the process and the killer.
	wg *sync.WaitGroup
}

// Environment a VM's user-data gets from the fake besides Options.Env, standing in for what a
// real machine has: its address, the instance metadata service, its own disk.
const (
	// EnvIMDSEndpoint is the base URL of the instance's metadata service; unset on EC2, where
	// it is http://169.254.169.254. The fake serves each instance under a path of its own,
	// because every fake VM shares the host's loopback and the fake cannot tell them apart by
	// address as EC2 does by network interface.
	EnvIMDSEndpoint = "FERRY_IMDS_ENDPOINT"
	// EnvStateDir is a directory of the VM's own where a job node keeps its boot state; on EC2
	// it is /var/lib/ferry on the instance's disk.
	EnvStateDir = "FERRY_STATE_DIR"
	// EnvVMRoot prefixes absolute paths that are on the VM's disk (a job's checkpoint
	// directory), so that VMs sharing the host's file system do not share a disk: on a real VM
	// it is unset, and a new VM starts with an empty disk.
	EnvVMRoot = "FERRY_VM_ROOT"
	// EnvFakeNFSRoot is launcher.EnvFakeNFSRoot: the host directory standing for the
	// region's shared checkpoint filesystem (launcher.CheckpointShell).
	EnvFakeNFSRoot = "FERRY_FAKE_NFS_ROOT"
	// envPowerOff is where the fake's poweroff stands in for the guest's: it leaves a file
	// there, and the VM is shut down once its user-data ends.
	envPowerOff = "FERRY_FAKE_POWEROFF"
)

// ReasonInstanceInitiatedShutdown is the state reason of an instance whose guest shut it
// down (with InstanceInitiatedShutdownBehavior terminate, it then terminates).
const ReasonInstanceInitiatedShutdown = "Client.InstanceInitiatedShutdown"

// powerOffScript is the guest's poweroff and shutdown on a fake VM: it asks the fake to shut
// the VM down once its user-data ends (which, on a real VM, poweroff does at once).
const powerOffScript = "#!/bin/sh\n: > \"$" + envPowerOff + "\"\n"

// boot writes the user-data to LogDir and runs it with bash, in a session of its own, with
// FERRY_HOST set to the instance's private IP. Callers hold s.mu.
func (s *Server) boot(in *instance, script []byte) (*vm, error) {
	if len(script) == 0 {
		return nil, nil // an instance without user-data boots to nothing
	}
	path := s.opts.LogDir + "/" + in.id + ".user-data"
	if err := os.WriteFile(path, script, 0o700); err != nil {
		return nil, fmt.Errorf("write user-data: %w", err)
	}
	bin, err := s.guestBin()
	if err != nil {
		return nil, err
	}
	stateDir := s.opts.LogDir + "/" + in.id + ".d"
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return nil, fmt.Errorf("make state dir: %w", err)
	}
	logFile, err := os.OpenFile(s.logPath(in.id), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command("bash", path)
	cmd.Dir = s.opts.LogDir
	env := append(os.Environ(), s.opts.Env...)
	cmd.Env = append(env,
		"FERRY_HOST="+in.privateIP, "FERRY_INSTANCE_ID="+in.id, "FERRY_ZONE="+in.zone.name,
		"PATH="+bin+string(os.PathListSeparator)+lastEnv(env, "PATH"),
		EnvIMDSEndpoint+"="+s.URL()+imdsPrefix+in.id,
		EnvStateDir+"="+stateDir, EnvVMRoot+"="+filepath.Join(stateDir, "disk"),
		// One region's VMs share one network filesystem, as they would one EFS.
		EnvFakeNFSRoot+"="+filepath.Join(s.opts.LogDir, "nfs", in.region),
		envPowerOff+"="+filepath.Join(stateDir, "poweroff"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// A session of its own so that terminate kills everything the user-data started; the
	// parent-death signal kills bash if the test process dies without Close.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start user-data: %w", err)
	}
	v := &vm{cmd: cmd, done: make(chan struct{}), wg: &s.vms}
	s.vms.Add(1)
	go func() {
		defer s.vms.Done()
		_ = cmd.Wait()
		close(v.done)
		if _, err := os.Stat(filepath.Join(stateDir, "poweroff")); err == nil {
			s.powerOff(in)
		}
	}()
	return v, nil
}

// powerOff shuts down an instance whose guest powered off: it terminates, as
// InstanceInitiatedShutdownBehavior terminate (Ferry's) asks. The fake has no stopped
// instances: it terminates whatever the behavior, where EC2's default (stop) would stop it.
func (s *Server) powerOff(in *instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || !in.live() {
		return
	}
	s.end(in, s.opts.Now(), ReasonInstanceInitiatedShutdown, "Client.InstanceInitiatedShutdown: Instance initiated shutdown", "Instance initiated shutdown")
}

// guestBin is the directory of commands a fake VM's PATH starts with: poweroff and shutdown.
// Callers hold s.mu.
func (s *Server) guestBin() (string, error) {
	dir := filepath.Join(s.opts.LogDir, "guest-bin")
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

// kill sends SIGTERM to the VM's session and, after grace or once everything in it is gone,
// SIGKILL to whatever is left. It does not block.
func (v *vm) kill(grace time.Duration) {
	v.killOnce.Do(func() {
		sid := v.cmd.Process.Pid
		signalSession(sid, syscall.SIGTERM)
		v.wg.Add(1)
		go func() {
			defer v.wg.Done()
			deadline := time.Now().Add(grace)
			select {
			case <-v.done:
			case <-time.After(grace):
			}
			// Children may outlive bash for a moment: wait (bounded by grace) for the session
			// to empty before killing what is left.
			for time.Now().Before(deadline) && signalSession(sid, 0) {
				time.Sleep(5 * time.Millisecond)
			}
			for range 10 {
				if !signalSession(sid, syscall.SIGKILL) {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	})
}

// signalSession sends sig to every process of session sid (Linux: read from /proc) and
// reports whether there was any. Signal 0 only checks.
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
