package nodefiles

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/launcher"
)

// runScript runs RenderScript(spec) with bash and returns its exit status and output.
func runScript(t *testing.T, spec launcher.Spec) (int, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(path, []byte(RenderScript(spec)), 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", path)
	for k, v := range spec.Envs {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "PATH="+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &exit):
		return exit.ExitCode(), string(out)
	}
	t.Fatal(err)
	return 0, ""
}

func TestRenderScriptJobExitStatus(t *testing.T) {
	job := &launcher.JobSpec{}
	cases := []struct {
		name        string
		setup, run  string
		job         *launcher.JobSpec
		wantCode    int
		wantOut     string
		wantMissing string
	}{
		{"job run status is the script's", "echo prepared", "exit 3", job, 3, "prepared", ""},
		{"job setup failure is marked", "echo before; false; echo after", "echo ran", job, launcher.ExitSetupFailed, "ferry: setup failed with exit status 1", "after"},
		{"job setup exiting 0 runs nothing more but is no failure", "exit 0", "echo ran", job, 0, "", "setup failed"},
		{"service setup failure keeps its status", "exit 7", "echo ran", nil, 7, "", "ran"},
		{"setup exports reach run", "export GREETING=hi", "echo \"$GREETING there\"", job, 0, "hi there", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runScript(t, launcher.Spec{Name: "n", Setup: tc.setup, Run: tc.run, Job: tc.job})
			if code != tc.wantCode {
				t.Errorf("exit %d, want %d; output:\n%s", code, tc.wantCode, out)
			}
			if !strings.Contains(out, tc.wantOut) {
				t.Errorf("output %q lacks %q", out, tc.wantOut)
			}
			if tc.wantMissing != "" && strings.Contains(out, tc.wantMissing) {
				t.Errorf("output %q has %q", out, tc.wantMissing)
			}
		})
	}
}

// A node whose provider delivers the gang's addresses after launch waits for them before setup.
func TestRenderScriptWaitsForNodeIPs(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "ips")
	// The command fails twice (no file yet), then the "provider" writes the file.
	counter := filepath.Join(dir, "n")
	cmd := `n=$(cat ` + counter + ` 2>/dev/null || echo 0); echo $((n+1)) > ` + counter + `; [ "$n" -ge 2 ] && printf '10.0.0.1\n10.0.0.2\n' > ` + file + `; cat ` + file
	spec := launcher.Spec{Name: "n", Setup: `echo "setup sees $SKYPILOT_SETUP_NODE_IPS" | head -1`, Run: `echo "$SKYPILOT_NODE_IPS" | tail -1`, Job: &launcher.JobSpec{NodeIPsCommand: cmd}}
	code, out := runScript(t, spec)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	if !strings.Contains(out, "setup sees 10.0.0.1") || !strings.HasSuffix(strings.TrimSpace(out), "10.0.0.2") {
		t.Errorf("output %q: want the addresses in setup and run", out)
	}
}
