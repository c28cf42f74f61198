package procstat

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// statLine builds a /proc/PID/stat line with the given identity and times; the other fields
// are plausible constants.
func statLine(pid int, comm string, state byte, ppid, pgrp int, utime, stime uint64) string {
	return strconv.Itoa(pid) + " (" + comm + ") " + string(state) + " " + strconv.Itoa(ppid) + " " + strconv.Itoa(pgrp) +
		" 4321 34816 4321 4194560 1042 0 3 0 " + strconv.FormatUint(utime, 10) + " " + strconv.FormatUint(stime, 10) +
		" 0 0 20 0 3 0 12345 1234567 890 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
}

func TestParseStat(t *testing.T) {
	tests := map[string]struct {
		line    string
		want    Stat
		wantErr bool
	}{
		"plain": {
			line: statLine(42, "ferry", 'S', 1, 42, 150, 50),
			want: Stat{PID: 42, Comm: "ferry", State: 'S', PPID: 1, PGRP: 42, UTime: 150, STime: 50},
		},
		"comm with spaces and parentheses": {
			line: statLine(7, "nginx: worker (x) )", 'R', 6, 6, 1, 2),
			want: Stat{PID: 7, Comm: "nginx: worker (x) )", State: 'R', PPID: 6, PGRP: 6, UTime: 1, STime: 2},
		},
		"zombie": {
			line: statLine(9, "sh", 'Z', 1, 9, 0, 0),
			want: Stat{PID: 9, Comm: "sh", State: 'Z', PPID: 1, PGRP: 9},
		},
		"no comm":          {line: "42 ferry S 1 42", wantErr: true},
		"too few fields":   {line: "42 (ferry) S 1 42 0 0", wantErr: true},
		"bad pid":          {line: "x (ferry) S 1 42 0 0 0 0 0 0 0 0 1 2", wantErr: true},
		"bad utime":        {line: "42 (ferry) S 1 42 0 0 0 0 0 0 0 0 x 2", wantErr: true},
		"multi-char state": {line: "42 (ferry) SS 1 42 0 0 0 0 0 0 0 0 1 2", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseStat([]byte(tc.line))
			if tc.wantErr {
				if !errors.Is(err, ErrFormat) {
					t.Fatalf("ParseStat() error = %v, want ErrFormat", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseStat() mismatch (-want +got):\n%s", diff)
			}
		})
	}
	if d := (Stat{UTime: 150, STime: 50}).CPU(); d != 2*time.Second {
		t.Errorf("CPU() = %v, want 2s at 100 ticks/s", d)
	}
}

func TestReadStatSelf(t *testing.T) {
	s, err := ReadStat("/proc", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.PID != os.Getpid() || s.PPID != os.Getppid() || s.State == 'Z' {
		t.Errorf("own stat %+v", s)
	}
}

// fakeProc writes a /proc-shaped tree for GroupCPU and GroupMemory.
func fakeProc(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for path, text := range files {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func status(rssKB, hwmKB int) string {
	return "Name:\tnginx\nVmPeak:\t  20000 kB\nVmHWM:\t    " + strconv.Itoa(hwmKB) + " kB\nVmRSS:\t    " + strconv.Itoa(rssKB) + " kB\nThreads:\t1\n"
}

func TestGroupCPUAndMemory(t *testing.T) {
	root := fakeProc(t, map[string]string{
		"100/stat":   statLine(100, "nginx", 'S', 1, 100, 10, 5), // master
		"100/status": status(4000, 5000),
		"101/stat":   statLine(101, "nginx", 'R', 100, 100, 300, 200), // worker
		"101/status": status(6000, 8000),
		"102/stat":   statLine(102, "nginx", 'Z', 100, 100, 999, 999), // zombie: ignored
		"200/stat":   statLine(200, "other", 'S', 1, 200, 1000, 1000), // another group
		"200/status": status(1, 1),
		"self":       "not a pid",
		"stat":       "cpu  1 2 3 4 5 6 7 8 0 0\n",
	})
	cpu, pids, err := GroupCPU(root, 100)
	if err != nil {
		t.Fatal(err)
	}
	if cpu != 5150*time.Millisecond {
		t.Errorf("GroupCPU = %v, want 5.15s (515 ticks)", cpu)
	}
	if diff := cmp.Diff([]int{100, 101}, pids); diff != "" {
		t.Errorf("pids (-want +got):\n%s", diff)
	}
	mem, err := GroupMemory(root, 100)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Memory{RSS: 10000 << 10, HWM: 13000 << 10}); mem != want {
		t.Errorf("GroupMemory = %+v, want %+v", mem, want)
	}
	if cpu, pids, err := GroupCPU(root, 999); err != nil || cpu != 0 || len(pids) != 0 {
		t.Errorf("empty group: %v %v %v", cpu, pids, err)
	}
}

func TestParseStatus(t *testing.T) {
	m, err := ParseStatus([]byte(status(1234, 2345)))
	if err != nil {
		t.Fatal(err)
	}
	if m.RSS != 1234<<10 || m.HWM != 2345<<10 {
		t.Errorf("ParseStatus = %+v", m)
	}
	for name, text := range map[string]string{
		"kernel thread": "Name:\tkthreadd\nThreads:\t1\n",
		"bad unit":      "VmHWM:\t1 MB\nVmRSS:\t1 kB\n",
		"bad number":    "VmHWM:\tx kB\nVmRSS:\t1 kB\n",
	} {
		if _, err := ParseStatus([]byte(text)); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: error = %v, want ErrFormat", name, err)
		}
	}
	if _, err := ReadMemory("/proc", os.Getpid()); err != nil {
		t.Errorf("own status: %v", err)
	}
}

func TestCoreTimes(t *testing.T) {
	before, err := ParseCoreTimes([]byte("cpu  10 0 10 100 0 0 0 0 0 0\ncpu0 5 0 5 50 0 0 0 0 0 0\ncpu1 5 0 5 50 0 0 0 0 0 0\nintr 1 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	// cpu0: 30 busy ticks (user 20, system 5, steal 5) and 10 idle ticks later.
	after, err := ParseCoreTimes([]byte("cpu0 25 0 10 60 0 0 0 5 0 0\ncpu1 5 0 5 150 0 0 0 0 0 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := BusyPercent(before[0], after[0]); got != 75 {
		t.Errorf("cpu0 busy %v%%, want 75", got)
	}
	if got := BusyPercent(before[1], after[1]); got != 0 {
		t.Errorf("cpu1 busy %v%%, want 0", got)
	}
	if got := BusyPercent(after[0], after[0]); got != 0 {
		t.Errorf("no time passed: %v%%, want 0", got)
	}
	if after[0].Steal != 5 {
		t.Errorf("steal %d, want 5", after[0].Steal)
	}
	if _, err := ParseCoreTimes([]byte("cpu  1 2 3 4 5 6 7 8\n")); !errors.Is(err, ErrFormat) {
		t.Errorf("no per-core lines: %v, want ErrFormat", err)
	}
	if _, err := ParseCoreTimes([]byte("cpu0 1 2 x 4 5 6 7 8\n")); !errors.Is(err, ErrFormat) {
		t.Errorf("bad number: %v, want ErrFormat", err)
	}
	if cores, err := ReadCoreTimes("/proc"); err != nil || len(cores) == 0 {
		t.Errorf("ReadCoreTimes(/proc) = %v, %v", cores, err)
	}
}
