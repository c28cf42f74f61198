package configs

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestGitWorkdir(t *testing.T) {
	tests := map[string]struct {
		yaml string
		want *GitWorkdir
	}{
		// SkyPilot's schema (sky/utils/schemas.py): workdir is a string or {url, ref}.
		"url and a tag": {"run: x\nworkdir:\n  url: https://github.com/skypilot-org/skypilot.git\n  ref: v0.10.0\n",
			&GitWorkdir{URL: "https://github.com/skypilot-org/skypilot.git", Ref: "v0.10.0"}},
		"url alone: the default branch": {"run: x\nworkdir:\n  url: https://github.com/skypilot-org/skypilot.git\n",
			&GitWorkdir{URL: "https://github.com/skypilot-org/skypilot.git"}},
		"a commit": {"run: x\nworkdir: {url: 'git@github.com:org/repo.git', ref: 3c2a9f1e}\n",
			&GitWorkdir{URL: "git@github.com:org/repo.git", Ref: "3c2a9f1e"}},
		"ssh with a user": {"run: x\nworkdir: {url: 'ssh://git@example.com/org/repo.git', ref: feature/x}\n",
			&GitWorkdir{URL: "ssh://git@example.com/org/repo.git", Ref: "feature/x"}},
		"a local repository": {"run: x\nworkdir: {url: 'file:///srv/repo.git'}\n", &GitWorkdir{URL: "file:///srv/repo.git"}},
		"envs substituted, as SkyPilot does in workdir": {"run: x\nenvs: {REF: main}\nworkdir: {url: 'https://h/r.git', ref: $REF}\n",
			&GitWorkdir{URL: "https://h/r.git", Ref: "main"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task, err := Parse("task.yaml", []byte(tc.yaml), Overrides{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, task.GitWorkdir); diff != "" {
				t.Errorf("git workdir (-want +got):\n%s", diff)
			}
			if task.Workdir != "" {
				t.Errorf("Workdir = %q: a repository is not a local directory", task.Workdir)
			}
			again, out := reparse(t, task)
			if diff := cmp.Diff(task.GitWorkdir, again.GitWorkdir); diff != "" {
				t.Errorf("resolved YAML changed the workdir (-first +again):\n%s\n%s", diff, out)
			}
		})
	}
	task, err := Parse("task.yaml", []byte("run: x\nworkdir: ./src\n"), Overrides{})
	if err != nil || task.Workdir != "./src" || task.GitWorkdir != nil {
		t.Errorf("a directory stays a directory: %+v, %v", task, err)
	}
}

func TestGitWorkdirErrors(t *testing.T) {
	tests := map[string]struct {
		yaml string
		want wantErr
	}{
		"no url":      {"run: x\nworkdir:\n  ref: main\n", wantErr{3, 3, "workdir.url", "required: the git repository to clone"}},
		"unknown key": {"run: x\nworkdir:\n  url: https://h/r.git\n  branch: main\n", wantErr{4, 3, "workdir.branch", `unknown field "branch" (valid fields: url, ref)`}},
		"credentials in the url": {"run: x\nworkdir: {url: 'https://user:tok@github.com/o/r.git'}\n",
			wantErr{2, 16, "workdir.url", "secrets: {GIT_TOKEN: null}"}},
		"a ref that reads as an option": {"run: x\nworkdir: {url: 'https://h/r.git', ref: --upload-pack=x}\n",
			wantErr{2, 40, "workdir.ref", "is not a branch, tag or commit name"}},
		"not a url":         {"run: x\nworkdir: {url: 'github.com/o/r'}\n", wantErr{2, 16, "workdir.url", "is not a git repository URL"}},
		"an unknown scheme": {"run: x\nworkdir: {url: 'ftp://h/r.git'}\n", wantErr{2, 16, "workdir.url", "not ftp"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("task.yaml", []byte(tc.yaml), Overrides{})
			want := []wantErr{tc.want}
			if diff := cmp.Diff(want, project(Errors(err), want)); diff != "" {
				t.Errorf("errors (-want +got):\n%s\nfull error:\n%v", diff, err)
			}
		})
	}
}
