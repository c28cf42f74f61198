package fakecompute

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
)

// vm is a booted instance: its startup script running as a local process group.
type vm struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startupScript returns the instance's startup-script metadata value.
func startupScript(pb *computepb.Instance) string {
	for _, it := range pb.GetMetadata().GetItems() {
		if it.GetKey() == "startup-script" {
			return it.GetValue()
		}
	}
	return ""
}

// boot runs the startup script with bash in the VM's own directory, as its own process group,
// with FERRY_HOST set to the VM's address. A VM without a script, or a server without a Dir,
// runs nothing (and is still RUNNING, as a real VM would be). Called with s.mu held.
func (s *Server) boot(zone string, pb *computepb.Instance) *vm {
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
	logFile, err := os.OpenFile(s.LogPath(zone, pb.GetName()), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil
	}
	cmd := exec.Command("bash", path)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), s.opts.Env...)
	cmd.Env = append(cmd.Env, "FERRY_HOST="+pb.GetNetworkInterfaces()[0].GetNetworkIP(), "HOME="+dir)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
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
	}()
	return v
}

// kill ends the VM's whole process group and waits (bounded) for the script to be reaped.
// A nil vm is a VM that ran nothing.
func (v *vm) kill() {
	if v == nil {
		return
	}
	_ = syscall.Kill(-v.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-v.done:
	case <-time.After(killWait):
	}
}
