package fakecompute

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"

	"github.com/ferryserve/ferry/launcher/internal/fakevm"
)

// Reservations and future reservations (calendar mode), as far as Ferry uses them:
//
//   - reservations: insert, get, list, delete. A reservation holds specificReservation.count
//     VMs of its instanceProperties (machine type, accelerators); a VM consumes it with
//     reservationAffinity SPECIFIC_RESERVATION, key ReservationKey, values [name], and only if
//     specificReservationRequired is set (GCP refuses to target one that is not). inUseCount
//     is counted from the live VMs that consume it. An insert beyond count fails as GCP's
//     full reservations do; one naming a reservation that does not exist fails with GCP's
//     wording.
//   - futureReservations: insert, get, list. A future reservation asks for
//     specificSkuProperties.totalCount VMs in timeWindow (startTime, endTime). The fake
//     approves it at once (GCP reviews it first), and at startTime creates the reservation
//     (named reservationName, else the future reservation's name) with deleteAtTime at
//     endTime; status.procurementStatus goes APPROVED → FULFILLED. At endTime the reservation
//     is deleted and, in CALENDAR mode, the VMs that consume it are stopped or deleted by
//     their instanceTerminationAction (deleted when it says DELETE), as GCP ends
//     reservation-bound VMs with their reservation. Their
//     resourceStatus.scheduling.terminationTimestamp says when, from the moment they start.
//
// Windows run on the wall clock, so tests use windows seconds long; StartWindow and EndWindow
// move one on at once for tests that must not wait.

// ReservationKey is the reservationAffinity key that names a specific reservation.
const ReservationKey = "compute.googleapis.com/reservation-name"

// Procurement statuses of a future reservation that the fake goes through.
const (
	ProcurementApproved  = "APPROVED"
	ProcurementFulfilled = "FULFILLED"
	ProcurementExpired   = "EXPIRED" // the window ended (GCP's FAILED/CANCELLED are not modelled)
)

// capacityState is the reservations' and flex-start's part of the Server.
type capacityState struct {
	reservations map[string]*computepb.Reservation       // zone + "/" + name
	future       map[string]*computepb.FutureReservation // zone + "/" + name
	// flexDelay is how long a flex-start VM waits in the queue (SetFlexStartDelay).
	flexDelay time.Duration
	// flexTimer is the pending fulfilment per zone: every flex-start VM queued in the zone
	// when it fires starts at once.
	flexTimer map[string]bool
}

func (s *Server) routeCapacity(p string) {
	s.capacityState = capacityState{reservations: map[string]*computepb.Reservation{},
		future: map[string]*computepb.FutureReservation{}, flexDelay: -1, flexTimer: map[string]bool{}}
	s.route("POST "+p+"zones/{zone}/reservations", OpReservationsInsert, s.insertReservation)
	s.route("GET "+p+"zones/{zone}/reservations", OpReservationsList, s.listReservations)
	s.route("GET "+p+"zones/{zone}/reservations/{name}", OpReservationsGet, s.getReservation)
	s.route("DELETE "+p+"zones/{zone}/reservations/{name}", OpReservationsDelete, s.deleteReservation)
	s.route("POST "+p+"zones/{zone}/futureReservations", OpFutureReservationsInsert, s.insertFutureReservation)
	s.route("GET "+p+"zones/{zone}/futureReservations", OpFutureReservationsList, s.listFutureReservations)
	s.route("GET "+p+"zones/{zone}/futureReservations/{name}", OpFutureReservationsGet, s.getFutureReservation)
}

// stubTarget is what an operation on a reservation targets.
func (s *Server) stubTarget(link string) *computepb.Instance {
	s.nextID++
	return &computepb.Instance{SelfLink: proto.String(link), Id: proto.Uint64(s.nextID)}
}

func (s *Server) reservationURL(zone, name string) string {
	return s.zoneURL(zone) + "/reservations/" + name
}

