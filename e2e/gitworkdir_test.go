package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// gitOrigin makes a repository whose tag v1 has version.txt "one" and whose main has "two",
// and returns its file:// URL.
func gitOrigin(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, step := range [][]string{
		{"init", "-q", "-b", "main"},
		{"!", "one"}, {"add", "version.txt"}, {"commit", "-q", "-m", "one"}, {"tag", "v1"},
		{"!", "two"}, {"commit", "-q", "-am", "two"},
	} {
		if step[0] == "!" {
			writeFile(t, filepath.Join(dir, "version.txt"), step[1]+"\n")
			continue
		}
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@x"}, step...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", step, err, out)
		}
	}
	return "file://" + dir
}

// TestGitWorkdirOnEveryInfra: SkyPilot's workdir: {url, ref} is cloned at ref where each infra
// delivers a workdir — a local process's directory, a pod, a VM (the fake EC2, which runs its
// boot script) — and the job's run starts in the clone.
func TestGitWorkdirOnEveryInfra(t *testing.T) {
	k, _ := isolatedKubeEnv(t, 1)
	clouds := startFakeClouds(t)
	k.extraEnv = append(append([]string{}, awsEnv...), "FERRY_JOB_RETRY_INTERVAL=1s", "FERRY_JOB_WATCH_INTERVAL=200ms")
	cfg, err := os.ReadFile(filepath.Join(k.home, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(k.home, "config.yaml"), string(cfg)+clouds.config())
	origin := gitOrigin(t)
	for _, infra := range []string{"local", "kubernetes", "aws"} {
		t.Run(infra, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "job.yaml")
			marker := filepath.Join(t.TempDir(), "done")
			writeFile(t, file, `name: cloned
resources:
  infra: `+infra+`
  cpus: 2
workdir:
  url: `+origin+`
  ref: v1
run: |
  echo "version $(cat version.txt) at $(git log -1 --format=%s)"
  while [ ! -f `+marker+` ]; do sleep 0.2; done
`)
			id := k.launchDetached(file)
			k.waitJob(id, 3*time.Minute, "runs", func(j jobView) bool { return j.State == "RUNNING" || strings.HasPrefix(j.State, "FAILED") })
			var out string
			eventually(t, time.Minute, "the run starts in the clone at v1", func() (bool, string) {
				out, _, _ = k.run("jobs", "logs", strconv.FormatInt(id, 10))
				return strings.Contains(out, "version one at one") && strings.Contains(out, "ferry: workdir cloned from "+origin), lastLines(out, 10)
			})
			if err := os.WriteFile(marker, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			k.waitJob(id, 2*time.Minute, "succeeds", func(j jobView) bool { return j.State == "SUCCEEDED" && len(j.Nodes) == 0 })
		})
	}
}
