package gcp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/catalog"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

// Reservations (calendar mode). A GCP reservation holds a count of VMs of one shape in one
// zone; a future reservation asks for one from a start time to an end time, and at the start
// GCP creates (auto-creates) that reservation, named by the future reservation's
// reservationName. The provider
//
//   - lists both (Reservations, for `ferry show-gpus --reservations`, and Offerings, one per
//     reservation a VM may target by name, so the optimizer can put a task in it at marginal
//     cost zero);
//   - launches into one (Placement.Reservation, else resources.capacity.reservation, `any` =
//     the first that fits in the zone) with reservationAffinity SPECIFIC_RESERVATION; a
//     future reservation's VMs, which GCP stops at its end, are reservation-bound
//     (provisioningModel RESERVATION_BOUND, instanceTerminationAction DELETE);
//   - before a future reservation's window starts, answers launcher.ErrQueued (a
//     QueuedError saying when it starts) instead of launching;
//   - tells when its VMs will be taken: each VM carries the window's end as metadata, a job's
//     node sends its run SIGTERM its grace period before it (watchFor), and Notices reports it
//     ahead of time (windowNotices).
//
// Only reservations with specificReservationRequired may be targeted by name (GCP refuses the
// others; they are consumed by any matching VM, Ferry's too, without being asked).

// reservationKey is the reservationAffinity key that names a specific reservation.
const reservationKey = "compute.googleapis.com/reservation-name"

// metaWindowEnd is the metadata attribute with the end of a VM's capacity window (RFC 3339).
const metaWindowEnd = "ferry-window-end"

// capacityClients are the reservation clients (closed with the provider).
type capacityClients struct {
	reservations *compute.ReservationsClient
	futureRes    *compute.FutureReservationsClient
}

func (p *Provider) newCapacityClients(ctx context.Context, copts []option.ClientOption) error {
	var err error
	if p.reservations, err = compute.NewReservationsRESTClient(ctx, copts...); err != nil {
		return fmt.Errorf("gcp: %w: reservations client: %w", launcher.ErrUnauthorized, err)
	}
	if p.futureRes, err = compute.NewFutureReservationsRESTClient(ctx, copts...); err != nil {
		return fmt.Errorf("gcp: %w: future reservations client: %w", launcher.ErrUnauthorized, err)
	}
	return nil
}

func (c *capacityClients) close() {
	if c.reservations != nil {
		_ = c.reservations.Close()
	}
	if c.futureRes != nil {
		_ = c.futureRes.Close()
	}
}

var (
	_ launcher.Reserver = (*Provider)(nil)
	_ launcher.Offerer  = (*Provider)(nil)
)

// zoneReservations is what one zone holds.
type zoneReservations struct {
	reservations []*computepb.Reservation
	future       []*computepb.FutureReservation
}

func (p *Provider) listReservations(ctx context.Context, zone string) (zoneReservations, error) {
	var out zoneReservations
	it := p.reservations.List(ctx, &computepb.ListReservationsRequest{Project: p.opts.Project, Zone: zone})
	for {
		r, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			return out, classify(err, "list reservations in "+zone)
		}
		out.reservations = append(out.reservations, r)
	}
	fit := p.futureRes.List(ctx, &computepb.ListFutureReservationsRequest{Project: p.opts.Project, Zone: zone})
	for {
		f, err := fit.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return out, classify(err, "list future reservations in "+zone)
		}
		out.future = append(out.future, f)
	}
}

// Reservations lists the reservations and the future reservations not yet delivered in every
// listed zone: a delivered one appears as the reservation GCP made for it, with its end.
//
// Zones are asked at once, as List asks them: a zone that fails is a launcher.Gap in a
// *launcher.PartialListError returned with the other zones' reservations, so one broken zone
// never hides the reservations of the rest.
func (p *Provider) Reservations(ctx context.Context) ([]launcher.ReservationOffer, error) {
	zones := p.listZones()
	per, gaps := eachZone(ctx, zones, func(ctx context.Context, zone string) ([]launcher.ReservationOffer, error) {
		zr, err := p.listReservations(ctx, zone)
		if err != nil {
			return nil, err
		}
		return zr.offers(zone, time.Now()), nil
	})
	return slices.Concat(per...), wholeIfEveryZone(gaps, len(zones))
}

