package gcp

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/googleapi"

	"github.com/ferryserve/ferry/launcher"
)

// GCP reports a failure in one of two places, and the provider reads both:
//
//   - HTTP errors: the request itself is refused. The REST client returns a *googleapi.Error
//     (Google's JSON envelope: code, message, errors[].reason such as "quotaExceeded",
//     "forbidden", "invalid"); the operation-polling helpers wrap it in an *apierror.APIError
//     that unwraps to the same type.
//   - Operation errors: the insert is accepted and its operation ends DONE with
//     error.errors[].code (ZONE_RESOURCE_POOL_EXHAUSTED, QUOTA_EXCEEDED, UNSUPPORTED_OPERATION)
//     and httpErrorStatusCode. This is how capacity and quota failures usually arrive.
//
// Both are matched on codes, never on message text. An error that never reached the API (a
// refused or reset connection, a request its deadline cut: RequestTimeout, transport.go) is
// launcher.ErrUnavailable through launcher.ClassifyTransport. Throttling (rateLimitExceeded,
// userRateLimitExceeded, HTTP 429) is launcher.ErrThrottled; the API failing (backendError,
// internalError, HTTP 5xx without a code that says otherwise) is launcher.ErrUnavailable, so
// that the provisioner's breakers count them against GCP rather than against the request.

// sentinels maps a normalised reason or operation error code (lowercase, no underscores) to
// the launcher error it means.
var sentinels = map[string]error{
	"zoneresourcepoolexhausted":            launcher.ErrNoCapacity,
	"zoneresourcepoolexhaustedwithdetails": launcher.ErrNoCapacity,
	"resourcepoolexhausted":                launcher.ErrNoCapacity,
	"quotaexceeded":                        launcher.ErrQuota,
	"unsupportedoperation":                 launcher.ErrInvalid,
	"invalid":                              launcher.ErrInvalid,
	"invalidparameter":                     launcher.ErrInvalid,
	"invalidargument":                      launcher.ErrInvalid,
	"badrequest":                           launcher.ErrInvalid,
	"required":                             launcher.ErrInvalid,
	"autherror":                            launcher.ErrUnauthorized,
	"forbidden":                            launcher.ErrUnauthorized,
	"insufficientpermissions":              launcher.ErrUnauthorized,
	"permissiondenied":                     launcher.ErrUnauthorized,
	"accessnotconfigured":                  launcher.ErrUnauthorized,
	"unauthorized":                         launcher.ErrUnauthorized,
	"notfound":                             launcher.ErrNotFound,
	"resourcenotfound":                     launcher.ErrNotFound,
}

// infraReasons are the reasons that say the API itself failed or throttled. They are read
// before the HTTP status: a 403 rate limit is not a permission problem.
var infraReasons = map[string]error{
	"ratelimitexceeded":     launcher.ErrThrottled,
	"userratelimitexceeded": launcher.ErrThrottled,
	"backenderror":          launcher.ErrUnavailable,
	"internalerror":         launcher.ErrUnavailable,
}

func normalise(code string) string {
	return strings.ToLower(strings.ReplaceAll(code, "_", ""))
}

// classify wraps a client error with the launcher error it means, keeping the original in
// the chain (errors.As still finds the *googleapi.Error).
func classify(err error, what string) error {
	if err == nil {
		return nil
	}
	var gerr *googleapi.Error
	if !errors.As(err, &gerr) {
		return fmt.Errorf("gcp: %s: %w", what, launcher.ClassifyTransport(err))
	}
	for _, item := range gerr.Errors {
		r := normalise(item.Reason)
		if s, ok := infraReasons[r]; ok {
			return fmt.Errorf("gcp: %s: %w: %w", what, s, err)
		}
		if s, ok := sentinels[r]; ok {
			return fmt.Errorf("gcp: %s: %w: %w", what, s, err)
		}
	}
	if s := byStatus(gerr.Code); s != nil {
		return fmt.Errorf("gcp: %s: %w: %w", what, s, err)
	}
	return fmt.Errorf("gcp: %s: %w", what, err)
}

// byStatus is the launcher error an HTTP status means when no reason said: throttled for 429,
// unavailable for 5xx.
func byStatus(code int) error {
	switch code {
	case http.StatusUnauthorized, http.StatusForbidden:
		return launcher.ErrUnauthorized
	case http.StatusBadRequest:
		return launcher.ErrInvalid
	case http.StatusNotFound:
		return launcher.ErrNotFound
	}
	if s := launcher.ClassifyHTTPStatus(code); s != nil {
		return s
	}
	if code >= 500 && code < 600 {
		return launcher.ErrUnavailable
	}
	return nil
}

// OperationError is a DONE operation that failed: the codes and messages of its
// error.errors, and its HTTP status. It wraps the launcher error the first code means.
type OperationError struct {
	Operation  string
	Type       string
	HTTPStatus int
	Codes      []string
	Messages   []string
	kind       error
}

func (e *OperationError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "operation %s (%s) failed", e.Operation, e.Type)
	for i, c := range e.Codes {
		fmt.Fprintf(&b, "; %s: %s", c, e.Messages[i])
	}
	return b.String()
}

// Unwrap returns the launcher error the operation's error code means, if any.
func (e *OperationError) Unwrap() error { return e.kind }

// operationError returns nil for an operation that did not fail.
func operationError(op *computepb.Operation) error {
	if len(op.GetError().GetErrors()) == 0 && (op.HttpErrorStatusCode == nil || op.GetHttpErrorStatusCode() < 300) {
		return nil
	}
	e := &OperationError{Operation: op.GetName(), Type: op.GetOperationType(), HTTPStatus: int(op.GetHttpErrorStatusCode())}
	for _, item := range op.GetError().GetErrors() {
		e.Codes = append(e.Codes, item.GetCode())
		e.Messages = append(e.Messages, item.GetMessage())
		if e.kind == nil {
			if s, ok := sentinels[normalise(item.GetCode())]; ok {
				e.kind = s
			}
		}
	}
	if e.kind == nil {
		e.kind = byStatus(e.HTTPStatus)
	}
	if len(e.Codes) == 0 {
		e.Codes, e.Messages = []string{op.GetHttpErrorMessage()}, []string{""}
	}
	return e
}

// isConflict reports a 409: the resource already exists.
func isConflict(err error) bool {
	var gerr *googleapi.Error
	return errors.As(err, &gerr) && gerr.Code == http.StatusConflict
}
