package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestJobFilesThroughCLI: a job with `workdir: .` and a relative local mount, launched from
// the project's directory as a SkyPilot user would, runs in a copy of its workdir and reads
// the mount; --dry-run lists both, and a missing path fails before anything is launched.
func TestJobFilesThroughCLI(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	project := t.TempDir()
	for name, body := range map[string]string{
		"train.py":       "print('hi')\n",
		"data/shard.txt": "shard-0\n",
		"job.yaml": `name: files
workdir: .
file_mounts:
  /data: ./data
run: |
  cat train.py "$FERRY_FILES_ROOT/data/shard.txt"
  touch written-by-run
`,
		"missing.yaml": "run: echo hi\nfile_mounts:\n  /data: ./nope\n",
	} {
		path := filepath.Join(project, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	inProject := func(args ...string) (string, error) {
		c := e.cmd(args...)
		c.Dir = project
		out, err := c.CombinedOutput()
		return string(out), err
	}
	out, err := inProject("jobs", "launch", "job.yaml", "--dry-run")
	if err != nil || !strings.Contains(out, "~/sky_workdir <- "+project) || !strings.Contains(out, "/data <- "+filepath.Join(project, "data")) {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	out, err = inProject("jobs", "launch", "missing.yaml", "-y", "-d")
	if err == nil || !strings.Contains(out, filepath.Join(project, "nope")+" does not exist") {
		t.Fatalf("missing path: %v\n%s", err, out)
	}
	out, err = inProject("jobs", "launch", "job.yaml", "-y", "-d")
	if err != nil {
		t.Fatalf("launch: %v\n%s", err, out)
	}
	_, after, ok := strings.Cut(out, "queued. ID: ")
	if !ok {
		t.Fatalf("no job id in:\n%s", out)
	}
	id, err := strconv.ParseInt(strings.Fields(after)[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	e.waitJob(id, 2*time.Minute, "succeeds", func(j jobView) bool { return j.State == "SUCCEEDED" || j.State == "FAILED" })
	log := e.mustRun("jobs", "logs", strconv.FormatInt(id, 10))
	if j := e.job(id); j.State != "SUCCEEDED" || !strings.Contains(log, "print('hi')\nshard-0") {
		t.Fatalf("job %s; log:\n%s", j.State, log)
	}
	if _, err := os.Stat(filepath.Join(project, "written-by-run")); !os.IsNotExist(err) {
		t.Errorf("the run wrote into the project directory (stat: %v)", err)
	}
}
