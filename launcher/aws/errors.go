package aws

import (
	"errors"
	"fmt"
	"strings"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/smithy-go"

	"github.com/ferryserve/ferry/launcher"
)

// EC2 error codes that decide what a caller does next.
var (
	// capacityCodes fail over to another zone. SpotMaxPriceTooLow is here too: the spot price
	// in that zone is above what Ferry offered (by default the on-demand price), which is the
	// zone's problem, not the request's, and another zone or on-demand may well be cheaper.
	// Unsupported is EC2's answer for an instance type a zone does not offer.
	capacityCodes = map[string]bool{
		"InsufficientInstanceCapacity":         true,
		"InsufficientCapacity":                 true,
		"InsufficientHostCapacity":             true,
		"InsufficientReservedInstanceCapacity": true,
		"InsufficientCapacityOnOutpost":        true,
		"SpotMaxPriceTooLow":                   true,
		"Unsupported":                          true,
		// A targeted reservation or capacity block that is full (or, in a race with its start,
		// not active yet): another placement may have room.
		"ReservationCapacityExceeded": true,
	}
	quotaCodes = map[string]bool{
		"MaxSpotInstanceCountExceeded": true,
		"VcpuLimitExceeded":            true,
		"InstanceLimitExceeded":        true,
		"PendingVerification":          true,
	}
	unauthorizedCodes = map[string]bool{
		"UnauthorizedOperation":      true,
		"AuthFailure":                true,
		"InvalidClientTokenId":       true,
		"SignatureDoesNotMatch":      true,
		"MissingAuthenticationToken": true,
		"OptInRequired":              true,
		"Blocked":                    true,
		"ExpiredToken":               true,
	}
	// throttleCodes are EC2's (and the SDK's other services') answers for a caller that asks
	// too often: the infra is up and wants Ferry to slow down.
	throttleCodes = map[string]bool{
		"RequestLimitExceeded":      true,
		"Throttling":                true,
		"ThrottlingException":       true,
		"RequestThrottled":          true,
		"RequestThrottledException": true,
		"EC2ThrottledException":     true,
		"TooManyRequestsException":  true,
		"BandwidthLimitExceeded":    true,
	}
	// unavailableCodes are EC2's server errors that are not about capacity: the endpoint
	// failed, and what it holds is unknown until it answers again.
	unavailableCodes = map[string]bool{
		"Unavailable":        true,
		"ServiceUnavailable": true,
		"InternalError":      true,
		"InternalFailure":    true,
	}
)

// errorCode is the EC2 error code of err, "" when err is not an API error.
func errorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// httpStatus is the HTTP status of the answer err carries, 0 when there was none.
func httpStatus(err error) int {
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// classify wraps an EC2 error with the launcher's typed error its code means, keeping the
// code, the message and the error chain (a deadline that cut the call stays
// context.DeadlineExceeded) for the operator and the breakers.
//
// Infra faults are told by what EC2 answered, never by the text: throttling codes are
// launcher.ErrThrottled; EC2's server errors that are not about capacity, and any other 5xx,
// are launcher.ErrUnavailable; an error with no answer at all (refused, reset, a request its
// RequestTimeout or the caller's deadline cut) is launcher.ErrUnavailable through
// launcher.ClassifyTransport. The SDK's retryer, giving up, wraps the last attempt's error in
// retry.MaxAttemptsError (or joins it with its retry quota's refusal): the code is read
// through the chain, so the give-up is classified as its last answer.
func classify(err error, what string) error {
	code := errorCode(err)
	var kind error
	switch {
	case capacityCodes[code]:
		kind = launcher.ErrNoCapacity
	case quotaCodes[code]:
		kind = launcher.ErrQuota
	case unauthorizedCodes[code]:
		kind = launcher.ErrUnauthorized
	case strings.HasPrefix(code, "InvalidParameter"), strings.HasPrefix(code, "InvalidAMIID."),
		code == "MissingParameter", code == "InvalidInstanceType", code == "InvalidUserData.Malformed",
		strings.HasPrefix(code, "InvalidGroup."), strings.HasPrefix(code, "InvalidPlacementGroup."),
		strings.HasPrefix(code, "InvalidCapacityReservationId."):
		kind = launcher.ErrInvalid
	case throttleCodes[code]:
		kind = launcher.ErrThrottled
	case unavailableCodes[code]:
		kind = launcher.ErrUnavailable
	case code == "" && httpStatus(err) == 0:
		// No answer: the transport's failure, or the caller's deadline.
		if classified := launcher.ClassifyTransport(err); classified != err {
			return fmt.Errorf("%s: %s: %w", InfraName, what, classified)
		}
		return fmt.Errorf("%s: %s: %w", InfraName, what, err)
	default:
		if kind = launcher.ClassifyHTTPStatus(httpStatus(err)); kind == nil {
			return fmt.Errorf("%s: %s: %w", InfraName, what, err)
		}
	}
	return fmt.Errorf("%w: %s: %s: %w", kind, InfraName, what, err)
}

// noRetryCapacity stops the SDK's retryer from retrying capacity errors, which EC2 sends with
// HTTP 500: the same zone will not have capacity a second later, and the provisioner's
// failover to the next zone is the right retry.
var noRetryCapacity = retry.IsErrorRetryableFunc(func(err error) awssdk.Ternary {
	if capacityCodes[errorCode(err)] {
		return awssdk.FalseTernary
	}
	return awssdk.UnknownTernary
})
