package aws

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/ferryserve/ferry/launcher"
)

// A job's node (Spec.Job set) is a VM that is meant to end. Its user-data differs from a
// replica's in what happens around launcher.RenderScript:
//
//   - Its gang's addresses exist only once every node runs, so LaunchGang (or Launch, for a
//     node launched alone) tags the instances with tagNodeIPs afterwards, and the node reads
//     the tag from its instance metadata service (IMDSv2: a token from a PUT, then the tag;
//     the instance's MetadataOptions enable instance tags in metadata for job nodes only, and
//     keep tokens required with a hop limit of 1). EC2 tag values may not hold newlines and
//     are at most 256 characters, so the addresses are separated by spaces there, which caps
//     a gang at about 16 nodes (launching more is refused with ErrInvalid).
//   - The run is started in a process group of its own, and a watcher polls the metadata
//     service's spot/instance-action every two seconds. On EC2's interruption warning (two
//     minutes ahead) it writes FERRY_PREEMPTION_GRACE_SECONDS=<seconds left> to the file
//     named by FERRY_PREEMPTION_FILE ($FERRY_STATE_DIR/preemption, /var/lib/ferry/preemption
//     on a real VM) and then sends SIGTERM to the run's process group: a program that traps
//     SIGTERM reads the file and checkpoints within the time left. The node then prints no
//     exit status and does not power off; EC2 reclaims it, and List reports it PREEMPTED.
//   - When the run ends by itself, the user-data prints the exit status on a marker line
//     (exitMarker) and powers the VM off; InstanceInitiatedShutdownBehavior terminate ends
//     it, with state reason Client.InstanceInitiatedShutdown, and List reads the marker from
//     the console output into Instance.ExitCode. A failing setup shows as
//     launcher.ExitSetupFailed.
//
// Checkpoints: with the cloud's checkpoint_nfs set (an EFS share), FERRY_CHECKPOINT_DIR is
// the job's claim directory on it, mounted at launcher.CheckpointMountPoint
// (launcher.CheckpointShell): every node of the gang and every later gang of the job within the
// share's reach (its region) sees it, so a recovery in another zone resumes. Without it the
// directory is on the VM's own disk (JobSpec.CheckpointDir) and survives nothing but a restart
// of the program on the same VM, and the node's log says so. The fake shares one host directory
// per region (FERRY_FAKE_NFS_ROOT) in place of the mount, and gives each VM its own disk root
// (FERRY_VM_ROOT).
const (
	// tagNodeIPs holds a gang's private IPs, rank 0 first, separated by spaces.
	tagNodeIPs = "ferry-node-ips"
	// exitMarker starts the line a job node prints with its run's exit status before it
	// powers off.
	exitMarker = "ferry-job-exit-status: "
	// reasonInstanceShutdown is the state reason of an instance whose guest shut it down.
	reasonInstanceShutdown = "Client.InstanceInitiatedShutdown"
	// preemptionPoll is how often a job node asks its metadata service for a warning.
	preemptionPoll = 2
	// imdsDefault is the instance metadata service; EnvIMDSEndpoint overrides it (the fake).
	imdsDefault = "http://169.254.169.254"
	// EnvIMDSEndpoint, when set in a VM's environment, replaces imdsDefault in what the
	// user-data asks the metadata service. fakeec2 sets it.
	EnvIMDSEndpoint = "FERRY_IMDS_ENDPOINT"
	// EnvPreemptionFile names the file a job node's watcher writes on a spot interruption
	// warning, before it sends SIGTERM: one line, FERRY_PREEMPTION_GRACE_SECONDS=<seconds>.
	EnvPreemptionFile = "FERRY_PREEMPTION_FILE"
)

// imdsGet is a shell snippet printing the metadata at path (under latest/meta-data/), failing
// when the service does not answer or has nothing there.
func imdsGet(path string) string {
	base := `"${` + EnvIMDSEndpoint + `:-` + imdsDefault + `}"`
	return `t=$(curl -sf --max-time 5 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' ` + base + `/latest/api/token) && ` +
		`curl -sf --max-time 5 -H "X-aws-ec2-metadata-token: $t" ` + base + `/latest/meta-data/` + path
}

// nodeIPsCommand prints the gang's addresses from the instance's tags, one per line.
var nodeIPsCommand = imdsGet("tags/instance/"+tagNodeIPs) + ` | tr ' ' '\n'`

// jobSpec gives a job node the command that reads its gang's addresses, when neither they nor
// a command are set; selfTag says the caller must then tag the node with its own address (a
// node launched alone). The caller's JobSpec is not changed.
func jobSpec(spec launcher.Spec) (_ launcher.Spec, selfTag bool) {
	if spec.Job == nil || len(spec.Job.NodeIPs) > 0 || spec.Job.NodeIPsCommand != "" {
		return spec, false
	}
	job := *spec.Job
	job.NodeIPsCommand = nodeIPsCommand
	spec.Job = &job
	return spec, true
}