func (s *Server) insertReservation(w http.ResponseWriter, r *http.Request) {
	req := &computepb.Reservation{}
	if !decodeBody(w, r, req) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	zone, _, ok := s.zone(w, r)
	if !ok {
		return
	}
	if !nameRE.MatchString(req.GetName()) {
		errInvalid(fmt.Sprintf("Invalid value for field 'resource.name': '%s'.", req.GetName())).write(w)
		return
	}
	sku := req.GetSpecificReservation()
	if sku.GetCount() <= 0 || sku.GetInstanceProperties().GetMachineType() == "" {
		errInvalid("Invalid value for field 'resource.specificReservation': a count and instanceProperties.machineType are required.").write(w)
		return
	}
	if _, dup := s.reservations[zone+"/"+req.GetName()]; dup {
		errConflict("projects/" + s.opts.Project + "/zones/" + zone + "/reservations/" + req.GetName()).write(w)
		return
	}
	pb := s.addReservationLocked(zone, req)
	if end, err := time.Parse(time.RFC3339, req.GetDeleteAtTime()); err == nil {
		// GCP deletes it then; the VMs that consumed it run on, no longer reserved.
		s.atLocked(end, func() {
			if s.reservations[zone+"/"+req.GetName()] == pb {
				delete(s.reservations, zone+"/"+req.GetName())
			}
		})
	}
	op := s.newOperationLocked(zone, "insert", s.stubTarget(pb.GetSelfLink()))
	s.afterDelay(op, func() {})
	writeJSON(w, op.pb)
}

// addReservationLocked stores a READY reservation with the server's fields filled in.
func (s *Server) addReservationLocked(zone string, req *computepb.Reservation) *computepb.Reservation {
	pb := proto.CloneOf(req)
	s.nextID++
	pb.Kind = proto.String("compute#reservation")
	pb.Id = proto.Uint64(s.nextID)
	pb.Zone = proto.String(s.zoneURL(zone))
	pb.SelfLink = proto.String(s.reservationURL(zone, req.GetName()))
	pb.Status = proto.String("READY")
	pb.CreationTimestamp = proto.String(time.Now().Format(timeLayout))
	pb.SpecificReservation.InUseCount = proto.Int64(0)
	s.reservations[zone+"/"+req.GetName()] = pb
	return pb
}

// reservationView is a copy of a reservation with its inUseCount counted now.
func (s *Server) reservationView(zone string, pb *computepb.Reservation) *computepb.Reservation {
	out := proto.CloneOf(pb)
	out.SpecificReservation.InUseCount = proto.Int64(int64(len(s.consumersLocked(zone, pb.GetName()))))
	return out
}

// consumersLocked are the live VMs of zone that consume the named reservation.
func (s *Server) consumersLocked(zone, name string) []*instance {
	var out []*instance
	for _, in := range s.zones[zone].instances {
		if in.pb.GetStatus() != "TERMINATED" && consumes(in.pb, name) {
			out = append(out, in)
		}
	}
	return out
}

// consumes reports whether pb targets the named reservation.
func consumes(pb *computepb.Instance, name string) bool {
	ra := pb.GetReservationAffinity()
	return ra.GetConsumeReservationType() == "SPECIFIC_RESERVATION" && ra.GetKey() == ReservationKey &&
		slices.ContainsFunc(ra.GetValues(), func(v string) bool { return lastSegment(v) == name })
}

func (s *Server) listReservations(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if zone, _, ok := s.zone(w, r); ok {
		writeZonedList(w, r, zone, s.reservations, func(pb *computepb.Reservation) *computepb.Reservation { return s.reservationView(zone, pb) },
			func(page []*computepb.Reservation, next *string) proto.Message {
				return &computepb.ReservationList{Kind: proto.String("compute#reservationList"), Items: page, NextPageToken: next}
			})
	}
}

