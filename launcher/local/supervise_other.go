//go:build !linux

package local

import (
	"fmt"
	"os"
)

const superviseSupported = false

// Supervise is `ferry local-supervise`; only Linux has the seccomp user notification it needs,
// and the provider starts it nowhere else.
func Supervise(args []string) int {
	fmt.Fprintln(os.Stderr, "ferry "+SuperviseCommand+": supported on Linux only")
	return 2
}

// privateSupported says why the private network is unavailable: it needs Linux.
func privateSupported() error { return fmt.Errorf("it needs Linux") }
