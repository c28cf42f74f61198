package fakeec2

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// InterruptionNotice is how long EC2 lets a spot instance run after its interruption warning.
const InterruptionNotice = 2 * time.Minute

// Spot request status codes, from "Spot request status" in the EC2 User Guide. At an
// interruption warning EC2 sets StatusNoCapacity on a one-time request whose instance
// terminates on interruption (the only kind the fake makes, and Ferry's), closing the request
// while the instance runs for InterruptionNotice more; the guide's lifecycle table also lists
// StatusMarkedForTermination, an active request whose instance still runs.
const (
	StatusNoCapacity           = "instance-terminated-no-capacity"
	StatusMarkedForTermination = "marked-for-termination"

	statusFulfilled        = "fulfilled"
	statusTerminatedByUser = "instance-terminated-by-user"
	statusSystemError      = "system-error"
)

// spotStatuses are the request state and message that go with each status code.
var spotStatuses = map[string]struct{ state, message string }{
	statusFulfilled:            {"active", "Your spot request is fulfilled."},
	StatusMarkedForTermination: {"active", "Your Spot Instance is marked for termination: Amazon EC2 needs the capacity back."},
	StatusNoCapacity:           {"closed", "Your Spot Instance was terminated because Amazon EC2 needs the capacity back."},
	statusTerminatedByUser:     {"closed", "Your Spot Instance was terminated by a user."},
	statusSystemError:          {"closed", "There was an unexpected system error."},
}

// spotRequest is the one-time spot instance request RunInstances makes for a spot instance.
type spotRequest struct {
	id, maxPrice string
	created      time.Time
	tags         map[string]string
	state, code  string
	updated      time.Time
	// reclaimAt is when an interruption warning ends the instance; zero until one is given.
	reclaimAt time.Time
}

func newSpotRequest(now time.Time, maxPrice string, tags map[string]string) *spotRequest {
	r := &spotRequest{id: newID("sir-")[:12], maxPrice: maxPrice, created: now, tags: maps.Clone(tags)}
	r.setStatus(statusFulfilled, now)
	return r
}

func (r *spotRequest) setStatus(code string, at time.Time) {
	r.code, r.state, r.updated = code, spotStatuses[code].state, at
}

// checkSpotOptions refuses the spot options the fake does not model: persistent requests and
// interruption behaviours other than terminate (the fake has no stopped instances).
func checkSpotOptions(p params) *APIError {
	if t := p.get("InstanceMarketOptions.SpotOptions.SpotInstanceType"); t != "" && t != "one-time" {
		return apiErr("InvalidParameterValue", "fakeec2 supports one-time spot requests only, not %q", t)
	}
	if b := p.get("InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"); b != "" && b != "terminate" {
		return apiErr("InvalidParameterValue", "fakeec2 supports the terminate interruption behavior only, not %q", b)
	}
	return nil
}

// Preempt reclaims a spot instance at once: PreemptWithNotice with no notice.
func (s *Server) Preempt(instanceID string) error { return s.PreemptWithNotice(instanceID, 0) }

// PreemptWithNotice interrupts a spot instance as EC2 does: its request gets the interruption
// warning now (status Options.InterruptionStatus, stamped with the warning's time) while the
// instance keeps running and serving, and once notice has passed the instance goes to
// shutting-down, then terminated, with state reason Server.SpotInstanceTermination, its VM is
// killed and its request is closed as instance-terminated-no-capacity. EC2's notice is
// InterruptionNotice; 0 reclaims at once.
//
// The reclaim is due at Options.Now()+notice. A timer checks after notice of real time, and
// every API call and Instances check too, so under a fake clock the reclaim happens at the first
// of those after the clock passes it. A second warning to the same instance can only bring
// its reclaim closer.
func (s *Server) PreemptWithNotice(instanceID string, notice time.Duration) error {
	if notice < 0 {
		return fmt.Errorf("fakeec2: negative notice %v", notice)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	s.advance()
	in := s.instances[instanceID]
	if in == nil {
		return fmt.Errorf("fakeec2: no instance %s", instanceID)
	}
	if !in.spot {
		return fmt.Errorf("fakeec2: instance %s is on-demand", instanceID)
	}
	if !in.live() {
		return fmt.Errorf("fakeec2: instance %s is already %s", instanceID, in.state)
	}
	now := s.opts.Now()
	r := in.request
	switch at := now.Add(notice); {
	case r.reclaimAt.IsZero():
		r.setStatus(s.opts.InterruptionStatus, now)
		r.reclaimAt = at
	case at.Before(r.reclaimAt):
		r.reclaimAt = at
	}
	if !now.Before(r.reclaimAt) {
		s.reclaim(in, r.reclaimAt)
		return nil
	}
	s.wakeAfter(notice)
	return nil
}

// reclaim ends a spot instance as EC2 does when it takes the capacity back. Callers hold s.mu.
func (s *Server) reclaim(in *instance, at time.Time) {
	s.end(in, at, ReasonSpotTermination, "Server.SpotInstanceTermination: Spot instance termination", "Service initiated")
}

// wakeAfter runs advance after d of real time, so that a reclaim due then happens (and its VM is
// killed) even if no call comes. Close stops the timers and waits for any that fired. Callers
// hold s.mu.
func (s *Server) wakeAfter(d time.Duration) {
	s.wakeWG.Add(1)
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		defer s.wakeWG.Done()
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.wakeups, t)
		if !s.closed {
			s.advance()
		}
	})
	s.wakeups[t] = true
}