func (s *Server) getReservation(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if zone, _, ok := s.zone(w, r); ok {
		writeZonedGet(w, r, "projects/"+s.opts.Project+"/zones/"+zone+"/reservations/", s.reservations[zone+"/"+r.PathValue("name")],
			func(pb *computepb.Reservation) *computepb.Reservation { return s.reservationView(zone, pb) })
	}
}

// writeZonedList answers a list of the zone's items of m (keyed "ZONE/NAME"), in key order,
// each shown through view, a page at a time in the response wrap makes. s.mu is held.
func writeZonedList[T interface{ GetZone() string }](w http.ResponseWriter, r *http.Request, zone string, m map[string]T, view func(T) T, wrap func([]T, *string) proto.Message) {
	var items []T
	for _, key := range slices.Sorted(maps.Keys(m)) {
		if pb := m[key]; lastSegment(pb.GetZone()) == zone {
			items = append(items, view(pb))
		}
	}
	page, next, err := paginate(r, items)
	if err != nil {
		errInvalid(err.Error()).write(w)
		return
	}
	writeJSON(w, wrap(page, next))
}

// writeZonedGet answers a get of item {name}, shown through view, or GCE's 404 naming
// collection+name when item is nil (not in the map). s.mu is held.
func writeZonedGet[T interface {
	comparable
	proto.Message
}](w http.ResponseWriter, r *http.Request, collection string, item T, view func(T) T) {
	var none T
	if item == none {
		errNotFound(collection + r.PathValue("name")).write(w)
		return
	}
	writeJSON(w, view(item))
}

func (s *Server) deleteReservation(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	zone, _, ok := s.zone(w, r)
	if !ok {
		return
	}
	key := zone + "/" + r.PathValue("name")
	pb, ok := s.reservations[key]
	if !ok {
		errNotFound("projects/" + s.opts.Project + "/zones/" + zone + "/reservations/" + r.PathValue("name")).write(w)
		return
	}
	delete(s.reservations, key)
	op := s.newOperationLocked(zone, "delete", s.stubTarget(pb.GetSelfLink()))
	s.afterDelay(op, func() {})
	writeJSON(w, op.pb)
}

// checkReservationLocked is what an insert that targets a specific reservation must pass: the
// reservation exists, may be targeted, is READY, fits the VM's machine type and has room.
// The error is a synchronous 400 (bad) or an operation error code and message.
func (s *Server) checkReservationLocked(zone string, req *computepb.Instance) (bad *apiError, code, msg string) {
	ra := req.GetReservationAffinity()
	if ra.GetConsumeReservationType() != "SPECIFIC_RESERVATION" {
		if req.GetScheduling().GetProvisioningModel() == "RESERVATION_BOUND" {
			e := errInvalid("Invalid value for field 'resource.scheduling.provisioningModel': 'RESERVATION_BOUND'. Reservation-bound VMs must target a specific reservation.")
			return &e, "", ""
		}
		return nil, "", ""
	}
	if ra.GetKey() != ReservationKey || len(ra.GetValues()) != 1 {
		e := errInvalid("Invalid value for field 'resource.reservationAffinity': a specific reservation needs key " + ReservationKey + " and one value.")
		return &e, "", ""
	}
	name := lastSegment(ra.GetValues()[0])
	pb, ok := s.reservations[zone+"/"+name]
	if !ok {
		return nil, "RESOURCE_NOT_FOUND", "Could not find the given reservation with the following name: " + name
	}
	if !pb.GetSpecificReservationRequired() {
		e := errInvalid("Specified reservations [" + pb.GetSelfLink() + "] can not be targeted as specificReservationRequired is not set")
		return &e, "", ""
	}
	if pb.GetStatus() != "READY" {
		return nil, "UNSUPPORTED_OPERATION", "Reservation " + name + " is " + pb.GetStatus() + ": it requires reservation to be in READY state"
	}
	if want, got := lastSegment(pb.GetSpecificReservation().GetInstanceProperties().GetMachineType()), lastSegment(req.GetMachineType()); want != got {
		e := errInvalid(fmt.Sprintf("Instance properties do not match reservation %s: machine type %s, reserved %s.", name, got, want))
		return &e, "", ""
	}
	if int64(len(s.consumersLocked(zone, name))) >= pb.GetSpecificReservation().GetCount() {
		return nil, CodeZoneResourcePoolExhausted, "Reservation " + name + " does not have enough resources for the request: all " +
			fmt.Sprint(pb.GetSpecificReservation().GetCount()) + " reserved VMs are in use."
	}
	return nil, "", ""
}

