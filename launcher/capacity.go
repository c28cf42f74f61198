package launcher

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Queued and reserved capacity (configs.Capacity; docs/jobs.md, "Queued and reserved capacity").
// A provider reads spec.Resources.Capacity and spec.Placement's Reservation, Queued and window;
// it offers reservations through Offering.Reservation and queues through Offering.QueueWait.

// Kinds of ReservationOffer.
const (
	KindGCPFutureReservation = "gcp-future-reservation"
	KindGCPReservation       = "gcp-reservation"
	KindAWSCapacityBlock     = "aws-capacity-block"
	KindAWSODCR              = "aws-odcr"
	// KindKubernetesProvisioning is a ProvisioningRequest's booked capacity.
	KindKubernetesProvisioning = "kubernetes-provisioning-request"
)

// ReservationOffer is one reservation or capacity block: capacity already paid for whether
// used or not, so its marginal cost is zero while its window lasts.
type ReservationOffer struct {
	// ID is what a launch targets (Placement.Reservation): a GCP reservation name, an AWS
	// capacity reservation id (cr-…). Name is a human name where the cloud has one.
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	// Start and End bound the window; zero Start is "already active", zero End "no end"
	// (an open ODCR). Instances in it are stopped by the cloud at End.
	Start time.Time `json:"start,omitzero"`
	End   time.Time `json:"end,omitzero"`
	// Count is how many instances the reservation holds, InUse how many run in it now.
	Count int    `json:"count"`
	InUse int    `json:"in_use"`
	Kind  string `json:"kind"`
	// Infra, Region and Zone say where it is ("aws", "us-east-1", "us-east-1a"); a provider's
	// Reservations fills them, Offerings may leave them to the Offering.
	Infra  string `json:"infra,omitempty"`
	Region string `json:"region,omitempty"`
	Zone   string `json:"zone,omitempty"`
	// InstanceType and Accelerator describe one instance of it, for listings.
	InstanceType string `json:"instance_type,omitempty"`
	Accelerator  string `json:"accelerator,omitempty"`
	// PricePerHour is what the whole reservation costs per hour, paid whether used or not
	// (0 when unknown or prepaid); for listings only.
	PricePerHour float64 `json:"price_per_hour,omitempty"`
}

// Free is how many more instances fit in the reservation.
func (r ReservationOffer) Free() int { return max(0, r.Count-r.InUse) }

// Active reports whether the window covers t.
func (r ReservationOffer) Active(t time.Time) bool {
	return !t.Before(r.Start) && (r.End.IsZero() || t.Before(r.End))
}

// Covers reports whether a task starting at start (or at the window's start, if later) and
// running d (0: no limit) ends within the window. A task with no limit fits only a window
// with no end.
func (r ReservationOffer) Covers(start time.Time, d time.Duration) bool {
	if r.Start.After(start) {
		start = r.Start
	}
	if r.End.IsZero() {
		return true
	}
	return d > 0 && !start.Add(d).After(r.End)
}

// Reserver is an optional Provider capability: the reservations and capacity blocks the
// account holds, for `ferry show-gpus --reservations`.
type Reserver interface {
	Reservations(ctx context.Context) ([]ReservationOffer, error)
}

// QueuedError is a launch that waits for capacity: in the cloud's queue (a ProvisioningRequest,
// a resize request) or for a reservation's window. errors.Is(err, ErrQueued) holds.
type QueuedError struct {
	// Since is when the wait began (the request's creation), Reason what it waits for.
	Since  time.Time
	Reason string
}

func (e *QueuedError) Error() string {
	return fmt.Sprintf("%s since %s: %s", ErrQueued, e.Since.UTC().Format(time.RFC3339), e.Reason)
}

// Unwrap makes errors.Is(err, ErrQueued) hold.
func (e *QueuedError) Unwrap() error { return ErrQueued }

// Queued returns a QueuedError.
func Queued(since time.Time, format string, args ...any) error {
	return &QueuedError{Since: since, Reason: fmt.Sprintf(format, args...)}
}

// AsQueued reports whether err is a wait for capacity, and since when and why. An ErrQueued
// that is not a QueuedError reports a zero Since and the error's text.
func AsQueued(err error) (QueuedError, bool) {
	var q *QueuedError
	if errors.As(err, &q) {
		return *q, true
	}
	if errors.Is(err, ErrQueued) {
		return QueuedError{Reason: err.Error()}, true
	}
	return QueuedError{}, false
}

// QueueWaitUnknown is an Offering's QueueWait when the queue's wait cannot be told: still
// queued capacity, ranked before the queues known to be longer.
const QueueWaitUnknown time.Duration = 1

// DefaultWindowLead is how long before a reservation's end a service replica in it is
// replaced (configurable in replicas): enough to launch and warm a replacement.
const DefaultWindowLead = 10 * time.Minute

// QueueWithdrawer is an optional Provider capability of infras that hold queued requests for a
// job (a ProvisioningRequest, a resize request, a wait for a reservation's window): withdraw
// job's requests that no running node of attempt uses. The jobs manager calls it when a gang
// has started (perhaps on another infra); CleanupJob withdraws everything when the job ends.
type QueueWithdrawer interface {
	WithdrawQueued(ctx context.Context, job string, attempt int) error
}
