package gcp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/google/uuid"
	"go.uber.org/zap"
	"google.golang.org/api/iterator"
	"google.golang.org/protobuf/proto"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/catalog"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

// Flex-start (Dynamic Workload Scheduler's queue, through the instances API). Offerings offer
// the accelerator-optimized machine types as queued capacity (flexOfferings); a placement the
// optimizer took from them (Placement.Queued, for resources.capacity.mode queued) gets
// flex-start VMs: provisioningModel FLEX_START, the
// task's max_run_duration as maxRunDuration (GCE's limit, 7 days, when it sets none), then
// instanceTerminationAction DELETE, no reservation, and max_wait as
// params.requestValidForDuration. GCE keeps such a VM PENDING until it has the capacity.
//
// The launch does not block on the queue: it inserts the VMs and answers launcher.ErrQueued
// (a QueuedError since the oldest VM's creation). The caller asks again; the VMs are found by
// the spec's labels (a job's id and attempt), so no second set is made, and once every node is
// RUNNING the launch returns them. A gang's program starts all at once either way: its nodes
// wait for the gang's addresses, set only when the last is RUNNING. A request GCE gave up on
// (a VM TERMINATED before it ran) fails the launch with ErrNoCapacity after its VMs are
// deleted; so does a gang of which some VMs were lost.
//
// MIG resize requests (InstanceGroupManagerResizeRequests) would get a gang's VMs in one
// atomic request and bill none of them while others wait; they need an instance template and
// a managed instance group per gang, and give every VM the same startup script, which Ferry
// does not do yet. With single flex-start VMs a node that starts first is billed until the
// last one does.

// maxFlexRun is GCE's limit on a flex-start VM's run.
const maxFlexRun = 7 * 24 * time.Hour

// flexFamilies are the machine families flex-start serves (accelerator-optimized, not A4X or
// G4).
var flexFamilies = []string{"a2-", "a3-", "a4-", "g2-"}

// flexWanted reports whether spec's VMs wait in GCE's flex-start queue: the optimizer chose
// queued capacity (a flexOfferings row) for it.
func flexWanted(spec launcher.Spec) bool {
	return spec.Placement.Queued && !spec.Placement.Spot && wantedReservation(spec) == ""
}

// flexCapable reports a machine type flex-start serves.
func flexCapable(machineType string) bool {
	return slices.ContainsFunc(flexFamilies, func(f string) bool { return strings.HasPrefix(machineType, f) })
}

// queueWaitUnknown is the QueueWait of flex-start capacity: GCE does not say how long its
// queue is (a request waits up to two hours), and a positive QueueWait is what marks an
// offering as queued.
const queueWaitUnknown = time.Nanosecond

// flexOfferings are the catalog's rows that flex-start serves in the allowed zones, as queued
// capacity. Their price is the catalog's on-demand price: flex-start is billed at a discount
// the catalog does not carry, so the plan shows an upper bound.
func (p *Provider) flexOfferings() []launcher.Offering {
	var out []launcher.Offering
	for _, r := range catalog.Default().Rows() {
		if r.Cloud != catalog.GCP || !flexCapable(r.InstanceType) || r.Zone == "" || !p.zoneAllowed(r.Zone) || r.OnDemandPerHour <= 0 {
			continue
		}
		out = append(out, launcher.Offering{InstanceType: r.InstanceType, Accelerator: r.Accelerator,
			AcceleratorCount: float64(r.AcceleratorCount), VCPUs: r.VCPUs, MemoryGiB: r.MemoryGiB, Region: r.Region,
			Zone: r.Zone, PricePerHour: r.OnDemandPerHour, QueueWait: queueWaitUnknown, Total: -1, Free: -1})
	}
	return out
}

// flexLimits are the VM's run limit and how long its request may wait (0: GCE's default).
func flexLimits(spec launcher.Spec) (run, wait time.Duration, err error) {
	run = maxFlexRun
	if c := spec.Resources.Capacity; c != nil {
		if c.MaxRunDuration > 0 {
			run = c.MaxRunDuration
		}
		wait = c.MaxWait
	}
	if run > maxFlexRun {
		return 0, 0, fmt.Errorf("gcp: %w: max_run_duration %v: flex-start VMs run at most 7 days", launcher.ErrInvalid, run)
	}
	return run, wait, nil
}

// flexVM makes vm a flex-start VM.
func flexVM(vm *computepb.Instance, run, wait time.Duration) {
	vm.Scheduling = &computepb.Scheduling{ProvisioningModel: proto.String("FLEX_START"),
		InstanceTerminationAction: proto.String("DELETE"), AutomaticRestart: proto.Bool(false),
		OnHostMaintenance: proto.String("TERMINATE"),
		MaxRunDuration:    &computepb.Duration{Seconds: proto.Int64(int64(run / time.Second))}}
	vm.ReservationAffinity = &computepb.ReservationAffinity{ConsumeReservationType: proto.String("NO_RESERVATION")}
	if wait > 0 {
		vm.Params = &computepb.InstanceParams{RequestValidForDuration: &computepb.Duration{Seconds: proto.Int64(int64(wait / time.Second))}}
	}
}

