// Package benchkit holds what the benchmark drivers in bench/ share: their command-line entry
// point, output directory and ferry build, markdown tables and report files, free loopback
// ports.
package benchkit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Main parses args with parse and runs the driver, exiting 2 on a flag error, 1 when run fails,
// and 0 after --help. Errors are printed as "name: error".
func Main[O any](name string, args []string, parse func([]string) (O, error), run func(O) error) {
	opts, err := parse(args)
	if errors.Is(err, pflag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	if err := run(opts); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// Table is a markdown table whose columns are padded so that it also reads well in a terminal.
type Table struct {
	Header []string
	Rows   [][]string
}

// Render writes the table: header, separator, rows. Widths count runes, so "µs" and "÷" pad
// like any other character.
func (t *Table) Render(w io.Writer) {
	width := make([]int, len(t.Header))
	for i, h := range t.Header {
		width[i] = len([]rune(h))
	}
	for _, row := range t.Rows {
		for i, c := range row {
			if i < len(width) {
				width[i] = max(width[i], len([]rune(c)))
			}
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		b.WriteString("|")
		for i, c := range cells {
			if i < len(width) {
				fmt.Fprintf(&b, " %-*s |", width[i], c)
			}
		}
		fmt.Fprintln(w, b.String())
	}
	line(t.Header)
	sep := make([]string, len(width))
	for i, n := range width {
		sep[i] = strings.Repeat("-", n)
	}
	line(sep)
	for _, row := range t.Rows {
		line(row)
	}
}

// FreeLoopbackAddr returns a 127.0.0.1 address with a port that was free a moment ago.
func FreeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// RepoRoot is the module root, where ./cmd/ferry and scripts/ are.
func RepoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run from inside the ferry module (go env GOMOD is empty)")
	}
	return filepath.Dir(mod), nil
}

// OutDir creates and returns the driver's output directory: dir if set, else
// .cache/bench/<driver>-<timestamp> under root (git-ignored).
func OutDir(root, driver, dir string) (string, error) {
	if dir == "" {
		dir = filepath.Join(root, ".cache", "bench", driver+"-"+time.Now().Format("20060102-150405"))
	}
	return dir, os.MkdirAll(dir, 0o755)
}

// BuildFerry builds ./cmd/ferry from the working tree at root into dir and returns the binary.
func BuildFerry(root, dir string) (string, error) {
	bin := filepath.Join(dir, "ferry")
	fmt.Fprintf(os.Stderr, "building ferry into %s\n", bin)
	build := exec.Command("go", "build", "-o", bin, "./cmd/ferry")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/ferry: %v\n%s", err, out)
	}
	return bin, nil
}

// Prepare is what a driver that runs ferry does first: its output directory (OutDir under the
// repository, made absolute) and the ferry binary (built there when bin is "", made absolute,
// and reached through a link named ferry when it is named otherwise, since replicas' run lines
// call `ferry replica-sim` from PATH).
func Prepare(driver, out, bin string) (absOut, absBin string, err error) {
	root, err := RepoRoot()
	if err != nil {
		return "", "", err
	}
	if out, err = OutDir(root, driver, out); err != nil {
		return "", "", err
	}
	if out, err = filepath.Abs(out); err != nil {
		return "", "", err
	}
	if bin == "" {
		if bin, err = BuildFerry(root, out); err != nil {
			return "", "", err
		}
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return "", "", err
	}
	if filepath.Base(bin) != "ferry" {
		link := filepath.Join(out, "bin", "ferry")
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			return "", "", err
		}
		_ = os.Remove(link)
		if err := os.Symlink(bin, link); err != nil {
			return "", "", err
		}
		bin = link
	}
	return out, bin, nil
}

// Progress writes one line of a driver's progress to stderr, with the time of day.
func Progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// LoadAvg is the host's 1, 5 and 15 minute load averages, or "" where /proc has none.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// WriteReport prints markdown to stdout and saves it as summary.md, and results as indented
// JSON in results.json, both under dir.
func WriteReport(stdout io.Writer, dir, markdown string, results any) error {
	fmt.Fprint(stdout, markdown)
	summary, resultsFile := filepath.Join(dir, "summary.md"), filepath.Join(dir, "results.json")
	if err := os.WriteFile(summary, []byte(markdown), 0o644); err != nil {
		return err
	}
	js, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(resultsFile, append(js, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nwrote %s and %s\n", summary, resultsFile)
	return nil
}