// reservationEndLocked is when the reservation a VM consumes ends (its deleteAtTime), zero
// when it has none or the VM consumes none.
func (s *Server) reservationEndLocked(zone string, pb *computepb.Instance) time.Time {
	ra := pb.GetReservationAffinity()
	if ra.GetConsumeReservationType() != "SPECIFIC_RESERVATION" || len(ra.GetValues()) == 0 {
		return time.Time{}
	}
	res, ok := s.reservations[zone+"/"+lastSegment(ra.GetValues()[0])]
	if !ok {
		return time.Time{}
	}
	end, _ := time.Parse(time.RFC3339, res.GetDeleteAtTime())
	return end
}

func (s *Server) insertFutureReservation(w http.ResponseWriter, r *http.Request) {
	req := &computepb.FutureReservation{}
	if !decodeBody(w, r, req) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	zone, _, ok := s.zone(w, r)
	if !ok {
		return
	}
	start, end, apiErr := validateFuture(req)
	if apiErr != nil {
		apiErr.write(w)
		return
	}
	key := zone + "/" + req.GetName()
	if _, dup := s.future[key]; dup {
		errConflict("projects/" + s.opts.Project + "/zones/" + zone + "/futureReservations/" + req.GetName()).write(w)
		return
	}
	pb := proto.CloneOf(req)
	s.nextID++
	pb.Kind = proto.String("compute#futureReservation")
	pb.Id = proto.Uint64(s.nextID)
	pb.Zone = proto.String(s.zoneURL(zone))
	pb.SelfLink = proto.String(s.zoneURL(zone) + "/futureReservations/" + req.GetName())
	pb.CreationTimestamp = proto.String(time.Now().Format(timeLayout))
	if pb.ReservationName == nil {
		pb.ReservationName = proto.String(req.GetName())
	}
	pb.Status = &computepb.FutureReservationStatus{ProcurementStatus: proto.String(ProcurementApproved)}
	s.future[key] = pb
	s.scheduleWindowLocked(zone, req.GetName(), start, end)
	op := s.newOperationLocked(zone, "insert", s.stubTarget(pb.GetSelfLink()))
	s.afterDelay(op, func() {})
	writeJSON(w, op.pb)
}

// validateFuture checks a future reservation's window and shape as GCP does synchronously.
func validateFuture(req *computepb.FutureReservation) (start, end time.Time, _ *apiError) {
	bad := func(msg string) (time.Time, time.Time, *apiError) {
		e := errInvalid(msg)
		return time.Time{}, time.Time{}, &e
	}
	if !nameRE.MatchString(req.GetName()) {
		return bad(fmt.Sprintf("Invalid value for field 'resource.name': '%s'.", req.GetName()))
	}
	if req.ReservationName != nil && !nameRE.MatchString(req.GetReservationName()) {
		return bad(fmt.Sprintf("Invalid value for field 'resource.reservationName': '%s'.", req.GetReservationName()))
	}
	sku := req.GetSpecificSkuProperties()
	if sku.GetTotalCount() <= 0 || sku.GetInstanceProperties().GetMachineType() == "" {
		return bad("Invalid value for field 'resource.specificSkuProperties': totalCount and instanceProperties.machineType are required.")
	}
	tw := req.GetTimeWindow()
	start, err := time.Parse(time.RFC3339, tw.GetStartTime())
	if err != nil {
		return bad(fmt.Sprintf("Invalid value for field 'resource.timeWindow.startTime': '%s'.", tw.GetStartTime()))
	}
	switch {
	case tw.GetEndTime() != "":
		end, err = time.Parse(time.RFC3339, tw.GetEndTime())
	case tw.GetDuration() != nil:
		end = start.Add(time.Duration(tw.GetDuration().GetSeconds()) * time.Second)
	default:
		err = fmt.Errorf("no end")
	}
	if err != nil || !end.After(start) {
		return bad("Invalid value for field 'resource.timeWindow': an endTime (or duration) after startTime is required.")
	}
	return start, end, nil
}

