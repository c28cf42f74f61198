package vmnode_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/internal/vmjobtest"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

// TestBootReplicaDocker runs a service replica's VM boot script (not a job's) with bash, as
// a fake VM would: the task runs through `docker run` (the stand-in), in the synced workdir,
// and the container's exit status is the script's.
func TestBootReplicaDocker(t *testing.T) {
	log := vmjobtest.InstallDocker(t)
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "model.txt"), []byte("tiny"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := launcher.Spec{
		Name: "chat-1", Workdir: work, Setup: "echo setup-ran", Run: `echo "serving $(cat model.txt)"; exit 4`,
		Envs:      map[string]string{"MODEL": "m"},
		Resources: configs.Resources{ImageID: "docker:vllm/vllm-openai:latest"},
	}
	boot, err := vmnode.Boot(context.Background(), "test", spec, vmnode.BootOptions{FilesLimit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	cmd := exec.Command("bash", "-c", boot)
	cmd.Env = append(os.Environ(), "FERRY_STATE_DIR="+filepath.Join(root, "state"), "FERRY_VM_ROOT="+filepath.Join(root, "disk"), "MODEL=m")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 4 {
		t.Fatalf("boot script: %v, want exit status 4; output:\n%s", err, out)
	}
	if !strings.Contains(string(out), "setup-ran") || !strings.Contains(string(out), "serving tiny") {
		t.Errorf("output lacks setup or run:\n%s", out)
	}
	calls, _ := os.ReadFile(log)
	if !strings.Contains(string(calls), "pull vllm/vllm-openai:latest\nrun --rm --net=host ") || strings.Contains(string(calls), "--gpus") {
		t.Errorf("docker calls:\n%s\nwant a pull, then a run on the host network without GPUs", calls)
	}
}
