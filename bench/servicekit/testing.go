package servicekit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/bench/benchkit"
)

// ShortRunEnv prepares a driver's in-process test run: it builds ferry from the working tree
// into a temporary directory and returns the binary and the driver's --out directory. It also
// points FERRY_HOME under out and turns the gateway and metrics listeners off for the test, as
// the driver does for its children, so nothing the test starts can reach ~/.ferry or the
// default ports.
func ShortRunEnv(t *testing.T) (bin, out string) {
	t.Helper()
	dir := t.TempDir()
	root, err := benchkit.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin, err = benchkit.BuildFerry(root, dir)
	if err != nil {
		t.Fatal(err)
	}
	out = filepath.Join(dir, "out")
	t.Setenv("FERRY_HOME", filepath.Join(out, "home"))
	t.Setenv("FERRY_GATEWAY_ADDR", "off")
	t.Setenv("FERRY_METRICS_ADDR", "off")
	return bin, out
}

// LogLevels returns the lines of a zap JSON log at the given levels, at most the last 80: what a
// failed driver test prints of the controller's log.
func LogLevels(path string, levels ...string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var keep []string
	for _, line := range strings.Split(string(b), "\n") {
		for _, l := range levels {
			if strings.Contains(line, `"level":"`+l+`"`) {
				keep = append(keep, line)
			}
		}
	}
	return strings.Join(keep[max(0, len(keep)-80):], "\n")
}