// atLocked runs f under s.mu at t (at once, on a timer, when t has passed), unless the server
// closed first.
func (s *Server) atLocked(t time.Time, f func()) {
	var timer *time.Timer
	timer = time.AfterFunc(max(time.Until(t), 0), func() {
		s.mu.Lock()
		delete(s.timers, timer)
		if s.closed {
			s.mu.Unlock()
			return
		}
		f()
		s.mu.Unlock()
	})
	s.timers[timer] = true
}

// scheduleWindowLocked starts and ends a future reservation's window at its times; a timer
// whose time is no longer the window's (SetWindow moved it) does nothing.
func (s *Server) scheduleWindowLocked(zone, name string, start, end time.Time) {
	current := func() (time.Time, time.Time) {
		fr, ok := s.future[zone+"/"+name]
		if !ok {
			return time.Time{}, time.Time{}
		}
		st, en, _ := validateFuture(fr)
		return st, en
	}
	s.atLocked(start, func() {
		if st, _ := current(); st.Equal(start) {
			s.startWindowLocked(zone, name)
		}
	})
	s.atLocked(end, func() {
		if _, en := current(); en.Equal(end) {
			s.endWindowLocked(zone, name)
		}
	})
}

// SetWindow moves a future reservation's window (scripted time: a test that saw a job wait for
// a window far off opens it now), and its reservation's end if it was delivered.
func (s *Server) SetWindow(zone, name string, start, end time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	fr, ok := s.future[zone+"/"+name]
	if !ok {
		return fmt.Errorf("fakecompute: no future reservation %s in %s", name, zone)
	}
	if !end.After(start) {
		return fmt.Errorf("fakecompute: window end %s is not after its start %s", end, start)
	}
	start, end = start.Truncate(time.Second), end.Truncate(time.Second)
	fr.TimeWindow = &computepb.FutureReservationTimeWindow{StartTime: proto.String(start.UTC().Format(time.RFC3339)),
		EndTime: proto.String(end.UTC().Format(time.RFC3339))}
	if res, ok := s.reservations[zone+"/"+fr.GetReservationName()]; ok {
		res.DeleteAtTime = proto.String(end.UTC().Format(time.RFC3339))
	}
	s.scheduleWindowLocked(zone, name, start, end)
	return nil
}

// startWindowLocked delivers a future reservation: its reservation is made, READY until the
// window's end. A second call does nothing.
func (s *Server) startWindowLocked(zone, name string) {
	fr, ok := s.future[zone+"/"+name]
	if !ok || fr.GetStatus().GetProcurementStatus() != ProcurementApproved {
		return
	}
	_, end, _ := validateFuture(fr)
	sku := fr.GetSpecificSkuProperties()
	res := s.addReservationLocked(zone, &computepb.Reservation{
		Name: fr.ReservationName,
		SpecificReservation: &computepb.AllocationSpecificSKUReservation{Count: sku.TotalCount,
			InstanceProperties: proto.CloneOf(sku.GetInstanceProperties())},
		SpecificReservationRequired: proto.Bool(fr.GetSpecificReservationRequired() || fr.GetReservationMode() == "CALENDAR"),
		DeleteAtTime:                proto.String(end.UTC().Format(time.RFC3339)),
		Description:                 proto.String("auto-created for future reservation " + name),
	})
	fr.Status.ProcurementStatus = proto.String(ProcurementFulfilled)
	fr.Status.AutoCreatedReservations = []string{res.GetSelfLink()}
	fr.Status.FulfilledCount = sku.TotalCount
}

