package gcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/googleapi"
	"google.golang.org/protobuf/proto"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

// A job's node (Spec.Job set) is a VM that is meant to end. Its startup script differs from a
// replica's in what happens around nodefiles.RenderScript:
//
//   - Its gang's addresses exist only once every node runs, so LaunchGang (or Launch, for a
//     node launched alone) sets them afterwards as the metaNodeIPs attribute of every node
//     (instances.setMetadata), one per line, rank 0 first, and the node reads them from its
//     metadata server (Metadata-Flavor: Google) before setup.
//   - Around the run is vmnode.JobBoot's watcher, which asks the metadata server's
//     instance/preempted every second. When GCE begins a preemption it answers TRUE, and the
//     watcher writes to the preemption file GCE's 30 s notice less the poll (GCE does not say
//     the time itself), then sends SIGTERM to the run. On GCE the guest also gets an ACPI
//     shutdown at the notice, so the OS itself may send SIGTERM to every process first: a
//     program should treat SIGTERM as "checkpoint now" and read the file if it is there, else
//     assume 30 s. The node then prints no exit status and does not power off; GCE stops it
//     and List reports it PREEMPTED (from the moment the preemption begins: its status is
//     STOPPING meanwhile, and its program is checkpointing until it is TERMINATED, so leave it
//     until then).
//   - When the run ends by itself, the script prints the exit status on a marker line
//     (vmnode.ExitMarker) to the serial console and powers the guest off; the VM goes
//     TERMINATED and List reads the marker from serial port 1 into Instance.ExitCode. A
//     failing setup shows as launcher.ExitSetupFailed.
//
// Checkpoints: with the cloud's checkpoint_nfs set (an Filestore share), FERRY_CHECKPOINT_DIR is
// the job's claim directory on it, mounted at vmnode.CheckpointMountPoint
// (vmnode.CheckpointShell): every node of the gang and every later gang of the job within the
// share's reach (its region) sees it, so a recovery in another zone resumes. Without it the
// directory is on the VM's own disk (JobSpec.CheckpointDir) and survives nothing but a restart
// of the program on the same VM, and the node's log says so. The fake shares one host directory
// per region (FERRY_FAKE_NFS_ROOT) in place of the mount, and gives each VM its own disk root
// (FERRY_VM_ROOT).
const (
	// metaNodeIPs is the metadata attribute with a gang's addresses.
	metaNodeIPs = "ferry-node-ips"
	// metadataDefault is the metadata server; EnvMetadataURL overrides it (the fake).
	metadataDefault = "http://metadata.google.internal"
	// EnvMetadataURL, when set in a VM's environment, replaces metadataDefault in what the
	// startup script asks the metadata server. fakecompute sets it.
	EnvMetadataURL = "FERRY_GCE_METADATA_URL"
	// EnvPreemptionNotice, when set in a VM's environment, replaces GCE's 30 s notice in what
	// the watcher reports (fakecompute sets it to its own).
	EnvPreemptionNotice = "FERRY_GCE_PREEMPTION_NOTICE_SECONDS"
	// preemptionPoll is how often (seconds) a job node asks whether it is being preempted.
	preemptionPoll = 1
)

// metadataGet is a shell command printing a metadata value (path under computeMetadata/v1/),
// failing when the server does not answer or has no such value.
func metadataGet(path string) string {
	return `curl -sf --max-time 5 -H 'Metadata-Flavor: Google' "${` + EnvMetadataURL + `:-` + metadataDefault + `}/computeMetadata/v1/` + path + `"`
}

// nodeIPsCommand prints the gang's addresses, one per line.
var nodeIPsCommand = metadataGet("instance/attributes/" + metaNodeIPs)

// preemptionWatch is how a job node's watcher learns of a preemption: the metadata server's
// instance/preempted turns TRUE when GCE begins one. GCE does not say the time it leaves, so
// the watcher takes its 30 s notice (EnvPreemptionNotice where set) less the poll.
var preemptionWatch = vmnode.PreemptionWatch{
	Locals: `local left=$(( ${` + EnvPreemptionNotice + `:-30} - ` + strconv.Itoa(preemptionPoll) + ` ))
[ "$left" -ge 0 ] || left=0`,
	Warned:  `[ "$(` + metadataGet("instance/preempted") + `)" = TRUE ]`,
	Poll:    preemptionPoll,
	Warning: "preemption notice",
	Fate:    "the VM is being stopped",
}

