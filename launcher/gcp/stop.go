package gcp

import (
	"context"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/ferryserve/ferry/launcher"
)

// Stopping a job's node with its grace period. Deleting a VM gives its guest no time a
// program can count on, so Terminate first asks a running job node's watcher to stop the run:
// it sets the metaStop attribute, which the watcher polls (watchFor) and answers with SIGTERM
// to the run and the grace in the preemption file, then waits until the node's console says the
// run ended, or the grace (from the node's metaGrace) and two polls have passed, before it
// deletes the VM. A cancel, a run limit and a reservation's end all stop a job this way.
const (
	// metaStop is the attribute that asks a job node's watcher to stop the run ("TRUE").
	metaStop = "ferry-stop"
	// metaGrace is a job node's grace period in seconds, for Terminate.
	metaGrace = "ferry-grace-seconds"
	// runEnded is what the node's boot script prints once a warned run has ended.
	runEnded = "ferry: the run ended with status"
)

// withGrace records a job node's grace period in its metadata.
func withGrace(vm *computepb.Instance, spec launcher.Spec) {
	if spec.Job == nil {
		return
	}
	vm.Metadata.Items = append(vm.Metadata.Items, &computepb.Items{Key: proto.String(metaGrace),
		Value: proto.String(strconv.FormatInt(graceSeconds(spec), 10))})
}

// stopGracefully stops a running job node's run with its grace period, as above; it does
// nothing for a VM that is not one (a replica, a node that ended, one made before metaGrace).
func (p *Provider) stopGracefully(ctx context.Context, zone, name string) {
	vm, err := p.instances.Get(ctx, &computepb.GetInstanceRequest{Project: p.opts.Project, Zone: zone, Instance: name})
	if err != nil || vm.GetStatus() != "RUNNING" || decodeLabels(vm.GetLabels())[launcher.LabelJob] == "" {
		return
	}
	grace, err := strconv.Atoi(metadataValue(vm, metaGrace))
	if err != nil {
		return
	}
	if err := p.setMetadata(ctx, zone, name, metaStop, "TRUE"); err != nil {
		p.log.Warn("ask a job node to stop; deleting it at once", zap.String("instance", name), zap.Error(err))
		return
	}
	deadline := time.NewTimer(time.Duration(grace+2*preemptionPoll) * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(p.opts.PollInterval)
	defer tick.Stop()
	var seen string
	var offset int64
	for {
		out, next, err := p.serialOutput(ctx, zone, name, offset)
		if err == nil {
			// Keep the tail of what was read, so the line is found across two reads.
			seen = seen[max(0, len(seen)-len(runEnded)):] + out
			offset = next
			if strings.Contains(seen, runEnded) {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			p.log.Warn("a job node's run did not end within its grace period; deleting it", zap.String("instance", name), zap.Int("grace_seconds", grace))
			return
		case <-tick.C:
		}
	}
}
