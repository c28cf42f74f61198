package testcluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// buildScript is the script, relative to the repository root, that builds and caches the
// cluster's binaries.
const buildScript = "scripts/testcluster/build.sh"

// The files build.sh leaves in its bin dir.
var binaries = []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok", "kwok-stages.yaml"}

// RepoRoot returns the root of the Ferry checkout this package was compiled from: the directory
// of this source file when it still exists (the normal case for `go test`), else the nearest
// parent of the working directory whose go.mod declares Ferry's module.
func RepoRoot() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		root := filepath.Dir(filepath.Dir(filepath.Dir(file)))
		if fileExists(filepath.Join(root, buildScript)) {
			return root, nil
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			bytes.HasPrefix(data, []byte("module github.com/ferryserve/ferry\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testcluster: cannot find the Ferry repository root (set Options.RepoRoot)")
		}
		dir = parent
	}
}

// buildBinaries runs build.sh, which returns at once when its cache is warm, and returns the bin
// dir it prints on its last line of stdout. Its progress goes to logf as it happens, so a cold
// build (minutes) shows why a test is slow.
func buildBinaries(ctx context.Context, repoRoot string, logf func(string, ...any)) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(repoRoot, buildScript))
	cmd.Dir = repoRoot
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("run %s: %w", buildScript, err)
	}
	var progress []string
	lines := bufio.NewScanner(stderr)
	for lines.Scan() {
		logf("testcluster: %s", lines.Text())
		progress = append(progress, lines.Text())
	}
	_, _ = io.Copy(io.Discard, stderr) // after an overlong line; Wait must not race a reader
	if err := cmd.Wait(); err != nil {
		return "", fmt.Errorf("%s failed: %w\n\t%s", buildScript, err, strings.Join(tail(progress, 30), "\n\t"))
	}
	out := strings.Fields(stdout.String())
	if len(out) == 0 {
		return "", fmt.Errorf("%s printed no bin dir", buildScript)
	}
	binDir := out[len(out)-1]
	if err := checkBinDir(binDir); err != nil {
		return "", err
	}
	return binDir, nil
}

// checkBinDir makes sure every file the cluster needs is in binDir.
func checkBinDir(binDir string) error {
	var missing []string
	for _, name := range binaries {
		if !fileExists(filepath.Join(binDir, name)) {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("testcluster: %s lacks %s (run %s)", binDir, strings.Join(missing, ", "), buildScript)
	}
	return nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func tail(lines []string, n int) []string {
	if len(lines) > n {
		return lines[len(lines)-n:]
	}
	return lines
}
