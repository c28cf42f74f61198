package vmnode

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// A job's node on a VM cloud (aws, gcp) boots with JobBoot after the environment its
// provider exports, and the VM's end tells how the run went:
//
//   - The run (nodefiles.RenderScript) is started in a process group of its own, and a
//     watcher asks the cloud's metadata service every PreemptionWatch.Poll seconds whether the
//     VM is about to be preempted. At the warning it writes EnvPreemptionGrace=<seconds left>
//     to the file named by EnvPreemptionFile ($FERRY_STATE_DIR/preemption,
//     /var/lib/ferry/preemption on a real VM) and then sends SIGTERM to the run's process
//     group: a program that traps SIGTERM reads the file and checkpoints within the time left.
//     The node then prints no exit status and does not power off; the cloud takes the VM back
//     and the provider reports it PREEMPTED.
//   - When the run ends by itself, the script prints its exit status on a line starting with
//     ExitMarker and powers the VM off; the provider reads the marker from the VM's console
//     (ParseExitStatus, cached by ExitCodes) into launcher.Instance.ExitCode. A failing setup
//     shows as launcher.ExitSetupFailed.
//
// What differs between clouds is how the watcher learns of a warning and of the time it leaves
// (PreemptionWatch), and how the provider reads the console.
const (
	// EnvPreemptionFile names the file a VM job node's watcher writes at a preemption warning,
	// before it sends SIGTERM: one line, EnvPreemptionGrace=<seconds>.
	EnvPreemptionFile = "FERRY_PREEMPTION_FILE"
	// ExitMarker starts the line a VM job node prints with its run's exit status before it
	// powers off.
	ExitMarker = "ferry-job-exit-status: "
	// vmJobEOF ends the here-document that writes the run's script on the VM.
	vmJobEOF = "FERRY_JOB_SCRIPT_EOF"
)

// PreemptionWatch is a cloud's part of a VM job node's watcher, as shell. The watcher is a
// function: its variable left holds the seconds a warning leaves when it writes the
// preemption file.
type PreemptionWatch struct {
	// Locals opens the watcher: it declares the watcher's variables (local), and sets left
	// where the cloud never says the time itself.
	Locals string
	// Warned is the condition of an if that holds once the cloud has warned.
	Warned string
	// SecondsLeft, run after Warned held, sets left from what it read, where the cloud says
	// when it takes the VM back; empty where Locals set it.
	SecondsLeft string
	// Poll is how often, in seconds, the watcher asks.
	Poll int
	// Warning names the warning in the node's log ("spot interruption warning").
	Warning string
	// Fate says in the node's log what becomes of the VM after a warned run ended ("the VM is
	// being reclaimed").
	Fate string
}

// JobBoot is the part of a VM job node's boot script after its environment: the preemption
// file's name, the checkpoint directory (CheckpointShell with nfs), the run written to the
// state directory and started in its own process group beside the watcher, and the end: exit
// marker and poweroff, or waiting to be taken after a warning. infra names the provider in
// errors.
func JobBoot(infra string, spec launcher.Spec, nfs string, w PreemptionWatch) (string, error) {
	script := nodefiles.RenderScript(spec)
	if strings.Contains(script, "\n"+vmJobEOF+"\n") {
		return "", fmt.Errorf("%w: %s: the task's script contains the line %s", launcher.ErrInvalid, infra, vmJobEOF)
	}
	var b strings.Builder
	b.WriteString("ferry_state=${FERRY_STATE_DIR:-/var/lib/ferry}\nmkdir -p \"$ferry_state\"\n")
	b.WriteString("export " + EnvPreemptionFile + "=\"$ferry_state/preemption\"\nrm -f \"$" + EnvPreemptionFile + "\"\n")
	b.WriteString(CheckpointShell(nfs, spec.Job.CheckpointClaim, spec.Job.CheckpointDir))
	b.WriteString("cat > \"$ferry_state/job.sh\" <<'" + vmJobEOF + "'\n" + script)
	if !strings.HasSuffix(script, "\n") {
		b.WriteString("\n")
	}
	b.WriteString(vmJobEOF + "\n")
	b.WriteString(dockerSetup(spec))
	b.WriteString(`# The run gets a process group of its own, for the watcher's SIGTERM.
set -m
` + runCommand(spec, `"$ferry_state/job.sh"`) + ` </dev/null &
ferry_run=$!
set +m
ferry_watch() {
` + indent(w.Locals, "  ") + `  while :; do
    if ` + w.Warned + `; then
` + indent(w.SecondsLeft, "      ") + `      printf '` + launcher.EnvPreemptionGrace + `=%s\n' "$left" > "$` + EnvPreemptionFile + `.tmp"
      mv -f "$` + EnvPreemptionFile + `.tmp" "$` + EnvPreemptionFile + `"
      echo "ferry: ` + w.Warning + `, ${left}s left: SIGTERM to the run"
      kill -TERM -- "-$ferry_run" 2>/dev/null
      return
    fi
    sleep ` + strconv.Itoa(w.Poll) + `
  done
}
ferry_watch &
ferry_watcher=$!
wait "$ferry_run"
ferry_rc=$?
kill "$ferry_watcher" 2>/dev/null
` + nodefiles.MountsEndCall(spec) + `if [ -e "$` + EnvPreemptionFile + `" ]; then
  echo "ferry: the run ended with status $ferry_rc after a ` + w.Warning + `; ` + w.Fate + `"
  exec sleep infinity
fi
echo "` + ExitMarker + `$ferry_rc"
poweroff
`)
	return b.String(), nil
}