// endWindowLocked ends a future reservation's window: its reservation goes, and in CALENDAR
// mode so do the VMs that consume it (their processes are killed outside the lock).
func (s *Server) endWindowLocked(zone, name string) {
	fr, ok := s.future[zone+"/"+name]
	if !ok || fr.GetStatus().GetProcurementStatus() == ProcurementExpired {
		return
	}
	fr.Status.ProcurementStatus = proto.String(ProcurementExpired)
	res := fr.GetReservationName()
	delete(s.reservations, zone+"/"+res)
	if fr.GetReservationMode() != "CALENDAR" {
		return
	}
	var vms []*fakevm.VM
	for _, in := range s.consumersLocked(zone, res) {
		vms = append(vms, s.terminateLocked(zone, in, "The reservation "+res+" ended."))
	}
	s.killLocked(vms...)
}

// terminateLocked carries out a VM's instanceTerminationAction now (DELETE removes it, else it
// is TERMINATED) and returns its process for the caller to kill outside the lock.
func (s *Server) terminateLocked(zone string, in *instance, why string) *fakevm.VM {
	in.pb.Status = proto.String("TERMINATED")
	in.pb.StatusMessage = proto.String(why)
	in.pb.LastStopTimestamp = proto.String(time.Now().Format(timeLayout))
	v := in.vm
	in.vm = nil
	if in.pb.GetScheduling().GetInstanceTerminationAction() == "DELETE" {
		delete(s.zones[zone].instances, in.pb.GetName())
	}
	return v
}

// killLocked kills vms (nil ones are no VM) in the background. Close waits for it: a test's
// cleanup that removes Options.Dir after Close finds no VM process still writing there.
func (s *Server) killLocked(vms ...*fakevm.VM) {
	vms = slices.DeleteFunc(vms, func(v *fakevm.VM) bool { return v == nil })
	if len(vms) == 0 {
		return
	}
	s.vms.Add(1)
	go func() {
		defer s.vms.Done()
		for _, v := range vms {
			v.Kill(killWait)
		}
	}()
}

// StartWindow delivers the named future reservation now, as its startTime would.
func (s *Server) StartWindow(zone, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.future[zone+"/"+name]; !ok {
		return fmt.Errorf("fakecompute: no future reservation %s in %s", name, zone)
	}
	s.startWindowLocked(zone, name)
	return nil
}

// EndWindow ends the named future reservation's window now, as its endTime would.
func (s *Server) EndWindow(zone, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.future[zone+"/"+name]; !ok {
		return fmt.Errorf("fakecompute: no future reservation %s in %s", name, zone)
	}
	s.endWindowLocked(zone, name)
	return nil
}

func (s *Server) listFutureReservations(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if zone, _, ok := s.zone(w, r); ok {
		writeZonedList(w, r, zone, s.future, proto.CloneOf[*computepb.FutureReservation],
			func(page []*computepb.FutureReservation, next *string) proto.Message {
				return &computepb.FutureReservationsListResponse{Kind: proto.String("compute#futureReservationsListResponse"), Items: page, NextPageToken: next}
			})
	}
}

func (s *Server) getFutureReservation(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if zone, _, ok := s.zone(w, r); ok {
		writeZonedGet(w, r, "projects/"+s.opts.Project+"/zones/"+zone+"/futureReservations/", s.future[zone+"/"+r.PathValue("name")],
			func(pb *computepb.FutureReservation) *computepb.FutureReservation { return pb })
	}
}
