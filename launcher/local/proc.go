package local

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// procStat is the part of /proc/<pid>/stat this package needs.
type procStat struct {
	// State is the one-letter process state; 'Z' is a zombie that has exited but not been reaped.
	State byte
	// Pgrp is the process group id.
	Pgrp int
	// StartTime is field 22, clock ticks since boot. Together with the pid it names a process
	// uniquely, so a pid reused after a reboot or a long time is not mistaken for a replica.
	StartTime uint64
}

// errNoProcess means no process has that pid.
var errNoProcess = errors.New("no such process")

// readProcStat parses /proc/<pid>/stat. The command name (field 2) may hold spaces and
// parentheses, so fields are counted from the last ')'.
func readProcStat(pid int) (procStat, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return procStat{}, errNoProcess
		}
		return procStat{}, err
	}
	return parseProcStat(string(data))
}

func parseProcStat(s string) (procStat, error) {
	end := strings.LastIndexByte(s, ')')
	if end < 0 || end+2 > len(s) {
		return procStat{}, fmt.Errorf("malformed /proc stat line %q", s)
	}
	// fields[0] is field 3 (state), so field N is fields[N-3].
	fields := strings.Fields(s[end+1:])
	if len(fields) < 20 || len(fields[0]) != 1 {
		return procStat{}, fmt.Errorf("malformed /proc stat line %q", s)
	}
	pgrp, err := strconv.Atoi(fields[5-3])
	if err != nil {
		return procStat{}, fmt.Errorf("parse pgrp: %w", err)
	}
	start, err := strconv.ParseUint(fields[22-3], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("parse starttime: %w", err)
	}
	return procStat{State: fields[0][0], Pgrp: pgrp, StartTime: start}, nil
}

// leaderStatus says whether the process recorded in meta is still the one we started and still
// running. It returns "" when alive, otherwise why not.
func leaderStatus(m *metadata) string {
	if err := syscall.Kill(m.PID, 0); errors.Is(err, syscall.ESRCH) {
		return "process exited"
	}
	st, err := readProcStat(m.PID)
	if err != nil {
		return "process exited"
	}
	if st.StartTime != m.StartTime {
		return "process exited (pid reused by another process)"
	}
	if st.State == 'Z' {
		return "process exited"
	}
	return ""
}

// groupAlive reports whether the process group of meta still has a live (non-zombie) member
// that belongs to the replica. Linux never hands out a pid that is still in use as a process
// group id, so a process whose pid equals the pgid but whose start time differs proves our
// group is gone and the id now names someone else's group: it must not be signalled.
func groupAlive(m *metadata) bool {
	if st, err := readProcStat(m.PGID); err == nil && st.StartTime != m.StartTime {
		return false
	}
	if err := syscall.Kill(-m.PGID, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	// kill(2) succeeds while only zombies remain, and an init that does not reap orphans
	// leaves them forever, so look for a member that is not a zombie.
	return groupHasLiveMember(m.PGID)
}

// groupHasLiveMember scans /proc for a non-zombie process in group pgid.
func groupHasLiveMember(pgid int) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		// Without /proc, trust kill(2), which already said the group exists.
		return true
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readProcStat(pid)
		if err != nil {
			continue
		}
		if st.Pgrp == pgid && st.State != 'Z' {
			return true
		}
	}
	return false
}

// signalGroup sends sig to the whole process group, ignoring a group that is already gone.
func signalGroup(pgid int, sig syscall.Signal) error {
	if pgid <= 1 {
		// Never signal -1 (every process) or -0 (our own group).
		return fmt.Errorf("refusing to signal process group %d", pgid)
	}
	if err := syscall.Kill(-pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal process group %d: %w", pgid, err)
	}
	return nil
}

// EnvInstance is set to the instance's id in the environment of every local instance: a
// process that left the instance's process group (setsid, a daemon that double-forks) still
// carries it, so Terminate finds and stops it too. The process group stays the first means;
// the marker catches what leaves it (unless a program clears its environment).
const EnvInstance = "FERRY_INSTANCE_ID"

// markedProcesses are the live processes whose environment holds EnvInstance=id, outside the
// process group pgid (whose members the group's signal reaches). Only this user's processes
// can be read, which are the only ones a replica can start.
func markedProcesses(id string, pgid int) []int {
	marker := []byte(EnvInstance + "=" + id)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		st, err := readProcStat(pid)
		if err != nil || st.State == 'Z' || st.Pgrp == pgid {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		if slices.ContainsFunc(bytes.Split(env, []byte{0}), func(kv []byte) bool { return bytes.Equal(kv, marker) }) {
			out = append(out, pid)
		}
	}
	return out
}

// instanceAlive reports whether any process of meta's instance lives: its group, or a marked
// process that left it.
func instanceAlive(m *metadata) bool {
	return groupAlive(m) || (m.ID != "" && len(markedProcesses(m.ID, m.PGID)) > 0)
}

// signalInstance sends sig to meta's process group and to every marked process that left it.
func signalInstance(m *metadata, sig syscall.Signal) error {
	err := signalGroup(m.PGID, sig)
	if m.ID == "" {
		return err
	}
	for _, pid := range markedProcesses(m.ID, m.PGID) {
		if kerr := syscall.Kill(pid, sig); kerr != nil && !errors.Is(kerr, syscall.ESRCH) && err == nil {
			err = fmt.Errorf("signal process %d of the instance: %w", pid, kerr)
		}
	}
	return err
}
