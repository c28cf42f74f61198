// Package procstat reads the Linux /proc counters the bench drivers report: a process's CPU time
// (utime+stime from /proc/PID/stat), summed over its process group so that nginx's master and
// worker count together, its resident memory (VmRSS, VmHWM from /proc/PID/status), and per-core
// busy time from /proc/stat to reveal foreign work on a core the driver thought was its own.
package procstat

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ClockTicks is USER_HZ, the unit of /proc's CPU times. The kernel has exported 100 to user
// space on every Linux architecture since 2.6, whatever its internal HZ.
const ClockTicks = 100

// ErrFormat is returned for /proc text that does not have the expected shape.
var ErrFormat = errors.New("procstat: unexpected /proc format")

// Stat is the part of /proc/PID/stat the drivers use.
type Stat struct {
	PID   int
	Comm  string
	State byte
	PPID  int
	PGRP  int
	// UTime and STime are in clock ticks (ClockTicks per second).
	UTime uint64
	STime uint64
}

// CPU is the process's user plus system time.
func (s Stat) CPU() time.Duration {
	return TicksToDuration(s.UTime + s.STime)
}

// TicksToDuration converts clock ticks to a duration.
func TicksToDuration(ticks uint64) time.Duration {
	return time.Duration(ticks) * (time.Second / ClockTicks)
}

// ParseStat parses the one line of /proc/PID/stat. The command name is in parentheses and may
// itself contain spaces and parentheses, so the fields are counted from the last ')'.
func ParseStat(line []byte) (Stat, error) {
	var s Stat
	open := bytes.IndexByte(line, '(')
	closing := bytes.LastIndexByte(line, ')')
	if open < 0 || closing < open {
		return s, fmt.Errorf("%w: stat line %q has no (comm)", ErrFormat, trim(line))
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(line[:open])))
	if err != nil {
		return s, fmt.Errorf("%w: stat pid: %v", ErrFormat, err)
	}
	s.PID = pid
	s.Comm = string(line[open+1 : closing])
	// Fields after comm, numbered as in proc(5) from 3 (state).
	rest := strings.Fields(string(line[closing+1:]))
	const (
		fState = 3
		fPPID  = 4
		fPGRP  = 5
		fUTime = 14
		fSTime = 15
	)
	if len(rest) < fSTime-2 {
		return s, fmt.Errorf("%w: stat line has %d fields after comm, want at least %d", ErrFormat, len(rest), fSTime-2)
	}
	field := func(n int) string { return rest[n-fState] }
	if len(field(fState)) != 1 {
		return s, fmt.Errorf("%w: stat state %q", ErrFormat, field(fState))
	}
	s.State = field(fState)[0]
	ints := []struct {
		n   int
		dst *int
	}{{fPPID, &s.PPID}, {fPGRP, &s.PGRP}}
	for _, f := range ints {
		v, err := strconv.Atoi(field(f.n))
		if err != nil {
			return s, fmt.Errorf("%w: stat field %d: %v", ErrFormat, f.n, err)
		}
		*f.dst = v
	}
	uints := []struct {
		n   int
		dst *uint64
	}{{fUTime, &s.UTime}, {fSTime, &s.STime}}
	for _, f := range uints {
		v, err := strconv.ParseUint(field(f.n), 10, 64)
		if err != nil {
			return s, fmt.Errorf("%w: stat field %d: %v", ErrFormat, f.n, err)
		}
		*f.dst = v
	}
	return s, nil
}

// ReadStat reads /proc/PID/stat under root (normally "/proc").
func ReadStat(root string, pid int) (Stat, error) {
	b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "stat"))
	if err != nil {
		return Stat{}, err
	}
	return ParseStat(b)
}

// GroupStats returns the stat of every live (non-zombie) process in process group pgid. A
// process that exits while the directory is being walked is skipped.
func GroupStats(root string, pgid int) ([]Stat, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var out []Stat
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !e.IsDir() {
			continue
		}
		s, err := ReadStat(root, pid)
		if err != nil {
			continue // gone already
		}
		if s.PGRP == pgid && s.State != 'Z' {
			out = append(out, s)
		}
	}
	return out, nil
}