// exitRetry is how long List waits before reading again the serial output of a stopped job
// node that marked no exit status.
const exitRetry = 15 * time.Second

// exitCode reads (once, then from the cache) the exit status a stopped job node marked on its
// serial console. The cache's key identifies the VM (zone, name and id, so a new VM of the
// same name is read afresh). ok is false while it is not there.
func (p *Provider) exitCode(ctx context.Context, zone string, vm *computepb.Instance) (int, bool) {
	key := zone + "/" + vm.GetName() + "/" + strconv.FormatUint(vm.GetId(), 10)
	return p.exits.Get(key, func() (string, error) {
		out, _, err := p.serialOutput(ctx, zone, vm.GetName(), 0)
		return out, err
	})
}

// serialOutput reads serial port 1 from byte offset start; next is where the next read starts.
func (p *Provider) serialOutput(ctx context.Context, zone, name string, start int64) (contents string, next int64, err error) {
	out, err := p.instances.GetSerialPortOutput(ctx, &computepb.GetSerialPortOutputInstanceRequest{
		Project: p.opts.Project, Zone: zone, Instance: name, Port: proto.Int32(1), Start: proto.Int64(start),
	})
	if err != nil {
		return "", start, classify(err, "get serial port output of "+name)
	}
	return out.GetContents(), out.GetNext(), nil
}

// withExitCode adds the exit status a stopped job node marked before it powered off. A node
// still STOPPING without one is reported running, so that it is not taken for lost.
func (p *Provider) withExitCode(ctx context.Context, zone string, vm *computepb.Instance, inst launcher.Instance) launcher.Instance {
	if inst.Labels[launcher.LabelJob] == "" || inst.State != launcher.StateTerminated {
		return inst
	}
	if rc, ok := p.exitCode(ctx, zone, vm); ok {
		inst.ExitCode = &rc
		inst.Reason = "exited with status " + strconv.Itoa(rc)
		return inst
	}
	if vm.GetStatus() == "STOPPING" {
		inst.State = launcher.StateRunning
		inst.Reason = "stopping; its exit status is not on its serial console yet"
		return inst
	}
	inst.Reason += " (stopped without an exit status on its serial console)"
	return inst
}

// setNodeIPs sets the gang's addresses, rank order, as an attribute of every node.
func (p *Provider) setNodeIPs(ctx context.Context, insts []launcher.Instance) error {
	ips := make([]string, len(insts))
	for i, in := range insts {
		ips[i] = in.IP
	}
	value := strings.Join(ips, "\n")
	for _, in := range insts {
		zone, name, err := parseID(in.ID)
		if err != nil {
			return err
		}
		if err := p.setMetadata(ctx, zone, name, metaNodeIPs, value); err != nil {
			return err
		}
	}
	return nil
}

// setMetadata sets one attribute of a VM, keeping the others: instances.setMetadata replaces
// them all, against the fingerprint of what it replaces, so a concurrent change makes it fail
// (412) and it is tried again on the new metadata.
func (p *Provider) setMetadata(ctx context.Context, zone, name, key, value string) error {
	for attempt := 0; ; attempt++ {
		vm, err := p.instances.Get(ctx, &computepb.GetInstanceRequest{Project: p.opts.Project, Zone: zone, Instance: name})
		if err != nil {
			return classify(err, "get "+name)
		}
		md := vm.GetMetadata()
		items := make([]*computepb.Items, 0, len(md.GetItems())+1)
		for _, it := range md.GetItems() {
			if it.GetKey() != key {
				items = append(items, it)
			}
		}
		items = append(items, &computepb.Items{Key: proto.String(key), Value: proto.String(value)})
		op, err := p.instances.SetMetadata(ctx, &computepb.SetMetadataInstanceRequest{
			Project: p.opts.Project, Zone: zone, Instance: name,
			MetadataResource: &computepb.Metadata{Fingerprint: md.Fingerprint, Items: items},
		})
		if err == nil {
			_, err = p.waitZoneOp(ctx, zone, op.Proto())
			if err != nil {
				return fmt.Errorf("gcp: set metadata of %s: %w", name, err)
			}
			return nil
		}
		if !isPrecondition(err) || attempt == 3 {
			return classify(err, "set metadata of "+name)
		}
	}
}

// isPrecondition reports a 412: the metadata changed since it was read.
func isPrecondition(err error) bool {
	var gerr *googleapi.Error
	return errors.As(err, &gerr) && gerr.Code == http.StatusPreconditionFailed
}
