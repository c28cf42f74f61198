package fakeec2

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// vm is the local process group an instance's user-data runs in.
type vm struct {
	cmd      *exec.Cmd
	done     chan struct{}
	killOnce sync.Once
	// wg is the server's: Close waits for the process and the killer.
	wg *sync.WaitGroup
}

// boot writes the user-data to LogDir and runs it with bash, in its own process group, with
// FERRY_HOST set to the instance's private IP. Callers hold s.mu.
func (s *Server) boot(in *instance, script []byte) (*vm, error) {
	if len(script) == 0 {
		return nil, nil // an instance without user-data boots to nothing
	}
	path := s.opts.LogDir + "/" + in.id + ".user-data"
	if err := os.WriteFile(path, script, 0o700); err != nil {
		return nil, fmt.Errorf("write user-data: %w", err)
	}
	logFile, err := os.OpenFile(s.logPath(in.id), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command("bash", path)
	cmd.Dir = s.opts.LogDir
	cmd.Env = append(append(os.Environ(), s.opts.Env...),
		"FERRY_HOST="+in.privateIP, "FERRY_INSTANCE_ID="+in.id, "FERRY_ZONE="+in.zone.name)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Own process group so that terminate kills everything the user-data started; the
	// parent-death signal kills bash if the test process dies without Close.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start user-data: %w", err)
	}
	v := &vm{cmd: cmd, done: make(chan struct{}), wg: &s.vms}
	s.vms.Add(1)
	go func() {
		defer s.vms.Done()
		_ = cmd.Wait()
		close(v.done)
	}()
	return v, nil
}

// kill sends SIGTERM to the VM's process group and, after grace or once bash is gone,
// SIGKILL to whatever is left of the group. It does not block.
func (v *vm) kill(grace time.Duration) {
	v.killOnce.Do(func() {
		pgid := v.cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		v.wg.Add(1)
		go func() {
			defer v.wg.Done()
			deadline := time.Now().Add(grace)
			select {
			case <-v.done:
			case <-time.After(grace):
			}
			// Children may outlive bash for a moment: wait (bounded by grace) for the group
			// to empty before killing what is left.
			for time.Now().Before(deadline) && syscall.Kill(-pgid, 0) == nil {
				time.Sleep(5 * time.Millisecond)
			}
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}()
	})
}