// GroupCPU is the CPU time of the live members of process group pgid. Time of members that have
// exited is lost, so measure groups whose processes live through the window (nginx's do).
func GroupCPU(root string, pgid int) (time.Duration, []int, error) {
	stats, err := GroupStats(root, pgid)
	if err != nil {
		return 0, nil, err
	}
	var ticks uint64
	pids := make([]int, 0, len(stats))
	for _, s := range stats {
		ticks += s.UTime + s.STime
		pids = append(pids, s.PID)
	}
	return TicksToDuration(ticks), pids, nil
}

// Memory is the resident-memory part of /proc/PID/status, in bytes.
type Memory struct {
	// RSS is the current resident set (VmRSS), HWM its peak over the process's life (VmHWM).
	RSS uint64
	HWM uint64
}

// ParseStatus reads VmRSS and VmHWM from /proc/PID/status text. Kernel threads have neither;
// that is reported as ErrFormat.
func ParseStatus(text []byte) (Memory, error) {
	var m Memory
	found := 0
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *uint64
		switch key {
		case "VmRSS":
			dst = &m.RSS
		case "VmHWM":
			dst = &m.HWM
		default:
			continue
		}
		f := strings.Fields(val)
		if len(f) != 2 || f[1] != "kB" {
			return m, fmt.Errorf("%w: status %s %q", ErrFormat, key, val)
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return m, fmt.Errorf("%w: status %s: %v", ErrFormat, key, err)
		}
		*dst = kb << 10
		found++
	}
	if found != 2 {
		return m, fmt.Errorf("%w: status has no VmRSS/VmHWM", ErrFormat)
	}
	return m, nil
}

// ReadMemory reads /proc/PID/status under root.
func ReadMemory(root string, pid int) (Memory, error) {
	b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "status"))
	if err != nil {
		return Memory{}, err
	}
	return ParseStatus(b)
}

// GroupMemory sums RSS and HWM over the live members of process group pgid.
func GroupMemory(root string, pgid int) (Memory, error) {
	stats, err := GroupStats(root, pgid)
	if err != nil {
		return Memory{}, err
	}
	var sum Memory
	for _, s := range stats {
		m, err := ReadMemory(root, s.PID)
		if err != nil {
			continue
		}
		sum.RSS += m.RSS
		sum.HWM += m.HWM
	}
	return sum, nil
}

// CoreTimes are one core's cumulative times from /proc/stat, in clock ticks.
type CoreTimes struct {
	Busy  uint64 // user+nice+system+irq+softirq+steal
	Total uint64 // Busy plus idle and iowait
	Steal uint64
}

// ParseCoreTimes returns the times of each "cpuN" line of /proc/stat text, indexed by N.
func ParseCoreTimes(text []byte) (map[int]CoreTimes, error) {
	out := map[int]CoreTimes{}
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 9 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		n, err := strconv.Atoi(f[0][3:])
		if err != nil {
			return nil, fmt.Errorf("%w: /proc/stat line %q", ErrFormat, f[0])
		}
		var v [8]uint64 // user nice system idle iowait irq softirq steal
		for i := range v {
			if v[i], err = strconv.ParseUint(f[i+1], 10, 64); err != nil {
				return nil, fmt.Errorf("%w: /proc/stat %s: %v", ErrFormat, f[0], err)
			}
		}
		busy := v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
		out[n] = CoreTimes{Busy: busy, Total: busy + v[3] + v[4], Steal: v[7]}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: /proc/stat has no cpuN lines", ErrFormat)
	}
	return out, nil
}

// ReadCoreTimes reads root/stat.
func ReadCoreTimes(root string) (map[int]CoreTimes, error) {
	b, err := os.ReadFile(filepath.Join(root, "stat"))
	if err != nil {
		return nil, err
	}
	return ParseCoreTimes(b)
}

// BusyPercent is the share of wall time core spent busy between two readings (steal included,
// since stolen time was not the driver's either); zero when no time passed.
func BusyPercent(before, after CoreTimes) float64 {
	if after.Total <= before.Total {
		return 0
	}
	return 100 * float64(after.Busy-before.Busy) / float64(after.Total-before.Total)
}

func trim(b []byte) []byte {
	if len(b) > 80 {
		return b[:80]
	}
	return b
}
