package fakeec2

import (
	"net/http"
	"slices"

	"github.com/ferryserve/ferry/launcher/fakefault"
)

// Outages: every API request (not the VMs' metadata service, which is the instance's own) is
// matched against the outage switch (Outages) once its action and region are known and before
// the action runs, so that a fault takes the request whatever it asks: a region whose endpoint
// answers 503 answers it to everyone, as EC2 does in an outage. What a matched request gets:
//
//   - Throttle: 503 RequestLimitExceeded, EC2's throttling answer (the SDK retries it with a
//     back-off of its own, as against EC2);
//   - Status: that status with Code, or without one EC2's usual code for it (faultCodes:
//     503 Unavailable, 500 InternalError, ...);
//   - Hang: the request is held, unanswered, until the client gives up, the fault is cleared
//     or runs out its For, or the server closes; released by a clear, it is answered as if
//     nothing happened (a request that outlived the outage);
//   - Delay: the answer comes that much later (then as the other fields say).
//
// A request the fault is not answered for (the client gave up, the server closed) has its
// connection dropped without a response (http.ErrAbortHandler), as a dead endpoint does.
//
// Fault.Zone matches a request's Availability Zone by name (us-east-1a) or by ID (use1-az4):
// RunInstances' Placement.AvailabilityZone or AvailabilityZoneId, the AvailabilityZone or
// AvailabilityZoneId parameter of other actions. A request that names no zone is matched
// only by faults without one.

// faultCodes are the EC2 error codes the fake answers a Status fault with when it gives no
// Code: what EC2 sends with that status ("Error codes for the Amazon EC2 API": server errors
// InternalError and Unavailable; client errors per status). EC2 itself never answers 404; a
// fault that does stands for an endpoint that is not there (NotFound).
var faultCodes = map[int]string{
	http.StatusBadRequest:          "InvalidRequest",
	http.StatusUnauthorized:        "AuthFailure",
	http.StatusForbidden:           "UnauthorizedOperation",
	http.StatusNotFound:            "NotFound",
	http.StatusTooManyRequests:     "RequestLimitExceeded",
	http.StatusInternalServerError: "InternalError",
	http.StatusBadGateway:          "Unavailable",
	http.StatusServiceUnavailable:  "Unavailable",
	http.StatusGatewayTimeout:      "Unavailable",
}

// faultMessages are EC2's messages for the codes a fault answers with by default.
var faultMessages = map[string]string{
	"RequestLimitExceeded":  "Request limit exceeded.",
	"Unavailable":           "The server is overloaded and can't handle the request.",
	"InternalError":         "An internal error has occurred.",
	"AuthFailure":           "AWS was not able to validate the provided access credentials",
	"UnauthorizedOperation": "You are not authorized to perform this operation.",
	"NotFound":              "The requested endpoint was not found.",
}

// faultRequest is what the outage switch matches of an API request: its action, the region
// of its SigV4 scope, and the zone it names, if any. The zone is given as the fault names it
// when a fault names it by ID (use1-az4), else by name (us-east-1a), so that either spelling
// in a fault spec takes the request (one Match, so that a fault's Rate is drawn once).
func (s *Server) faultRequest(action, regionName string, p params) fakefault.Request {
	req := fakefault.Request{Op: action, Region: regionName}
	var name, id string
	for _, k := range []string{"Placement.AvailabilityZone", "AvailabilityZone"} {
		if v := p.get(k); v != "" && name == "" {
			name = v
		}
	}
	for _, k := range []string{"Placement.AvailabilityZoneId", "AvailabilityZoneId"} {
		if v := p.get(k); v != "" && id == "" {
			id = v
		}
	}
	// Zones never change after New, so reading them needs no lock.
	if reg := s.regions[regionName]; reg != nil {
		for _, z := range reg.zones {
			switch {
			case name != "" && z.name == name:
				id = z.id
			case name == "" && id != "" && z.id == id:
				name = z.name
			}
		}
	}
	req.Zone = name
	if id != "" && (name == "" || slices.ContainsFunc(s.outages.Faults(), func(f fakefault.Fault) bool { return f.Zone == id })) {
		req.Zone = id
	}
	return req
}

// faultError is the EC2 error a matched fault answers with, nil when it has none (a hang
// that was released, a delay): the request then goes on to its action.
func faultError(f fakefault.Fault) *APIError {
	status, code := f.Status, f.Code
	if f.Throttle {
		status, code = http.StatusServiceUnavailable, "RequestLimitExceeded"
	}
	if status == 0 {
		return nil
	}
	if code == "" {
		code = faultCodes[status]
		if code == "" {
			code = "InternalError"
			if status < 500 {
				code = "InvalidRequest"
			}
		}
	}
	msg := f.Message
	if msg == "" {
		msg = faultMessages[code]
	}
	if msg == "" {
		msg = "Injected fault: " + code
	}
	return &APIError{Code: code, Message: msg, Status: status}
}

// hold waits out a hang or delay fault on r (fakefault.Switch.Wait), counted in Held; false
// when the request is not to be answered.
func (s *Server) hold(r *http.Request, f fakefault.Fault) bool {
	s.held.Add(1)
	defer s.held.Add(-1)
	return s.outages.Wait(r.Context(), f, s.stopping)
}

// Held is how many API requests a hang or delay fault holds unanswered now: a test waits for
// its call to be held before it clears the fault or looks at what the caller does meanwhile.
func (s *Server) Held() int { return int(s.held.Load()) }
