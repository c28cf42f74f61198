package testcluster

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// process is a child this package started: a cluster component or a simulated replica. Its
// output goes to a log file, never to the test's own output.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed once the process has exited and been reaped
	err     error         // how it exited; read only after done is closed
}

// startProcess starts bin in its own process group with stdout and stderr appended to logPath.
// A nil env inherits the test's environment.
func startProcess(name, logPath string, env []string, bin string, args ...string) (*process, error) {
	return startProcessIn("", name, logPath, env, bin, args...)
}

// startProcessIn is startProcess with the working directory dir ("" is the test's).
func startProcessIn(dir, name, logPath string, env []string, bin string, args ...string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = env
	cmd.Dir = dir
	cmd.SysProcAttr = sysProcAttr()
	if err := startCmd(cmd); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, and SIGKILL once grace has passed (at once when grace
// is zero), then waits for the process to be reaped. Safe to call more than once.
func (p *process) stop(grace time.Duration) {
	pgid := p.cmd.Process.Pid
	if grace > 0 && !p.exited() {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		timer := time.NewTimer(grace)
		defer timer.Stop()
		select {
		case <-p.done:
		case <-timer.C:
		}
	}
	// Also when the leader is gone: anything else left in its group goes with it.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.done
}

// failure describes a process that did not come up: why, and the end of its log.
func (p *process) failure(why string) error {
	return fmt.Errorf("%s %s (log %s):\n%s", p.name, why, p.logPath, logTail(p.logPath))
}

// logTail returns the last lines of a log file, enough to see why a component failed.
func logTail(path string) string {
	const maxLines, maxBytes = 40, 8 << 10
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	if len(data) > maxBytes {
		data = data[len(data)-maxBytes:]
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		}
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	if len(lines) == 1 && lines[0] == "" {
		return "(log is empty)"
	}
	return "\t" + strings.Join(lines, "\n\t")
}