// stopWakeups stops the timers that have not fired. Callers hold s.mu.
func (s *Server) stopWakeups() {
	for t := range s.wakeups {
		if t.Stop() {
			s.wakeWG.Done()
		}
		delete(s.wakeups, t)
	}
}

func (s *Server) describeSpotInstanceRequests(m meta, reg *region, p params) (any, *APIError) {
	ids := p.list("SpotInstanceRequestId")
	for _, id := range ids {
		if !strings.HasPrefix(id, "sir-") {
			return nil, apiErr("InvalidSpotInstanceRequestID.Malformed", "Invalid id: \"%s\"", id)
		}
		if !slices.ContainsFunc(s.order, func(iid string) bool {
			in := s.instances[iid]
			return in.region == reg.name && in.request != nil && in.request.id == id
		}) {
			return nil, apiErr("InvalidSpotInstanceRequestID.NotFound", "The spot instance request ID '%s' does not exist", id)
		}
	}
	filters := p.filters()
	for name := range filters {
		switch {
		case strings.HasPrefix(name, "tag:"), name == "tag-key", name == "status-code", name == "state", name == "instance-id",
			name == "spot-instance-request-id", name == "launched-availability-zone", name == "launched-availability-zone-id",
			name == "type", name == "product-description":
		default:
			return nil, apiErr("InvalidParameterValue", "The filter '%s' is invalid", name)
		}
	}
	var found []*instance
	for _, iid := range s.order {
		in := s.instances[iid]
		r := in.request
		if in.region != reg.name || r == nil || len(ids) > 0 && !slices.Contains(ids, r.id) {
			continue
		}
		ok := matches(filters, func(name string) []string {
			switch name {
			case "status-code":
				return []string{r.code}
			case "state":
				return []string{r.state}
			case "instance-id":
				return []string{in.id}
			case "spot-instance-request-id":
				return []string{r.id}
			case "launched-availability-zone":
				return []string{in.zone.name}
			case "launched-availability-zone-id":
				return []string{in.zone.id}
			case "type":
				return []string{"one-time"}
			case "product-description":
				return []string{"Linux/UNIX"}
			}
			return tagValues(name, r.tags)
		})
		if ok {
			found = append(found, in)
		}
	}
	start, end := 0, len(found)
	if tok := p.get("NextToken"); tok != "" {
		n, err := strconv.Atoi(tok)
		if err != nil || n < 0 || n > len(found) {
			return nil, apiErr("InvalidParameterValue", "Invalid NextToken")
		}
		start = n
	}
	out := &describeSpotInstanceRequestsResponse{meta: m}
	if mr := p.get("MaxResults"); mr != "" {
		n, err := strconv.Atoi(mr)
		if err != nil || n < 5 || n > 1000 {
			return nil, apiErr("InvalidParameterValue", "MaxResults must be between 5 and 1000")
		}
		if start+n < end {
			end = start + n
			out.NextToken = strconv.Itoa(end)
		}
	}
	for _, in := range found[start:end] {
		out.Requests = append(out.Requests, xmlRequest(in))
	}
	return out, nil
}

func xmlRequest(in *instance) xmlSpotInstanceRequest {
	r := in.request
	return xmlSpotInstanceRequest{
		SpotInstanceRequestID: r.id, SpotPrice: r.maxPrice, Type: "one-time", State: r.state,
		Status: xmlSpotStatus{Code: r.code, UpdateTime: timestamp(r.updated), Message: spotStatuses[r.code].message},
		LaunchSpecification: xmlLaunchSpecification{
			ImageID: in.imageID, InstanceType: in.instanceType, GroupSet: in.securityGroups,
			Placement: xmlSpotPlacement{AvailabilityZone: in.zone.name, GroupName: in.placementGroup, Tenancy: "default"},
		},
		InstanceID: in.id, CreateTime: timestamp(r.created), ProductDescription: "Linux/UNIX", TagSet: tagSet(r.tags),
		LaunchedAvailabilityZone: in.zone.name, LaunchedAvailabilityZoneID: in.zone.id, InstanceInterruptionBehavior: "terminate",
	}
}
