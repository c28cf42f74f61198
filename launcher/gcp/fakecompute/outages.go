package fakecompute

import (
	"bytes"
	"io"
	"net/http"
	"strconv"

	"github.com/ferryserve/ferry/launcher/fakefault"
)

// Outages. Every API request is matched against the outage switch (Outages) before it is
// served, so that a test or `ferry fakecloud --fault gcp=...` can make the fake fail the way
// Compute Engine fails: a status in Google's JSON error envelope, throttling, a late answer, or
// a request accepted and never answered. A request is matched by its operation, named as the
// API's methods are (below), and by the zone in its path; global operations have no zone and
// are taken only by faults limited to no place. A VM's metadata server is not the API and is
// never faulted.
//
// Operation names:
//
//	zones.list, zones.get
//	instances.insert, instances.list, instances.get, instances.delete,
//	instances.setMetadata, instances.getSerialPortOutput
//	zoneOperations.list, zoneOperations.get, zoneOperations.wait
//	globalOperations.get, globalOperations.wait
//	firewalls.insert, firewalls.get, firewalls.update, firewalls.delete
//	reservations.insert, reservations.list, reservations.get, reservations.delete
//	futureReservations.insert, futureReservations.list, futureReservations.get
const (
	OpZonesList                = "zones.list"
	OpZonesGet                 = "zones.get"
	OpInstancesInsert          = "instances.insert"
	OpInstancesList            = "instances.list"
	OpInstancesGet             = "instances.get"
	OpInstancesDelete          = "instances.delete"
	OpInstancesSetMetadata     = "instances.setMetadata"
	OpInstancesGetSerialPort   = "instances.getSerialPortOutput"
	OpZoneOperationsList       = "zoneOperations.list"
	OpZoneOperationsGet        = "zoneOperations.get"
	OpZoneOperationsWait       = "zoneOperations.wait"
	OpGlobalOperationsGet      = "globalOperations.get"
	OpGlobalOperationsWait     = "globalOperations.wait"
	OpFirewallsInsert          = "firewalls.insert"
	OpFirewallsGet             = "firewalls.get"
	OpFirewallsUpdate          = "firewalls.update"
	OpFirewallsDelete          = "firewalls.delete"
	OpReservationsInsert       = "reservations.insert"
	OpReservationsList         = "reservations.list"
	OpReservationsGet          = "reservations.get"
	OpReservationsDelete       = "reservations.delete"
	OpFutureReservationsInsert = "futureReservations.insert"
	OpFutureReservationsList   = "futureReservations.list"
	OpFutureReservationsGet    = "futureReservations.get"
)

// route registers an API method: pattern (with the {zone} wildcard where it has one) served by
// h, once the request has got past the outage switch as op.
func (s *Server) route(pattern, op string, h http.HandlerFunc) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		if s.fault(w, r, op) {
			return
		}
		h(w, r)
	})
}

// fault applies the outage switch to a request: it reports true when the request was answered
// (an error) or dropped (a hang the client gave up on, or the fake closing), false when the
// request is to be served as usual (no fault, or a delay or a hang that ended).
func (s *Server) fault(w http.ResponseWriter, r *http.Request, op string) bool {
	zone := r.PathValue("zone")
	f, ok := s.outages.Match(fakefault.Request{Op: op, Zone: zone})
	if !ok {
		return false
	}
	if f.Delay > 0 || f.Hang {
		// Read the body first: the server notices a client that gives up (r.Context ends)
		// only once the body is read, and a hung insert must not be served after its client
		// has gone.
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !s.outages.Wait(r.Context(), f, s.stop) {
			// The client gave up or the fake is closing: drop the connection without an
			// answer, as an endpoint that dies does (not an empty 200).
			panic(http.ErrAbortHandler)
		}
		if f.Hang {
			return false // released: the outage is over
		}
	}
	e, failed := faultError(f, op, s.opts.Project, zone)
	if failed {
		e.write(w)
	}
	return failed
}

// faultError is the error a fault answers with in Google's envelope, with the reason and
// status Compute Engine gives for the HTTP status; false for a fault that only delays.
func faultError(f fakefault.Fault, op, project, zone string) (apiError, bool) {
	status := f.Status
	if f.Throttle {
		status = http.StatusTooManyRequests
	}
	if status == 0 {
		return apiError{}, false
	}
	var e apiError
	switch status {
	case http.StatusTooManyRequests:
		e = apiError{reason: "rateLimitExceeded", status: "RESOURCE_EXHAUSTED", message: "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per minute' of service 'compute.googleapis.com'."}
	case http.StatusServiceUnavailable, http.StatusBadGateway:
		e = apiError{reason: "backendError", status: "UNAVAILABLE", message: "The service is currently unavailable."}
	case http.StatusGatewayTimeout:
		e = apiError{reason: "backendError", status: "DEADLINE_EXCEEDED", message: "The request timed out."}
	case http.StatusInternalServerError:
		e = apiError{reason: "backendError", status: "INTERNAL", message: "Internal error. Please try again or contact Google Support."}
	case http.StatusNotFound:
		what := "projects/" + project
		if zone != "" {
			what += "/zones/" + zone
		}
		e = errNotFound(what)
	case http.StatusUnauthorized:
		e = apiError{reason: "authError", status: "UNAUTHENTICATED", message: "Request had invalid authentication credentials."}
	case http.StatusForbidden:
		e = apiError{reason: "forbidden", status: "PERMISSION_DENIED", message: "Required 'compute." + op + "' permission for 'projects/" + project + "'"}
	case http.StatusConflict:
		e = apiError{reason: "alreadyExists", status: "ALREADY_EXISTS", message: "The request failed."}
	default:
		e = apiError{reason: "invalid", status: "INVALID_ARGUMENT", message: "The request failed."}
		if status >= 500 {
			e.reason, e.status = "backendError", "INTERNAL"
		}
	}
	e.code = status
	if f.Code != "" {
		e.reason = f.Code
	}
	if f.Message != "" {
		e.message = f.Message
	} else {
		// Say where the error came from: a reader of Ferry's logs should not hunt for a
		// real outage.
		e.message += " (injected fault " + strconv.Quote(f.String()) + " on " + op + ")"
	}
	return e, true
}