// offers are a zone's reservations as ReservationOffers: every reservation, and every future
// reservation whose window has not started.
func (zr zoneReservations) offers(zone string, now time.Time) []launcher.ReservationOffer {
	var out []launcher.ReservationOffer
	ends, names := map[string]time.Time{}, map[string]string{}
	for _, f := range zr.future {
		_, end := futureWindow(f)
		ends[reservationNameOf(f)], names[reservationNameOf(f)] = end, f.GetName()
	}
	for _, r := range zr.reservations {
		sku := r.GetSpecificReservation()
		o := shapeOffer(zone, sku.GetInstanceProperties())
		o.ID, o.Name, o.Kind = r.GetName(), r.GetName(), launcher.KindGCPReservation
		o.Count, o.InUse = int(sku.GetCount()), int(sku.GetInUseCount())
		o.End, _ = time.Parse(time.RFC3339, r.GetDeleteAtTime())
		if end, ok := ends[r.GetName()]; ok && o.End.IsZero() {
			o.End = end
		}
		if name, ok := names[r.GetName()]; ok {
			o.Name = name // delivered for a future reservation, found by its name too
		}
		out = append(out, o)
	}
	for _, f := range zr.future {
		start, end := futureWindow(f)
		if !futurePending(f) || !end.After(now) {
			continue
		}
		sku := f.GetSpecificSkuProperties()
		o := shapeOffer(zone, sku.GetInstanceProperties())
		o.ID, o.Name, o.Kind = reservationNameOf(f), f.GetName(), launcher.KindGCPFutureReservation
		o.Start, o.End, o.Count = start, end, int(sku.GetTotalCount())
		out = append(out, o)
	}
	return out
}

// futurePending reports a future reservation whose reservation GCP has not made yet and still
// may: neither delivered nor refused, cancelled or over.
func futurePending(f *computepb.FutureReservation) bool {
	switch f.GetStatus().GetProcurementStatus() {
	case "FULFILLED", "FAILED", "CANCELLED", "EXPIRED", "DECLINED", "PROCURING_FAILED", "FAILED_PARTIALLY_FULFILLED":
		return false
	}
	return true
}

func futureWindow(f *computepb.FutureReservation) (start, end time.Time) {
	tw := f.GetTimeWindow()
	start, _ = time.Parse(time.RFC3339, tw.GetStartTime())
	if e, err := time.Parse(time.RFC3339, tw.GetEndTime()); err == nil {
		end = e
	} else if d := tw.GetDuration(); d != nil && !start.IsZero() {
		end = start.Add(time.Duration(d.GetSeconds()) * time.Second)
	}
	return start, end
}

// reservationNameOf is the name of the reservation a future reservation makes.
func reservationNameOf(f *computepb.FutureReservation) string {
	if n := f.GetReservationName(); n != "" {
		return n
	}
	return f.GetName()
}

// shapeOffer fills where a reservation is and what one of its VMs is (from the catalog when
// it has the machine type in the zone).
func shapeOffer(zone string, props *computepb.AllocationSpecificSKUAllocationReservedInstanceProperties) launcher.ReservationOffer {
	o := launcher.ReservationOffer{Infra: InfraName, Region: regionOf(zone), Zone: zone,
		InstanceType: lastSegment(props.GetMachineType())}
	if accs := props.GetGuestAccelerators(); len(accs) > 0 {
		o.Accelerator = acceleratorName(accs[0].GetAcceleratorType())
	} else if row, ok := catalogRow(o.InstanceType, "", zone); ok {
		o.Accelerator = row.Accelerator
	}
	return o
}

// acceleratorName is the catalog's name for a GCP accelerator type ("nvidia-tesla-t4" → T4).
func acceleratorName(accType string) string {
	accType = lastSegment(accType)
	for name, t := range acceleratorTypes {
		if t == accType {
			return name
		}
	}
	return strings.ToUpper(strings.TrimPrefix(accType, "nvidia-"))
}

// catalogRow is the catalog's row for machineType (with accelerator, for n1 + GPU rows; ""
// takes a machine's built-in GPUs) in zone, else in any zone.
func catalogRow(machineType, accelerator, zone string) (catalog.Row, bool) {
	var found catalog.Row
	ok := false
	for _, r := range catalog.Default().Rows() {
		if r.Cloud != catalog.GCP || r.InstanceType != machineType || (accelerator != "" && !strings.EqualFold(r.Accelerator, accelerator)) {
			continue
		}
		if r.Zone == zone {
			return r, true
		}
		if !ok {
			found, ok = r, true
		}
	}
	return found, ok
}

