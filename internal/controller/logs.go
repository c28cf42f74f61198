package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/launcher"
)

// Replica logs on every infra: local keeps a file the controller reads; Kubernetes serves a
// pod's log through the API server; the VM clouds serve their console output. A follow ends
// when the replica does (it leaves the service, fails, or its instance is replaced) or when the
// client hangs up.

const (
	// replicaWatch paces the check of whether a followed replica still runs.
	replicaWatch = time.Second
	// lastLinesGrace lets a replica's last lines reach its log before a follow stops.
	lastLinesGrace = time.Second
	// logRetry paces the attempts to follow a replica that has no log yet (a pod not started).
	logRetry = time.Second
)

// ReplicaLogPath implements api.Backend: the local file with a replica's output, for infras
// that keep one.
func (c *Controller) ReplicaLogPath(name string, id int) (string, error) {
	inst, err := c.replicaInstance(name, id)
	if err != nil {
		return "", err
	}
	p, err := c.provider.LogPath(inst)
	if err != nil {
		return "", fmt.Errorf("replica %d of %q: %v: %w", id, name, err, api.ErrNotFound)
	}
	return p, nil
}

// StreamReplicaLog implements api.ReplicaLogStreamer: a replica's output from the file its
// infra keeps here, or else through its infra's API; with opts.Follow until the replica ends or
// ctx ends. An unknown service or replica is api.ErrNotFound.
func (c *Controller) StreamReplicaLog(ctx context.Context, name string, id int, opts api.LogOptions, w io.Writer) error {
	inst, err := c.replicaInstance(name, id)
	for opts.Follow && errors.Is(err, errNoInstanceYet) {
		// Following a replica still being placed waits for its instance.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(logRetry):
		}
		inst, err = c.replicaInstance(name, id)
	}
	if err != nil {
		return err
	}
	if opts.Follow {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go c.cancelWhenReplicaEnds(ctx, cancel, name, id, inst)
	}
	if path, err := c.provider.LogPath(inst); err == nil {
		return api.CopyLogFile(ctx, path, opts, w)
	}
	return c.streamInfraLog(ctx, name, id, inst, opts, w)
}

// streamInfraLog reads an instance's output through its infra's API. Following a replica that
// has no log yet (a pod still Pending) waits for one, as long as the replica runs.
func (c *Controller) streamInfraLog(ctx context.Context, name string, id int, inst string, opts api.LogOptions, w io.Writer) error {
	err := launcher.StreamLogsRetrying(ctx, c.provider, inst, launcher.LogOptions{Tail: opts.Tail, Follow: opts.Follow}, w, logRetry)
	if errors.Is(err, launcher.ErrNotFound) {
		return fmt.Errorf("replica %d of %q: %v: %w", id, name, err, api.ErrNotFound)
	}
	return err
}

// cancelWhenReplicaEnds calls cancel once replica id of service name no longer runs on
// instance inst, or when ctx ends.
func (c *Controller) cancelWhenReplicaEnds(ctx context.Context, cancel context.CancelFunc, name string, id int, inst string) {
	tick := time.NewTicker(replicaWatch)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if c.replicaRuns(name, id, inst) {
			continue
		}
		select {
		case <-ctx.Done():
		case <-time.After(lastLinesGrace):
		}
		cancel()
		return
	}
}

// replicaRuns reports whether the service's replica id is still on instance inst and not
// ended.
func (c *Controller) replicaRuns(name string, id int, inst string) bool {
	s, err := c.serviceNamed(name)
	if err != nil {
		return false
	}
	for _, r := range s.mgr.Replicas() {
		if r.ID == id {
			// A replica shutting down still writes its last lines.
			return r.InstanceID == inst && !r.Status.Terminal()
		}
	}
	return false
}

// errNoInstanceYet marks a replica that is being placed: it has no instance, so no log, yet.
var errNoInstanceYet = errors.New("no instance yet, so no log")

// replicaInstance is the instance id of a service's replica.
func (c *Controller) replicaInstance(name string, id int) (string, error) {
	s, err := c.serviceNamed(name)
	if err != nil {
		return "", err
	}
	for _, r := range s.mgr.Replicas() {
		switch {
		case r.ID != id:
			continue
		case r.InstanceID == "" && r.Status.Terminal():
			return "", fmt.Errorf("replica %d of %q ended (%s) without an instance, so it has no log: %w", id, name, r.Status, api.ErrNotFound)
		case r.InstanceID == "":
			return "", fmt.Errorf("replica %d of %q has %w: %w", id, name, errNoInstanceYet, api.ErrNotFound)
		}
		return r.InstanceID, nil
	}
	return "", fmt.Errorf("service %q has no replica %d (see 'ferry serve status %s'): %w", name, id, name, api.ErrNotFound)
}
