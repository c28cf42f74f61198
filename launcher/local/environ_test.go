package local

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher"
)

// TestReplicaEnvironmentIsAllowListed: a replica gets a base environment (PATH with the
// provider's directories first, HOME, locale, TMPDIR), its spec's envs (the task's envs and
// secrets) and FERRY_PORT and FERRY_HOST, and nothing else of the controller's environment:
// neither a secret the controller's shell happened to hold, nor its cloud credentials, nor its
// FERRY_ settings.
func TestReplicaEnvironmentIsAllowListed(t *testing.T) {
	t.Setenv("CHAT_KEY", "sk-from-the-controllers-shell-0123456789")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "controller-cloud-credential")
	t.Setenv("FERRY_HOME", "/somewhere/ferry")
	t.Setenv("LANG", "C.UTF-8")
	t.Setenv("HOME", "/home/someone")
	bin := t.TempDir()
	p := newProvider(t, Options{PathPrepend: []string{bin}})
	inst, err := p.Launch(context.Background(), launcher.Spec{
		Name: "env",
		Envs: map[string]string{"MODEL": "m-1", "HF_TOKEN": "hf_task_secret"},
		Run:  "env",
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "instance to end", func() bool { return listOne(t, p, nil).State == launcher.StateTerminated })
	env := map[string]string{}
	for _, line := range strings.Split(readFile(t, filepath.Join(p.opts.Dir, inst.ID, logFile)), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	for _, leaked := range []string{"CHAT_KEY", "AWS_SECRET_ACCESS_KEY", "FERRY_HOME"} {
		if v, ok := env[leaked]; ok {
			t.Errorf("the replica got the controller's %s=%s", leaked, v)
		}
	}
	for k, want := range map[string]string{"MODEL": "m-1", "HF_TOKEN": "hf_task_secret", "FERRY_HOST": DefaultHost,
		"LANG": "C.UTF-8", "HOME": "/home/someone"} {
		if env[k] != want {
			t.Errorf("replica %s = %q, want %q", k, env[k], want)
		}
	}
	if env["FERRY_PORT"] == "" || !strings.HasPrefix(env["PATH"], bin+":") {
		t.Errorf("replica FERRY_PORT %q, PATH %q; want a port and %s first", env["FERRY_PORT"], env["PATH"], bin)
	}
}

// TestReplicaWorksOutsideDir: a replica's working directory is a fresh one of its own under
// WorkRoot, not its instance directory beside the controller's state (in Ferry, FERRY_HOME's
// controller.token and ferry.db sit two levels up from it); Terminate removes it. A work root
// inside Dir is refused.
func TestReplicaWorksOutsideDir(t *testing.T) {
	dir, root := t.TempDir(), t.TempDir()
	p := newProvider(t, Options{Dir: dir, WorkRoot: root})
	inst, err := p.Launch(context.Background(), launcher.Spec{Name: "cwd", Run: `pwd; echo "mode=$(stat -c %a .)"; sleep 300`})
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, inst.ID, logFile)
	waitFor(t, 5*time.Second, "replica output", func() bool { return strings.Contains(readFile(t, logPath), "mode=") })
	lines := strings.Split(readFile(t, logPath), "\n")
	cwd := lines[0]
	if filepath.Dir(cwd) != root || !strings.HasPrefix(filepath.Base(cwd), workDirPrefix) || strings.HasPrefix(cwd, dir) {
		t.Fatalf("replica works in %s; want a directory of its own under %s, outside %s", cwd, root, dir)
	}
	if lines[1] != "mode=700" {
		t.Errorf("working directory %s", lines[1])
	}
	if err := p.Terminate(context.Background(), inst.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cwd); !os.IsNotExist(err) {
		t.Errorf("working directory still there after Terminate: %v", err)
	}
	if _, err := New(Options{Dir: dir, WorkRoot: filepath.Join(dir, "work")}); err == nil {
		t.Error("a work root inside Dir was accepted")
	}
}