// Offerings are the reservations a VM may be launched into, one offering each, with the
// reservation on it (delivered ones with room, and future ones not yet started), and the
// flex-start queue's machine types (flexOfferings). Every other shape comes from the catalog.
func (p *Provider) Offerings(ctx context.Context) ([]launcher.Offering, error) {
	offers, err := p.Reservations(ctx)
	out := p.flexOfferings()
	for _, o := range offers {
		if o.Kind == launcher.KindGCPReservation && o.Free() == 0 {
			continue
		}
		row, _ := catalogRow(o.InstanceType, o.Accelerator, o.Zone)
		res := o
		out = append(out, launcher.Offering{InstanceType: o.InstanceType, Accelerator: row.Accelerator,
			AcceleratorCount: float64(row.AcceleratorCount), VCPUs: row.VCPUs, MemoryGiB: row.MemoryGiB,
			Region: o.Region, Zone: o.Zone, PricePerHour: row.OnDemandPerHour,
			Total: o.Count * row.AcceleratorCount, Free: o.Free() * row.AcceleratorCount, Reservation: &res})
	}
	return out, err
}

// reservationTarget is what a launch into a reservation targets: the reservation's name, the
// end of its window (zero: none) and whether its VMs are bound to it (a future reservation's,
// which end with it).
type reservationTarget struct {
	name  string
	end   time.Time
	bound bool
}

// wantedReservation is the reservation spec asks for: the optimizer's pick, else the task's
// resources.capacity.reservation; "" asks for none.
func wantedReservation(spec launcher.Spec) string {
	if spec.Placement.Reservation != "" {
		return spec.Placement.Reservation
	}
	if c := spec.Resources.Capacity; c != nil && c.Mode == configs.CapacityReserved {
		if c.Reservation == "" {
			return configs.ReservationAny
		}
		return c.Reservation
	}
	return ""
}

// resolveReservation finds the reservation named want (a reservation, a future reservation or
// the reservation it makes; configs.ReservationAny takes the first one in the zone that fits
// machineType and has room). A future reservation whose window has not started is a
// launcher.QueuedError; one that is full is ErrNoCapacity; one that does not exist ErrInvalid.
func (p *Provider) resolveReservation(ctx context.Context, zone, want, machineType string) (reservationTarget, error) {
	want = lastSegment(want) // "projects/P/reservations/NAME" names NAME
	zr, err := p.listReservations(ctx, zone)
	if err != nil {
		return reservationTarget{}, err
	}
	now := time.Now()
	for _, o := range zr.offers(zone, now) {
		if want != configs.ReservationAny && o.ID != want && o.Name != want {
			continue
		}
		if want == configs.ReservationAny && (o.InstanceType != machineType || o.Kind != launcher.KindGCPReservation || o.Free() == 0) {
			continue
		}
		if o.InstanceType != machineType {
			return reservationTarget{}, fmt.Errorf("gcp: %w: reservation %s holds %s VMs, not %s", launcher.ErrInvalid, want, o.InstanceType, machineType)
		}
		if o.Kind == launcher.KindGCPFutureReservation {
			return reservationTarget{}, launcher.Queued(now, "GCP future reservation %s in %s starts at %s (reservation %s, %d VMs until %s)",
				o.Name, zone, o.Start.UTC().Format(time.RFC3339), o.ID, o.Count, o.End.UTC().Format(time.RFC3339))
		}
		if o.Free() == 0 {
			return reservationTarget{}, fmt.Errorf("gcp: %w: reservation %s in %s is full (%d of %d VMs in use)", launcher.ErrNoCapacity, o.ID, zone, o.InUse, o.Count)
		}
		bound := slices.ContainsFunc(zr.future, func(f *computepb.FutureReservation) bool {
			return reservationNameOf(f) == o.ID && f.GetReservationMode() == "CALENDAR"
		})
		return reservationTarget{name: o.ID, end: o.End, bound: bound}, nil
	}
	if want == configs.ReservationAny {
		return reservationTarget{}, fmt.Errorf("gcp: %w: no reservation in %s with room for a %s VM", launcher.ErrNoCapacity, zone, machineType)
	}
	return reservationTarget{}, fmt.Errorf("gcp: %w: no reservation or future reservation %q in %s", launcher.ErrInvalid, want, zone)
}

// reserve points vm at the reservation: specific affinity, bound to it when it ends with it,
// and the window's end in its metadata (what Notices reads when GCE does not say it).
func (t reservationTarget) reserve(vm *computepb.Instance) {
	vm.ReservationAffinity = &computepb.ReservationAffinity{ConsumeReservationType: proto.String("SPECIFIC_RESERVATION"),
		Key: proto.String(reservationKey), Values: []string{t.name}}
	if t.bound {
		vm.Scheduling.ProvisioningModel = proto.String("RESERVATION_BOUND")
		vm.Scheduling.InstanceTerminationAction = proto.String("DELETE")
		vm.Scheduling.AutomaticRestart = proto.Bool(false)
		vm.Scheduling.OnHostMaintenance = proto.String("TERMINATE")
	}
	if !t.end.IsZero() {
		vm.Metadata.Items = append(vm.Metadata.Items, &computepb.Items{Key: proto.String(metaWindowEnd),
			Value: proto.String(t.end.UTC().Format(time.RFC3339))})
	}
}