// launchFlex is Launch for one flex-start VM; setIPs gives a job's node its own address as
// its gang's.
func (p *Provider) launchFlex(ctx context.Context, spec launcher.Spec, setIPs bool) (launcher.Instance, error) {
	insts, err := p.launchFlexNodes(ctx, spec.Labels, []launcher.Spec{spec}, setIPs)
	if err != nil {
		return launcher.Instance{}, err
	}
	return insts[0], nil
}

// launchFlexGang is LaunchGang for flex-start VMs.
func (p *Provider) launchFlexGang(ctx context.Context, spec launcher.Spec, n int) ([]launcher.Instance, error) {
	if n < 1 {
		return nil, fmt.Errorf("gcp: %w: a gang needs at least one node, got %d", launcher.ErrInvalid, n)
	}
	spec, setIPs := vmnode.WithNodeIPsCommand(spec, nodeIPsCommand)
	specs := make([]launcher.Spec, n)
	for r := range n {
		specs[r] = launcher.GangNode(spec, r, n)
	}
	return p.launchFlexNodes(ctx, spec.Labels, specs, setIPs)
}

// launchFlexNodes finds the flex-start VMs of the nodes (by selector), or queues them, and
// returns them once all run (ErrQueued before).
func (p *Provider) launchFlexNodes(ctx context.Context, selector map[string]string, specs []launcher.Spec, setIPs bool) ([]launcher.Instance, error) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.LaunchTimeout)
	defer cancel()
	zone := specs[0].Placement.Zone
	vms, err := p.rawList(ctx, selector)
	if err != nil {
		return nil, err
	}
	failed := slices.ContainsFunc(vms, func(v zonedVM) bool { return stopped(v.vm) })
	if len(vms) > 0 && (len(vms) != len(specs) || failed) {
		for _, v := range vms {
			p.deleteQuietly(v.zone, v.vm.GetName())
		}
		why := "some of its VMs are gone"
		if failed {
			why = "GCE ended a request or a run (" + vms[slices.IndexFunc(vms, func(v zonedVM) bool { return stopped(v.vm) })].vm.GetStatusMessage() + ")"
		}
		return nil, fmt.Errorf("gcp: %w: flex-start request for %d VM(s) in %s failed: %s; deleted its VMs", launcher.ErrNoCapacity, len(specs), zone, why)
	}
	if len(vms) == 0 {
		if vms, err = p.insertFlex(ctx, specs, zone); err != nil {
			return nil, err
		}
	}
	return p.flexReady(ctx, vms, specs[0], setIPs)
}

// zonedVM is a VM and its zone.
type zonedVM struct {
	zone string
	vm   *computepb.Instance
}

// rawList lists Ferry's VMs whose labels include selector, in every listed zone.
func (p *Provider) rawList(ctx context.Context, selector map[string]string) ([]zonedVM, error) {
	filter := ownedFilter(selector)
	var out []zonedVM
	for _, zone := range p.listZones() {
		vms, err := p.rawListZone(ctx, zone, filter)
		if err != nil {
			return nil, err
		}
		for _, vm := range vms {
			out = append(out, zonedVM{zone: zone, vm: vm})
		}
	}
	return out, nil
}

// ownedFilter is the API filter for Ferry's VMs whose labels include selector.
func ownedFilter(selector map[string]string) string {
	sel := maps.Clone(selector)
	if sel == nil {
		sel = map[string]string{}
	}
	sel[launcher.LabelOwner] = "true"
	return labelFilter(encodeLabels(sel))
}

// rawListZone lists the VMs of zone that filter matches.
func (p *Provider) rawListZone(ctx context.Context, zone, filter string) ([]*computepb.Instance, error) {
	var out []*computepb.Instance
	it := p.instances.List(ctx, &computepb.ListInstancesRequest{Project: p.opts.Project, Zone: zone, Filter: proto.String(filter)})
	for {
		vm, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return nil, classify(err, "list instances in "+zone)
		}
		out = append(out, vm)
	}
}

// insertFlex queues one flex-start VM per spec in zone; if any insert fails, those made are
// deleted and its error returned.
func (p *Provider) insertFlex(ctx context.Context, specs []launcher.Spec, zone string) ([]zonedVM, error) {
	run, wait, err := flexLimits(specs[0])
	if err != nil {
		return nil, err
	}
	if err := p.ensureFirewall(ctx, portOf(specs[0]), ""); err != nil {
		return nil, err
	}
	if specs[0].Job != nil {
		if err := p.ensureJobsRule(ctx); err != nil {
			return nil, err
		}
	}
	p.mu.Lock()
	p.launchedZones[zone] = true
	p.mu.Unlock()
	var out []zonedVM
	for _, s := range specs {
		vm, err := p.instanceFor(ctx, s, zone)
		if err == nil {
			flexVM(vm, run, wait)
			withGrace(vm, s)
			err = p.insertAndWait(ctx, zone, vm)
		}
		if err != nil {
			if vm != nil {
				p.deleteQuietly(zone, vm.GetName())
			}
			for _, v := range out {
				p.deleteQuietly(zone, v.vm.GetName())
			}
			return nil, err
		}
		out = append(out, zonedVM{zone: zone, vm: vm})
	}
	p.log.Info("flex-start request queued", zap.String("zone", zone), zap.Int("vms", len(specs)),
		zap.String("machine_type", specs[0].Placement.InstanceType), zap.Duration("max_run", run), zap.Duration("max_wait", wait))
	return out, nil
}

