package aws

import (
	"context"
	"fmt"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

// A job's node (Spec.Job set) is a VM that is meant to end. Its user-data differs from a
// replica's in what happens around nodefiles.RenderScript:
//
//   - Its gang's addresses exist only once every node runs, so LaunchGang (or Launch, for a
//     node launched alone) tags the instances with tagNodeIPs afterwards, and the node reads
//     the tag from its instance metadata service (IMDSv2: a token from a PUT, then the tag;
//     the instance's MetadataOptions enable instance tags in metadata for job nodes only, and
//     keep tokens required with a hop limit of 1). EC2 tag values may not hold newlines and
//     are at most 256 characters, so the addresses are separated by spaces there, which caps
//     a gang at about 16 nodes (launching more is refused with ErrInvalid).
//   - Around the run is vmnode.JobBoot's watcher, which polls the metadata service's
//     spot/instance-action every two seconds. On EC2's interruption warning (two minutes
//     ahead) it writes to the preemption file the seconds left until the time the warning
//     names, and sends SIGTERM to the run; the node then prints no exit status and does not
//     power off; EC2 reclaims it, and List reports it PREEMPTED.
//   - When the run ends by itself, the user-data prints the exit status on a marker line
//     (vmnode.ExitMarker) and powers the VM off; InstanceInitiatedShutdownBehavior terminate
//     ends it, with state reason Client.InstanceInitiatedShutdown, and List reads the marker
//     from the console output into Instance.ExitCode. A failing setup shows as
//     launcher.ExitSetupFailed.
//
// Checkpoints: with the cloud's checkpoint_nfs set (an EFS share), FERRY_CHECKPOINT_DIR is
// the job's claim directory on it, mounted at vmnode.CheckpointMountPoint
// (vmnode.CheckpointShell): every node of the gang and every later gang of the job within the
// share's reach (its region) sees it, so a recovery in another zone resumes. Without it the
// directory is on the VM's own disk (JobSpec.CheckpointDir) and survives nothing but a restart
// of the program on the same VM, and the node's log says so. The fake shares one host directory
// per region (FERRY_FAKE_NFS_ROOT) in place of the mount, and gives each VM its own disk root
// (FERRY_VM_ROOT).
const (
	// tagNodeIPs holds a gang's private IPs, rank 0 first, separated by spaces.
	tagNodeIPs = "ferry-node-ips"
	// reasonInstanceShutdown is the state reason of an instance whose guest shut it down.
	reasonInstanceShutdown = "Client.InstanceInitiatedShutdown"
	// preemptionPoll is how often a job node asks its metadata service for a warning.
	preemptionPoll = 2
	// imdsDefault is the instance metadata service; EnvIMDSEndpoint overrides it (the fake).
	imdsDefault = "http://169.254.169.254"
	// EnvIMDSEndpoint, when set in a VM's environment, replaces imdsDefault in what the
	// user-data asks the metadata service. fakeec2 sets it.
	EnvIMDSEndpoint = "FERRY_IMDS_ENDPOINT"
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

// preemptionWatch is how a job node's watcher learns of EC2's interruption warning: the
// metadata service's spot/instance-action answers once one is given, with the time EC2 takes
// the instance back.
var preemptionWatch = vmnode.PreemptionWatch{
	Locals: "local action at left",
	Warned: "action=$(" + imdsGet("spot/instance-action") + ")",
	SecondsLeft: `at=$(printf '%s' "$action" | sed -n 's/.*"time" *: *"\([^"]*\)".*/\1/p')
left=$(( $(date -d "$at" +%s 2>/dev/null || date +%s) - $(date +%s) ))
[ "$left" -ge 0 ] || left=0`,
	Poll:    preemptionPoll,
	Warning: "spot interruption warning",
	Fate:    "the VM is being reclaimed",
}

// exitRetry is how long List waits before reading again the console output of a job node that
// powered off without a marked exit status (EC2 posts console output shortly after
// termination).
const exitRetry = 15 * time.Second

// exitCode reads (once, then from the cache) the exit status a powered-off job node marked in
// its console output. ok is false while it is not there.
func (p *Provider) exitCode(ctx context.Context, region, iid string) (int, bool) {
	return p.exits.Get(iid, func() (string, error) { return p.consoleOutput(ctx, region, iid) })
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