// watchFor is the job node's watcher for spec: GCE's preemption notice; Ferry's stop request
// (metaStop, which Terminate sets, stop.go); and, when the node's capacity ends at a known time
// (its reservation's window) or after a run limit (resources.capacity.max_run_duration, GCE's
// maxRunDuration, counted from boot), that end. On any of them the run gets SIGTERM: for an
// end, its grace period (at least the poll) before it; for a stop request, with its grace
// ahead. The seconds left go to the preemption file, so it checkpoints before the VM goes.
func watchFor(spec launcher.Spec) vmnode.PreemptionWatch {
	if spec.Job == nil {
		return preemptionWatch
	}
	end := ""
	if !spec.Placement.WindowEnd.IsZero() {
		end = strconv.FormatInt(spec.Placement.WindowEnd.Unix(), 10)
	}
	if c := spec.Resources.Capacity; c != nil && c.MaxRunDuration > 0 {
		run := `$(( $(date +%s) + ` + strconv.FormatInt(int64(c.MaxRunDuration/time.Second), 10) + ` ))`
		if end == "" {
			end = run
		} else {
			end = `$(( ` + run + ` < ` + end + ` ? ` + run + ` : ` + end + ` ))`
		}
	}
	w := preemptionWatch
	stopAsked := `[ "$(` + metadataGet("instance/attributes/"+metaStop) + `)" = TRUE ]`
	w.Locals += "\nlocal ferry_grace=" + strconv.FormatInt(graceSeconds(spec), 10)
	w.Warned = `{ ` + stopAsked + ` || ` + preemptionWatch.Warned + `; }`
	w.SecondsLeft = `if ` + stopAsked + `; then left=$ferry_grace; fi`
	w.Warning = "stop request or preemption notice"
	if end != "" {
		w.Locals += "\nlocal ferry_end=" + end + "\nlocal ferry_stop=$(( ferry_end - ferry_grace ))"
		w.Warned = `{ [ "$(date +%s)" -ge "$ferry_stop" ] || ` + stopAsked + ` || ` + preemptionWatch.Warned + `; }`
		w.SecondsLeft = `if [ "$(date +%s)" -ge "$ferry_stop" ]; then left=$(( ferry_end - $(date +%s) )); [ "$left" -ge 0 ] || left=0; elif ` +
			stopAsked + `; then left=$ferry_grace; fi`
		w.Warning = "capacity window end, stop request or preemption notice"
	}
	return w
}

// graceSeconds is a job node's grace period in whole seconds, at least the watcher's poll.
func graceSeconds(spec launcher.Spec) int64 {
	if spec.Job == nil {
		return preemptionPoll
	}
	return max(int64(spec.Job.Grace/time.Second), preemptionPoll)
}

// reservationFor resolves the reservation spec asks for in zone (nil: none) and sets the
// placement's window end from it, for the node's watcher.
func (p *Provider) reservationFor(ctx context.Context, spec *launcher.Spec, zone string) (*reservationTarget, error) {
	want := wantedReservation(*spec)
	if want == "" {
		return nil, nil
	}
	if spec.Placement.Spot {
		return nil, fmt.Errorf("gcp: %w: Spot VMs cannot consume reservations", launcher.ErrInvalid)
	}
	machineType := spec.Placement.InstanceType
	if machineType == "" {
		machineType = DefaultMachineType
	}
	t, err := p.resolveReservation(ctx, zone, want, machineType)
	if err != nil {
		return nil, err
	}
	if spec.Placement.WindowEnd.IsZero() || (!t.end.IsZero() && t.end.Before(spec.Placement.WindowEnd)) {
		spec.Placement.WindowEnd = t.end
	}
	spec.Placement.Reservation = t.name
	return &t, nil
}

// endOf is when GCE will end a VM: its resourceStatus.scheduling.terminationTimestamp, else
// the window end Ferry put in its metadata, else its start plus maxRunDuration; zero for none.
func endOf(vm *computepb.Instance) time.Time {
	if t, err := time.Parse(time.RFC3339, vm.GetResourceStatus().GetScheduling().GetTerminationTimestamp()); err == nil {
		return t
	}
	if t, err := time.Parse(time.RFC3339, metadataValue(vm, metaWindowEnd)); err == nil {
		return t
	}
	run := vm.GetScheduling().GetMaxRunDuration()
	start, err := time.Parse(time.RFC3339, vm.GetLastStartTimestamp())
	if run == nil || err != nil {
		return time.Time{}
	}
	return start.Add(time.Duration(run.GetSeconds()) * time.Second)
}
