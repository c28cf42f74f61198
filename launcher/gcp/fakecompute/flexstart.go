package fakecompute

import (
	"fmt"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"
)

// Flex-start VMs (Dynamic Workload Scheduler), as the instances API has them: an insert with
// scheduling.provisioningModel FLEX_START and a maxRunDuration (at most MaxFlexRunDuration)
// that consumes no reservation makes a VM whose status is PENDING while it waits in the queue,
// for at most params.requestValidForDuration (DefaultFlexWait when unset); one still PENDING
// then is TERMINATED, its request failed. Capacity comes to a zone's queue all at once: every
// flex-start VM PENDING in the zone starts together (PROVISIONING, then RUNNING), when
// FulfilFlexStart is called or SetFlexStartDelay's delay after the first one queued. Zone
// capacity limits (SetCapacity) do not apply to them, nor to VMs in a reservation.
//
// Any VM with a maxRunDuration (flex-start or not) gets resourceStatus.scheduling
// .terminationTimestamp when it starts, and at that time its instanceTerminationAction is
// carried out (DELETE removes it, STOP leaves it TERMINATED), its processes killed, as GCE
// does; a reservation-bound VM's terminationTimestamp is its reservation's end.

// Limits of flex-start requests.
const (
	// MaxFlexRunDuration is GCE's limit on a flex-start VM's maxRunDuration.
	MaxFlexRunDuration = 7 * 24 * time.Hour
	// DefaultFlexWait is how long the fake keeps a flex-start request without
	// requestValidForDuration queued: GCE keeps them up to two hours.
	DefaultFlexWait = 2 * time.Hour
)

// validateFlex checks a flex-start insert as GCE does synchronously.
func validateFlex(req *computepb.Instance) (apiError, bool) {
	sch := req.GetScheduling()
	if sch.GetProvisioningModel() != "FLEX_START" {
		return apiError{}, false
	}
	run := durationOf(sch.GetMaxRunDuration())
	switch {
	case run <= 0 || run > MaxFlexRunDuration:
		return errInvalid(fmt.Sprintf("Invalid value for field 'resource.scheduling.maxRunDuration': %v. Flex-start VMs need a maxRunDuration of up to 7 days.", run)), true
	case sch.GetAutomaticRestart():
		return errInvalid("Invalid value for field 'resource.scheduling.automaticRestart': 'true'. Flex-start VMs cannot be automatically restarted."), true
	case sch.GetOnHostMaintenance() != "TERMINATE":
		return errInvalid("Invalid value for field 'resource.scheduling.onHostMaintenance'. Flex-start VMs must terminate on host maintenance."), true
	case req.GetReservationAffinity().GetConsumeReservationType() != "NO_RESERVATION":
		return errInvalid("Invalid value for field 'resource.reservationAffinity.consumeReservationType'. Flex-start VMs must not consume reservations (NO_RESERVATION)."), true
	}
	return apiError{}, false
}

func durationOf(d *computepb.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return time.Duration(d.GetSeconds())*time.Second + time.Duration(d.GetNanos())
}

func isFlex(pb *computepb.Instance) bool {
	return pb.GetScheduling().GetProvisioningModel() == "FLEX_START"
}

// reservedOrQueued reports a VM that does not take the zone's on-demand capacity: one in a
// reservation, or a flex-start one (which waits for capacity of its own).
func reservedOrQueued(req *computepb.Instance) bool {
	return isFlex(req) || req.GetReservationAffinity().GetConsumeReservationType() == "SPECIFIC_RESERVATION"
}

// SetFlexStartDelay makes flex-start requests in a zone be fulfilled d after the first of them
// queued (all that are queued then, at once). Negative (the default) leaves them queued until
// FulfilFlexStart.
func (s *Server) SetFlexStartDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flexDelay = d
}

// queueFlexLocked queues a new flex-start VM (PENDING) and reports whether it was one.
func (s *Server) queueFlexLocked(zone string, in *instance) bool {
	if !isFlex(in.pb) {
		return false
	}
	in.pb.Status = proto.String("PENDING")
	wait := DefaultFlexWait
	if d := durationOf(in.pb.GetParams().GetRequestValidForDuration()); d > 0 {
		wait = d
	}
	s.atLocked(time.Now().Add(wait), func() {
		if cur, ok := s.zones[zone].instances[in.pb.GetName()]; ok && cur == in && in.pb.GetStatus() == "PENDING" {
			in.pb.Status = proto.String("TERMINATED")
			in.pb.StatusMessage = proto.String(fmt.Sprintf("Flex-start request expired: no capacity within %v.", wait))
		}
	})
	if s.flexDelay >= 0 && !s.flexTimer[zone] {
		s.flexTimer[zone] = true
		s.atLocked(time.Now().Add(s.flexDelay), func() {
			delete(s.flexTimer, zone)
			s.fulfilLocked(zone)
		})
	}
	return true
}

// FulfilFlexStart gives zone's flex-start queue its capacity now: every PENDING flex-start VM
// there starts. It returns how many did.
func (s *Server) FulfilFlexStart(zone string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fulfilLocked(zone)
}

func (s *Server) fulfilLocked(zone string) int {
	zs, ok := s.zones[zone]
	if !ok {
		return 0
	}
	n := 0
	for _, in := range zs.instances {
		if isFlex(in.pb) && in.pb.GetStatus() == "PENDING" {
			in.pb.Status = proto.String("PROVISIONING")
			n++
			op := s.newOperationLocked(zone, "compute.instances.flexStartProvisioned", in.pb)
			s.afterDelay(op, func() { s.runLocked(zone, in) })
		}
	}
	return n
}

// FlexQueued is how many flex-start VMs wait in zone's queue.
func (s *Server) FlexQueued(zone string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, in := range s.zones[zone].instances {
		if isFlex(in.pb) && in.pb.GetStatus() == "PENDING" {
			n++
		}
	}
	return n
}

// scheduleEndLocked records when a VM that just started will be ended and, for a run limit,
// ends it then.
func (s *Server) scheduleEndLocked(zone string, in *instance) {
	var end time.Time
	if run := durationOf(in.pb.GetScheduling().GetMaxRunDuration()); run > 0 {
		end = time.Now().Add(run)
		s.atLocked(end, func() {
			if cur, ok := s.zones[zone].instances[in.pb.GetName()]; ok && cur == in && in.pb.GetStatus() != "TERMINATED" {
				v := s.terminateLocked(zone, in, fmt.Sprintf("Instance reached its maxRunDuration of %v.", run))
				s.killLocked(v)
			}
		})
	} else if in.pb.GetScheduling().GetProvisioningModel() == "RESERVATION_BOUND" {
		end = s.reservationEndLocked(zone, in.pb)
	}
	if end.IsZero() {
		return
	}
	if in.pb.ResourceStatus == nil {
		in.pb.ResourceStatus = &computepb.ResourceStatus{}
	}
	in.pb.ResourceStatus.Scheduling = &computepb.ResourceStatusScheduling{
		TerminationTimestamp: proto.String(end.UTC().Format(time.RFC3339))}
}