// jobBoot is the part of a job node's user-data after its environment: see the comment at
// the top of this file.
func jobBoot(spec launcher.Spec, nfs string) (string, error) {
	script := launcher.RenderScript(spec)
	const eof = "FERRY_JOB_SCRIPT_EOF"
	if strings.Contains(script, "\n"+eof+"\n") {
		return "", fmt.Errorf("%w: %s: the task's script contains the line %s", launcher.ErrInvalid, InfraName, eof)
	}
	var b strings.Builder
	b.WriteString("ferry_state=${FERRY_STATE_DIR:-/var/lib/ferry}\nmkdir -p \"$ferry_state\"\n")
	b.WriteString("export " + EnvPreemptionFile + "=\"$ferry_state/preemption\"\nrm -f \"$" + EnvPreemptionFile + "\"\n")
	b.WriteString(launcher.CheckpointShell(nfs, spec.Job.CheckpointClaim, spec.Job.CheckpointDir))
	b.WriteString("cat > \"$ferry_state/job.sh\" <<'" + eof + "'\n" + script)
	if !strings.HasSuffix(script, "\n") {
		b.WriteString("\n")
	}
	b.WriteString(eof + "\n")
	b.WriteString(`# The run gets a process group of its own, for the watcher's SIGTERM.
set -m
bash "$ferry_state/job.sh" </dev/null &
ferry_run=$!
set +m
ferry_watch() {
  local action at left
  while :; do
    if action=$(` + imdsGet("spot/instance-action") + `); then
      at=$(printf '%s' "$action" | sed -n 's/.*"time" *: *"\([^"]*\)".*/\1/p')
      left=$(( $(date -d "$at" +%s 2>/dev/null || date +%s) - $(date +%s) ))
      [ "$left" -ge 0 ] || left=0
      printf '` + launcher.EnvPreemptionGrace + `=%s\n' "$left" > "$` + EnvPreemptionFile + `.tmp"
      mv -f "$` + EnvPreemptionFile + `.tmp" "$` + EnvPreemptionFile + `"
      echo "ferry: spot interruption warning, ${left}s left: SIGTERM to the run"
      kill -TERM -- "-$ferry_run" 2>/dev/null
      return
    fi
    sleep ` + strconv.Itoa(preemptionPoll) + `
  done
}
ferry_watch &
ferry_watcher=$!
wait "$ferry_run"
ferry_rc=$?
kill "$ferry_watcher" 2>/dev/null
if [ -e "$` + EnvPreemptionFile + `" ]; then
  echo "ferry: the run ended with status $ferry_rc after a spot interruption warning; the VM is being reclaimed"
  exec sleep infinity
fi
echo "` + exitMarker + `$ferry_rc"
poweroff
`)
	return b.String(), nil
}

// exitStatusRE finds the marker anywhere in a console line (a real console prefixes lines).
var exitStatusRE = regexp.MustCompile(`(?m)` + regexp.QuoteMeta(exitMarker) + `(\d+)\r?$`)

// parseExitStatus is the last exit status marked in console output.
func parseExitStatus(console string) (int, bool) {
	all := exitStatusRE.FindAllStringSubmatch(console, -1)
	if len(all) == 0 {
		return 0, false
	}
	n, err := strconv.Atoi(all[len(all)-1][1])
	return n, err == nil
}

// exitRetry is how long List waits before reading again the console output of a job node that
// powered off without a marked exit status (EC2 posts console output shortly after
// termination).
const exitRetry = 15 * time.Second

// exitCode reads (once, then from the cache) the exit status a powered-off job node marked in
// its console output. ok is false while it is not there.
func (p *Provider) exitCode(ctx context.Context, region, iid string) (int, bool) {
	p.mu.Lock()
	code, known := p.exits[iid]
	retry := p.exitTries[iid]
	p.mu.Unlock()
	if known {
		return code, true
	}
	if time.Now().Before(retry) {
		return 0, false
	}
	console, err := p.consoleOutput(ctx, region, iid)
	code, found := parseExitStatus(console)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil && found {
		p.exits[iid] = code
		delete(p.exitTries, iid)
		return code, true
	}
	p.exitTries[iid] = time.Now().Add(exitRetry)
	return 0, false
}

// consoleOutput is the instance's console output as EC2 keeps it: the last 64 KiB, current on
// Nitro instances (Latest), else as last posted (at boot, reboot and termination).
func (p *Provider) consoleOutput(ctx context.Context, region, iid string) (string, error) {
	c := p.clients[region]
	out, err := c.GetConsoleOutput(ctx, &ec2.GetConsoleOutputInput{InstanceId: awssdk.String(iid), Latest: awssdk.Bool(true)})
	if errorCode(err) == "UnsupportedOperation" {
		out, err = c.GetConsoleOutput(ctx, &ec2.GetConsoleOutputInput{InstanceId: awssdk.String(iid)})
	}
	if err != nil {
		return "", classify(err, "get console output of "+iid)
	}
	return decodeConsole(awssdk.ToString(out.Output)), nil
}

// tagNodes tags a gang's instances with their addresses, rank order.
func (p *Provider) tagNodes(ctx context.Context, region string, insts []launcher.Instance) error {
	ids := make([]string, len(insts))
	ips := make([]string, len(insts))
	for i, in := range insts {
		_, ids[i], _ = strings.Cut(strings.TrimPrefix(in.ID, InfraName+"/"), "/")
		ips[i] = in.IP
	}
	value := strings.Join(ips, " ")
	if len(value) > 256 {
		return fmt.Errorf("%w: %s: a gang of %d has addresses longer than an EC2 tag value (256 characters)", launcher.ErrInvalid, InfraName, len(insts))
	}
	_, err := p.clients[region].CreateTags(ctx, &ec2.CreateTagsInput{
		Resources: ids, Tags: []types.Tag{{Key: awssdk.String(tagNodeIPs), Value: awssdk.String(value)}},
	})
	if err != nil {
		return classify(err, "tag the gang's addresses")
	}
	return nil
}

// maxGang is the largest gang whose addresses fit one tag value (15-character IPv4 addresses).
const maxGang = 16
