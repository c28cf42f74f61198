package gcp

import (
	"context"
	"errors"
	"io"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"

	"github.com/ferryserve/ferry/launcher"
)

// DefaultLogInterval is how often StreamLogs reads the serial port again when following.
const DefaultLogInterval = 2 * time.Second

// StreamLogs writes a VM's serial port 1: what its startup script printed (on GCE the guest
// agent forwards it there, prefixed, along with the firmware's, kernel's and agent's own
// lines), the last opts.Tail lines, then with opts.Follow what follows, read from the last
// byte offset every Options.LogInterval until the VM has stopped (and its last output is
// written) or ctx ends.
//
// GCE keeps the last 1 MiB of a port's output and serves it close to live, by byte offset, so
// following loses nothing unless more than 1 MiB is written between two reads; the output is
// gone when the VM is deleted. The agent also ships startup-script output to Cloud Logging,
// where a whole job's log belongs (Ferry does not read it from there).
func (p *Provider) StreamLogs(ctx context.Context, id string, opts launcher.LogOptions, w io.Writer) error {
	zone, name, err := parseID(id)
	if err != nil {
		return err
	}
	return launcher.StreamPolledLog(ctx, &serialLog{p: p, zone: zone, name: name}, opts, p.opts.LogInterval, w)
}

// serialLog is a VM's serial port 1 read on from the byte offset where the previous read ended.
type serialLog struct {
	p          *Provider
	zone, name string
	next       int64 // where the next read starts
	read       bool  // whether a read has been made
}

var _ launcher.PolledLog = (*serialLog)(nil)

// Read returns the port's output from where the previous read ended. After the first read a
// VM that is not found was deleted, and its output went with it (io.EOF).
func (s *serialLog) Read(ctx context.Context) (string, error) {
	more, next, err := s.p.serialOutput(ctx, s.zone, s.name, s.next)
	if errors.Is(err, launcher.ErrNotFound) && s.read {
		return "", io.EOF
	}
	if err != nil {
		return "", err
	}
	s.next, s.read = next, true
	return more, nil
}

// Ended reports whether the VM no longer runs (or is gone).
func (s *serialLog) Ended(ctx context.Context) (bool, error) { return s.p.stopped(ctx, s.zone, s.name) }

// stopped reports whether the VM no longer runs (or is gone): its output is then complete.
func (p *Provider) stopped(ctx context.Context, zone, name string) (bool, error) {
	vm, err := p.instances.Get(ctx, &computepb.GetInstanceRequest{Project: p.opts.Project, Zone: zone, Instance: name})
	if err != nil {
		err = classify(err, "get "+name)
		if errors.Is(err, launcher.ErrNotFound) {
			return true, nil
		}
		return false, err
	}
	switch vm.GetStatus() {
	case "PROVISIONING", "STAGING", "RUNNING", "REPAIRING", "PENDING":
		return false, nil
	}
	return true, nil
}
