package launcher

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Leftover is something Ferry still has to stop on an infra it could not reach when it tried:
// one instance by id, or (a teardown that could not list the infra) every instance there whose
// labels include Selector and that was launched before Before. The provisioner keeps them in a
// Ledger and finishes the cleanup once the infra answers again, after a controller restart too
// (launcher/provision/janitor.go).
type Leftover struct {
	// Key identifies the leftover in the ledger (LeftoverKey).
	Key   string `json:"key"`
	Infra string `json:"infra"`
	// InstanceID is the one instance to terminate; empty for a selector.
	InstanceID string `json:"instance_id,omitempty"`
	// Selector and Before pick the instances of a teardown that could not list the infra:
	// those launched later belong to something new (a service re-created under the same name).
	Selector map[string]string `json:"selector,omitempty"`
	Before   time.Time         `json:"before,omitzero"`
	// Owner says whose it was, for people: "service chat", "job 7".
	Owner string `json:"owner,omitempty"`
	// Reason is why it was left: the infra's error.
	Reason string    `json:"reason,omitempty"`
	Since  time.Time `json:"since"`
}

// LeftoverKey is the ledger key of a leftover: its instance id, or its infra and selector. A
// later teardown of the same selector replaces an earlier one's leftover (its later cut-off
// covers what the earlier did), so retried teardowns do not pile up entries.
func LeftoverKey(l Leftover) string {
	if l.InstanceID != "" {
		return l.InstanceID
	}
	var b strings.Builder
	b.WriteString("select|" + l.Infra + "|")
	for i, k := range slices.Sorted(maps.Keys(l.Selector)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + l.Selector[k])
	}
	return b.String()
}

// Describe says what the leftover is, in a line for people.
func (l Leftover) Describe() string {
	if l.InstanceID != "" {
		return l.InstanceID
	}
	sel := make([]string, 0, len(l.Selector))
	for _, k := range slices.Sorted(maps.Keys(l.Selector)) {
		sel = append(sel, k+"="+l.Selector[k])
	}
	return fmt.Sprintf("any other instance on %s labelled %s launched before %s", l.Infra, strings.Join(sel, ","), l.Before.UTC().Format(time.RFC3339))
}

// Ledger keeps leftovers across controller restarts (the controller's store implements it).
type Ledger interface {
	// PutLeftover records l under l.Key, replacing what was there.
	PutLeftover(l Leftover) error
	// DeleteLeftover forgets key; forgetting an unknown key is not an error.
	DeleteLeftover(key string) error
	// ListLeftovers returns every leftover, ordered by key.
	ListLeftovers() ([]Leftover, error)
}

// LeftoverKeeper is an optional Provider capability (the provisioner has it): take over what a
// caller could not stop, and stop it once its infra answers again.
type LeftoverKeeper interface {
	// LeaveBehind records l (Key and Since are filled when empty).
	LeaveBehind(l Leftover) error
	// Leftovers are what is still to stop, oldest first.
	Leftovers() []Leftover
}

// LeftBehindError is a Terminate that could not reach its infra: the instance is now a
// leftover the provisioner will stop when the infra answers again.
type LeftBehindError struct {
	Leftover Leftover
	Err      error
}

func (e *LeftBehindError) Error() string {
	return fmt.Sprintf("%s left on %s (Ferry stops it when %s answers again): %v", e.Leftover.Describe(), e.Leftover.Infra, e.Leftover.Infra, e.Err)
}

func (e *LeftBehindError) Unwrap() error { return e.Err }

// LeftBehind returns the leftover when err is a LeftBehindError.
func LeftBehind(err error) (Leftover, bool) {
	var lb *LeftBehindError
	if errors.As(err, &lb) {
		return lb.Leftover, true
	}
	return Leftover{}, false
}
