package nodefiles

import (
	"strconv"
	"strings"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// A git workdir (workdir: {url, ref}) is cloned by the instance itself, at the start of its
// script (RenderScript), on every infra alike: on a VM, in a pod, in a local process's working
// directory. That is where SkyPilot clones it too (its git_clone.sh on the cluster), and it
// needs no channel to carry the files: a repository of any size works wherever the node can
// reach it. The node needs git (SkyPilot's script installs it when missing; Ferry's says it is
// missing), and the clone lands in $FERRY_WORKDIR when the provider set one (local: the
// instance's own directory), else in ~/sky_workdir (under the files root on the fake clouds).
//
// A ref is tried as a branch or tag first, in a shallow clone; failing that, as a commit, in a
// full clone. A private repository is read with the task's GIT_TOKEN (HTTPS: as the password
// of a credential helper, so it is neither on a command line nor in the clone's .git/config) or
// GIT_SSH_KEY (the private key itself, for ssh:// and git@ URLs), as SkyPilot names them;
// give them as secrets.

// gitFailExit is what a failed clone exits with: a job's node reports a failed setup (the job
// is FAILED_SETUP, not restarted as a failing program), a replica just ends.
func gitFailExit(job bool) string {
	if job {
		return strconv.Itoa(launcher.ExitSetupFailed)
	}
	return "1"
}

// GitCloneShell is the part of an instance's script that clones g into the workdir and exports
// EnvWorkdir; job says the instance is a job's node (a failure is a failed setup).
func GitCloneShell(g configs.GitWorkdir, job bool) string {
	fail := `{ echo "ferry: ` + strings.ReplaceAll(g.String(), `"`, `'`) + `: $1" >&2; exit ` + gitFailExit(job) + `; }`
	var b strings.Builder
	b.WriteString("# workdir: a git repository, cloned here\n")
	b.WriteString("ferry_git_fail() " + fail + "\n")
	b.WriteString("export " + EnvWorkdir + `="${` + EnvWorkdir + `:-${` + EnvFilesRoot + `:-${FERRY_VM_ROOT:-}}${HOME:-/root}/` + WorkdirName + `}"` + "\n")
	b.WriteString("ferry_git_url=" + ShellQuote(g.URL) + "\nferry_git_ref=" + ShellQuote(g.Ref) + "\n")
	b.WriteString(gitCloneFuncs)
	b.WriteString(`command -v git >/dev/null 2>&1 || ferry_git_fail "git is not installed on this node (the image needs it to clone the workdir)"
mkdir -p "$` + EnvWorkdir + `" || ferry_git_fail "cannot create $` + EnvWorkdir + `"
ferry_git_clone || ferry_git_fail "clone failed (is the URL reachable from the node, the ref right, and GIT_TOKEN or GIT_SSH_KEY given for a private repository?)"
[ -z "${ferry_git_key:-}" ] || rm -f "$ferry_git_key"
echo "ferry: workdir cloned from $ferry_git_url at $(git -C "$` + EnvWorkdir + `" rev-parse --short HEAD 2>/dev/null)"
`)
	return b.String()
}

// gitCloneFuncs define ferry_git (git with the task's credentials) and ferry_git_clone: a
// shallow clone of a branch or tag, else a full clone and a checkout of the commit.
const gitCloneFuncs = `ferry_git() {
  if [ -n "${GIT_SSH_KEY:-}" ] && [ -z "${ferry_git_key:-}" ]; then
    ferry_git_key=$(mktemp) && chmod 600 "$ferry_git_key" && printf '%s\n' "$GIT_SSH_KEY" > "$ferry_git_key" &&
      export GIT_SSH_COMMAND="ssh -i $ferry_git_key -o IdentitiesOnly=yes -o StrictHostKeyChecking=accept-new"
  fi
  if [ -n "${GIT_TOKEN:-}" ]; then
    git -c credential.helper= -c 'credential.helper=!f() { echo username=x-access-token; echo "password=$GIT_TOKEN"; }; f' "$@"
  else
    git "$@"
  fi
}
ferry_git_clean() { find "$FERRY_WORKDIR" -mindepth 1 -maxdepth 1 -exec rm -rf {} +; }
ferry_git_clone() {
  export GIT_TERMINAL_PROMPT=0
  if [ -z "$ferry_git_ref" ]; then
    ferry_git clone --quiet --depth 1 -- "$ferry_git_url" "$FERRY_WORKDIR"
    return
  fi
  ferry_git clone --quiet --depth 1 --branch "$ferry_git_ref" -- "$ferry_git_url" "$FERRY_WORKDIR" 2>/dev/null && return
  ferry_git_clean
  ferry_git clone --quiet --no-checkout -- "$ferry_git_url" "$FERRY_WORKDIR" &&
    git -C "$FERRY_WORKDIR" -c advice.detachedHead=false checkout --quiet "$ferry_git_ref" --
}
`
