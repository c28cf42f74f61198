package local

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// TestGitWorkdirLocal: a local instance of a task with workdir: {url, ref} runs in a clone of
// the repository at ref, in its own working directory, never in the user's home.
func TestGitWorkdirLocal(t *testing.T) {
	repo := t.TempDir()
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"-c", "user.name=t", "-c", "user.email=t@x", "commit", "-q", "--allow-empty", "-m", "first"},
		{"tag", "v1"},
		{"-c", "user.name=t", "-c", "user.email=t@x", "commit", "-q", "--allow-empty", "-m", "second"},
	} {
		if out, err := exec.Command("git", append([]string{"-C", repo}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	home := t.TempDir()
	t.Setenv("HOME", home) // what the instance inherits as its home
	p := newProvider(t, Options{})
	inst, err := p.Launch(context.Background(), launcher.Spec{
		Name:       "gw",
		GitWorkdir: &configs.GitWorkdir{URL: "file://" + repo, Ref: "v1"},
		Run:        `echo "pwd=$PWD"; git log -1 --format=subject=%s`,
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "instance to end", func() bool { return listOne(t, p, nil).State == launcher.StateTerminated })
	out := readFile(t, filepath.Join(p.opts.Dir, inst.ID, logFile))
	if !strings.Contains(out, "pwd="+p.opts.WorkRoot+"/"+workDirPrefix) || !strings.Contains(out, "subject=first") {
		t.Errorf("want the run in a clone at v1 in the instance's working directory:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(home, nodefiles.WorkdirName)); !os.IsNotExist(err) {
		t.Errorf("the clone went to the user's home (stat: %v)", err)
	}
}
