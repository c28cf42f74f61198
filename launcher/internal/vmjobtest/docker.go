package vmjobtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// dockerStandIn is the `docker` a fake VM finds on its PATH (fake VMs are local processes
// and run no containers): it appends its arguments to $FERRY_TEST_DOCKER_LOG, succeeds at
// pull, and for run skips the options Ferry passes and the image and runs the command, so the
// run's exit status is the container's, as with docker run.
const dockerStandIn = `#!/usr/bin/env bash
printf '%s\n' "$*" >> "$FERRY_TEST_DOCKER_LOG"
case "$1" in
pull) exit 0 ;;
run)
  shift
  while [ $# -gt 0 ]; do
    case "$1" in
      --rm|--net=host) shift ;;
      -v|-e|--gpus) shift 2 ;;
      -*) echo "docker stand-in: unexpected option $1" >&2; exit 125 ;;
      *) break ;;
    esac
  done
  shift # the image
  exec "$@" ;;
*) echo "docker stand-in: $1 is not modelled" >&2; exit 125 ;;
esac
`

// InstallDocker puts the stand-in docker first on PATH (which fake VMs inherit) and returns
// the file its calls are logged to. The test must not be parallel.
func InstallDocker(t *testing.T) (log string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "docker"), []byte(dockerStandIn), 0o755); err != nil {
		t.Fatal(err)
	}
	log = filepath.Join(dir, "calls.log")
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("FERRY_TEST_DOCKER_LOG", log)
	return log
}

// CheckDocker launches spec (a job node with image_id docker:IMAGE and a workdir) and checks
// that the boot script pulled the image and ran setup and run through `docker run` on the
// host's network with the workdir bound and the task's environment passed by name, with
// --gpus all exactly when wantGPU, and that the container's exit status (3) is the node's.
func CheckDocker(t *testing.T, c Cloud, s launcher.Spec, wantGPU bool) {
	t.Helper()
	log := InstallDocker(t)
	work := t.TempDir()
	writeFile(t, filepath.Join(work, "app.txt"), "in-workdir")
	s.Resources.ImageID = "docker:ghcr.io/example/app:1.0"
	s.Workdir = work
	s.Setup = "echo setup-ran"
	s.Run = `echo "run-ran $GREETING $(cat app.txt)"; exit 3`
	s.Envs = map[string]string{"GREETING": "hello"}
	in, err := c.Provider.Launch(Context(t), s)
	if err != nil {
		t.Fatal(err)
	}
	if got := WaitExited(t, c, in); got != 3 {
		t.Fatalf("exit code %d, want the container's 3; console:\n%s", got, c.Console(in))
	}
	console := c.Console(in)
	for _, w := range []string{"setup-ran", "run-ran hello in-workdir"} {
		if !strings.Contains(console, w) {
			t.Errorf("console lacks %q:\n%s", w, console)
		}
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatalf("docker was never called: %v; console:\n%s", err, console)
	}
	calls := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(calls) != 2 || calls[0] != "pull ghcr.io/example/app:1.0" {
		t.Fatalf("docker calls %q, want a pull of the image then a run", calls)
	}
	run := calls[1]
	for _, w := range []string{"run --rm --net=host ", "/" + nodefiles.WorkdirName + ":", " -e GREETING ", " -e FERRY_PORT ", " -e " + nodefiles.EnvWorkdir + " ", " ghcr.io/example/app:1.0 bash "} {
		if !strings.Contains(run, w) {
			t.Errorf("docker run %q lacks %q", run, w)
		}
	}
	if strings.Contains(run, "hello") {
		t.Errorf("docker run %q carries an environment value; values must pass by name", run)
	}
	if got := strings.Contains(run, " --gpus all "); got != wantGPU {
		t.Errorf("docker run %q: --gpus all present %v, want %v", run, got, wantGPU)
	}
}
