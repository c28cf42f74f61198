package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"unsafe"
)

// pinSelf restricts every thread of this process to cpu and sets GOMAXPROCS to 1, which is
// what `taskset -c cpu` at exec time would have done. Threads started later inherit the mask
// from the thread that creates them, so the walk is repeated until no unpinned thread is found.
func pinSelf(cpu int) error {
	if cpu < 0 || cpu >= 1024 {
		return fmt.Errorf("cpu %d: want 0..1023", cpu)
	}
	var mask [1024 / 64]uint64
	mask[cpu/64] = 1 << (uint(cpu) % 64)
	runtime.GOMAXPROCS(1)
	pinned := map[int]bool{}
	for range 5 {
		entries, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		fresh := 0
		for _, e := range entries {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || pinned[tid] {
				continue
			}
			_, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, uintptr(tid),
				unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask)))
			if errno != 0 && errno != syscall.ESRCH { // ESRCH: the thread exited meanwhile
				return fmt.Errorf("sched_setaffinity(%d, cpu %d): %w", tid, cpu, errno)
			}
			pinned[tid] = true
			fresh++
		}
		if fresh == 0 {
			return nil
		}
	}
	return nil
}