// indent prefixes every line of the shell snippet s with prefix and ends it with a newline;
// an empty snippet stays empty.
func indent(s, prefix string) string {
	if s == "" {
		return ""
	}
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	return prefix + strings.Join(lines, "\n"+prefix) + "\n"
}

// WithNodeIPsCommand gives a job node the command that reads its gang's addresses on a cloud
// that delivers them after launch, when neither they nor a command are set; selfSet says the
// caller must then give the node its own address as its gang's (a node launched alone). The
// caller's JobSpec is not changed.
func WithNodeIPsCommand(spec launcher.Spec, command string) (_ launcher.Spec, selfSet bool) {
	if spec.Job == nil || len(spec.Job.NodeIPs) > 0 || spec.Job.NodeIPsCommand != "" {
		return spec, false
	}
	job := *spec.Job
	job.NodeIPsCommand = command
	spec.Job = &job
	return spec, true
}

// exitStatusRE finds the marker at the end of a console line, whatever prefixes it (a real
// console prefixes lines: the kernel's time, cloud-init's or GCE's guest agent's names).
var exitStatusRE = regexp.MustCompile(`(?m)` + regexp.QuoteMeta(ExitMarker) + `(\d+)\r?$`)

// ParseExitStatus is the last exit status marked in console output.
func ParseExitStatus(console string) (int, bool) {
	all := exitStatusRE.FindAllStringSubmatch(console, -1)
	if len(all) == 0 {
		return 0, false
	}
	n, err := strconv.Atoi(all[len(all)-1][1])
	return n, err == nil
}

// ExitCodes caches the exit statuses VM job nodes marked in their console output: a node's
// console is read until its status is there, at most once a retry interval (a cloud may post
// the output of a powered-off VM late), and never again after. Safe for concurrent use.
type ExitCodes struct {
	retry time.Duration
	now   func() time.Time

	mu      sync.Mutex
	codes   map[string]int       // node key -> its marked status
	retryAt map[string]time.Time // node key -> when its console may be read again
}

// NewExitCodes is an empty cache that reads a node's console again retry after it showed no
// status.
func NewExitCodes(retry time.Duration) *ExitCodes {
	return &ExitCodes{retry: retry, now: time.Now, codes: map[string]int{}, retryAt: map[string]time.Time{}}
}

// Get returns the exit status the node key marked: from the cache, or else (when the node
// is not waiting out a retry) from its console output as read returns it. ok is false while
// it is not there. key must name one VM, never a later VM of the same name.
func (c *ExitCodes) Get(key string, read func() (string, error)) (code int, ok bool) {
	c.mu.Lock()
	code, known := c.codes[key]
	retry := c.retryAt[key]
	c.mu.Unlock()
	if known {
		return code, true
	}
	if c.now().Before(retry) {
		return 0, false
	}
	console, err := read()
	code, found := ParseExitStatus(console)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && found {
		c.codes[key] = code
		delete(c.retryAt, key)
		return code, true
	}
	c.retryAt[key] = c.now().Add(c.retry)
	return 0, false
}
