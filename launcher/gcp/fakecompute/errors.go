package fakecompute

import (
	"encoding/json"
	"net/http"
)

// apiError is one HTTP error in Google's JSON envelope:
//
//	{"error":{"code":403,"message":"...","errors":[{"message":"...","domain":"global","reason":"forbidden"}],"status":"PERMISSION_DENIED"}}
//
// which googleapi.CheckResponse turns into a *googleapi.Error with Code, Message and Errors.
type apiError struct {
	code    int
	reason  string
	status  string
	message string
}

func (e apiError) write(w http.ResponseWriter) {
	type item struct {
		Message string `json:"message"`
		Domain  string `json:"domain"`
		Reason  string `json:"reason"`
	}
	type body struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Errors  []item `json:"errors"`
		Status  string `json:"status,omitempty"`
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(e.code)
	_ = json.NewEncoder(w).Encode(map[string]body{"error": {
		Code:    e.code,
		Message: e.message,
		Errors:  []item{{Message: e.message, Domain: "global", Reason: e.reason}},
		Status:  e.status,
	}})
}

func errNotFound(what string) apiError {
	return apiError{code: http.StatusNotFound, reason: "notFound", status: "NOT_FOUND",
		message: "The resource '" + what + "' was not found"}
}

func errInvalid(msg string) apiError {
	return apiError{code: http.StatusBadRequest, reason: "invalid", status: "INVALID_ARGUMENT", message: msg}
}

func errConflict(what string) apiError {
	return apiError{code: http.StatusConflict, reason: "alreadyExists", status: "ALREADY_EXISTS",
		message: "The resource '" + what + "' already exists"}
}

// Operation error codes GCP puts in operation.error.errors[].code, with the HTTP status and
// message it reports beside them (httpErrorStatusCode, httpErrorMessage) and the reason its
// synchronous (HTTP) form carries in the error envelope.
const (
	CodeZoneResourcePoolExhausted            = "ZONE_RESOURCE_POOL_EXHAUSTED"
	CodeZoneResourcePoolExhaustedWithDetails = "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"
	CodeQuotaExceeded                        = "QUOTA_EXCEEDED"
	CodeUnsupportedOperation                 = "UNSUPPORTED_OPERATION"
)

// codeStatus is the HTTP status GCP pairs with an operation error code.
func codeStatus(code string) (int, string) {
	switch code {
	case CodeZoneResourcePoolExhausted, CodeZoneResourcePoolExhaustedWithDetails:
		return http.StatusServiceUnavailable, "SERVICE UNAVAILABLE"
	case CodeQuotaExceeded:
		return http.StatusForbidden, "FORBIDDEN"
	default:
		return http.StatusBadRequest, "BAD REQUEST"
	}
}

// httpFormOf is the synchronous error for an operation error code: the envelope's reason is
// the camel-case form GCP uses there (quotaExceeded), the status the matching gRPC status.
func httpFormOf(code, msg string) apiError {
	switch code {
	case CodeZoneResourcePoolExhausted, CodeZoneResourcePoolExhaustedWithDetails:
		return apiError{code: http.StatusServiceUnavailable, reason: "resourcePoolExhausted", status: "UNAVAILABLE", message: msg}
	case CodeQuotaExceeded:
		return apiError{code: http.StatusForbidden, reason: "quotaExceeded", status: "RESOURCE_EXHAUSTED", message: msg}
	case CodeUnsupportedOperation:
		return apiError{code: http.StatusBadRequest, reason: "unsupportedOperation", status: "FAILED_PRECONDITION", message: msg}
	case "PERMISSION_DENIED", "forbidden":
		return apiError{code: http.StatusForbidden, reason: "forbidden", status: "PERMISSION_DENIED", message: msg}
	default:
		return apiError{code: http.StatusBadRequest, reason: "invalid", status: "INVALID_ARGUMENT", message: msg}
	}
}

func defaultMessage(code, zone string) string {
	switch code {
	case CodeZoneResourcePoolExhausted, CodeZoneResourcePoolExhaustedWithDetails:
		return "The zone 'projects/fake/zones/" + zone + "' does not have enough resources available to fulfill the request.  Try a different zone, or try again later."
	case CodeQuotaExceeded:
		return "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally."
	case CodeUnsupportedOperation:
		return "The requested operation is not supported in zone " + zone + "."
	}
	return code
}