// insertAndWait inserts vm and waits for the insert operation.
func (p *Provider) insertAndWait(ctx context.Context, zone string, vm *computepb.Instance) error {
	op, err := p.instances.Insert(ctx, &computepb.InsertInstanceRequest{
		Project: p.opts.Project, Zone: zone, InstanceResource: vm, RequestId: proto.String(uuid.NewString()),
	})
	if err != nil {
		return launchError(classify(err, "insert "+vm.GetName()+" in "+zone))
	}
	if _, err := p.waitZoneOp(ctx, zone, op.Proto()); err != nil {
		return launchError(fmt.Errorf("gcp: insert %s in %s: %w", vm.GetName(), zone, err))
	}
	return nil
}

// flexReady returns the nodes once every VM is RUNNING with an address, their addresses set
// for a gang, and a QueuedError before.
func (p *Provider) flexReady(ctx context.Context, vms []zonedVM, spec launcher.Spec, setIPs bool) ([]launcher.Instance, error) {
	var since time.Time
	waiting := 0
	for i, v := range vms {
		if v.vm.GetStatus() == "" { // just inserted: read it back
			got, err := p.instances.Get(ctx, &computepb.GetInstanceRequest{Project: p.opts.Project, Zone: v.zone, Instance: v.vm.GetName()})
			if err != nil {
				return nil, classify(err, "get "+v.vm.GetName())
			}
			vms[i].vm = got
			v = vms[i]
		}
		created, _ := time.Parse(time.RFC3339, v.vm.GetCreationTimestamp())
		if since.IsZero() || created.Before(since) {
			since = created
		}
		if v.vm.GetStatus() != "RUNNING" || address(v.vm, p.opts.PublicIP) == "" {
			waiting++
		}
	}
	if waiting > 0 {
		return nil, launcher.Queued(since, "GCP flex-start: %d of %d %s VM(s) in %s wait in the Dynamic Workload Scheduler queue",
			waiting, len(vms), spec.Placement.InstanceType, vms[0].zone)
	}
	insts := make([]launcher.Instance, len(vms))
	for i, v := range vms {
		insts[i] = p.toInstance(v.zone, v.vm, nil)
	}
	slices.SortFunc(insts, func(a, b launcher.Instance) int {
		ra, _ := strconv.Atoi(a.Labels[launcher.LabelNodeRank])
		rb, _ := strconv.Atoi(b.Labels[launcher.LabelNodeRank])
		return cmp.Compare(ra, rb)
	})
	if err := p.ensureFirewall(ctx, portOf(spec), address(vms[0].vm, p.opts.PublicIP)); err != nil {
		return nil, err
	}
	if setIPs {
		if err := p.setNodeIPs(ctx, insts); err != nil {
			return nil, err
		}
	}
	p.log.Info("flex-start VMs running", zap.String("zone", vms[0].zone), zap.Int("vms", len(vms)))
	return insts, nil
}

var (
	_ launcher.QueueWithdrawer = (*Provider)(nil)
	_ launcher.JobCleaner      = (*Provider)(nil)
)

// WithdrawQueued deletes job's flex-start VMs still waiting in GCE's queue (PENDING): its gang
// runs, so they would start for nobody. A wait for a reservation's window holds nothing.
func (p *Provider) WithdrawQueued(ctx context.Context, job string, _ int) error {
	return p.deleteJobVMs(ctx, job, func(vm *computepb.Instance) bool { return vm.GetStatus() == "PENDING" })
}

// CleanupJob deletes every VM of an ended job that is left: queued flex-start VMs the job never
// used, or ones that GCE started after it ended. (Checkpoints on checkpoint_nfs are kept.)
func (p *Provider) CleanupJob(ctx context.Context, job string) error {
	return p.deleteJobVMs(ctx, job, func(*computepb.Instance) bool { return true })
}

func (p *Provider) deleteJobVMs(ctx context.Context, job string, which func(*computepb.Instance) bool) error {
	vms, err := p.rawList(ctx, map[string]string{launcher.LabelJob: job})
	if err != nil {
		return err
	}
	var errs []error
	for _, v := range vms {
		if which(v.vm) {
			if err := p.delete(ctx, v.zone, v.vm.GetName()); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
