package nodefiles

import (
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// gitRepo makes a repository with two commits on main (version.txt "one", then "two"), a tag
// v1 on the first and a branch "next" with a third ("three"); it returns its file:// URL and
// the first commit's hash.
func gitRepo(t *testing.T) (url, first string) {
	t.Helper()
	dir := t.TempDir()
	git := func(args ...string) string {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@x", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@x")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	commit := func(v string) {
		if err := os.WriteFile(filepath.Join(dir, "version.txt"), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		git("add", "version.txt")
		git("commit", "-q", "-m", v)
	}
	git("init", "-q", "-b", "main")
	commit("one")
	first = git("rev-parse", "HEAD")
	git("tag", "v1")
	commit("two")
	git("checkout", "-q", "-b", "next")
	commit("three")
	git("checkout", "-q", "main")
	return "file://" + dir, first
}

// TestGitWorkdirCloned: SkyPilot's workdir: {url, ref} is cloned at the ref before setup, and
// setup and run start in the clone; a ref that is none of branch, tag or commit fails the
// instance (a job's node as a failed setup).
func TestGitWorkdirCloned(t *testing.T) {
	url, first := gitRepo(t)
	cases := map[string]struct {
		ref      string
		job      bool
		wantCode int
		wantOut  string
	}{
		"default branch":        {"", false, 0, "version two"},
		"a branch":              {"next", false, 0, "version three"},
		"a tag":                 {"v1", false, 0, "version one"},
		"a commit":              {first, true, 0, "version one"},
		"a short commit":        {first[:10], false, 0, "version one"},
		"no such ref, replica":  {"nope", false, 1, "clone failed"},
		"no such ref, job node": {"nope", true, launcher.ExitSetupFailed, "clone failed"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			home := t.TempDir()
			spec := launcher.Spec{Name: "n", GitWorkdir: &configs.GitWorkdir{URL: url, Ref: tc.ref},
				Setup: "test -f version.txt", Run: `echo "version $(cat version.txt) in $PWD"`,
				Envs: map[string]string{"HOME": home, "GIT_TOKEN": "s3cret-token"}}
			if tc.job {
				spec.Job = &launcher.JobSpec{}
			}
			code, out := runScript(t, spec)
			if code != tc.wantCode || !strings.Contains(out, tc.wantOut) {
				t.Fatalf("exit %d, want %d with %q; output:\n%s", code, tc.wantCode, tc.wantOut, out)
			}
			if code != 0 {
				return
			}
			work := filepath.Join(home, WorkdirName)
			if !strings.Contains(out, " in "+work) {
				t.Errorf("run did not start in %s:\n%s", work, out)
			}
			// The token never lands in the clone.
			cfg, err := os.ReadFile(filepath.Join(work, ".git", "config"))
			if err != nil || strings.Contains(string(cfg), "s3cret") {
				t.Errorf(".git/config holds the token or is missing (%v):\n%s", err, cfg)
			}
		})
	}
}

// A provider that names the workdir (local: the instance's own directory) gets the clone there.
func TestGitWorkdirIntoProvidersDirectory(t *testing.T) {
	url, _ := gitRepo(t)
	work := t.TempDir()
	code, out := runScript(t, launcher.Spec{Name: "n", GitWorkdir: &configs.GitWorkdir{URL: url, Ref: "main"}, Run: "pwd; cat version.txt",
		Envs: map[string]string{EnvWorkdir: work, "HOME": t.TempDir()}})
	if code != 0 || !strings.Contains(out, work+"\ntwo") {
		t.Fatalf("exit %d; want the clone in %s:\n%s", code, work, out)
	}
}

func TestGitWorkdirWithoutGit(t *testing.T) {
	bin := t.TempDir() // a PATH with bash and coreutils but no git
	for _, tool := range []string{"bash", "mkdir", "cat", "find", "rm", "mktemp", "chmod"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(p, filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "script")
	spec := launcher.Spec{Name: "n", GitWorkdir: &configs.GitWorkdir{URL: "https://example.com/r.git"}, Run: "echo ran", Job: &launcher.JobSpec{}}
	if err := os.WriteFile(path, []byte(RenderScript(spec)), 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, "bash"), path)
	cmd.Env = []string{"PATH=" + bin, "HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	exit, ok := err.(*exec.ExitError)
	if !ok || exit.ExitCode() != launcher.ExitSetupFailed || !strings.Contains(string(out), "git is not installed") || strings.Contains(string(out), "ran") {
		t.Fatalf("want a failed setup saying git is missing, got %v:\n%s", err, out)
	}
}

// TestGitWorkdirPrivateRepository: a repository served over HTTP with a password (git's own
// http-backend behind basic auth, as a forge serves one) is cloned with the task's GIT_TOKEN,
// which stays out of the clone; without it the clone fails and says what to give.
func TestGitWorkdirPrivateRepository(t *testing.T) {
	url, _ := gitRepo(t)
	root := filepath.Dir(strings.TrimPrefix(url, "file://"))
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatal(err)
	}
	backend := &cgi.Handler{Path: filepath.Join(strings.TrimSpace(string(out)), "git-http-backend"),
		Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}}
	const token = "ghp_s3cret"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pass, ok := r.BasicAuth(); !ok || pass != token {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		backend.ServeHTTP(w, r)
	}))
	defer srv.Close()
	repo := srv.URL + "/" + filepath.Base(strings.TrimPrefix(url, "file://"))
	for _, tc := range []struct {
		name     string
		envs     map[string]string
		wantCode int
		wantOut  string
	}{
		{"with GIT_TOKEN", map[string]string{"GIT_TOKEN": token}, 0, "version one"},
		{"without", map[string]string{}, 1, "GIT_TOKEN or GIT_SSH_KEY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			home := t.TempDir()
			tc.envs["HOME"] = home
			code, out := runScript(t, launcher.Spec{Name: "n", GitWorkdir: &configs.GitWorkdir{URL: repo, Ref: "v1"},
				Run: `echo "version $(cat version.txt)"`, Envs: tc.envs})
			if code != tc.wantCode || !strings.Contains(out, tc.wantOut) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, tc.wantCode, tc.wantOut, out)
			}
			if cfg, err := os.ReadFile(filepath.Join(home, WorkdirName, ".git", "config")); err == nil && strings.Contains(string(cfg), token) {
				t.Errorf("the token is in the clone's .git/config:\n%s", cfg)
			}
			if strings.Contains(out, token) {
				t.Errorf("the token is in the output:\n%s", out)
			}
		})
	}
}
