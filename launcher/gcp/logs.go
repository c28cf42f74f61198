package gcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/vmnode"
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
	return vmnode.StreamPolledLog(ctx, &serialLog{p: p, zone: zone, name: name, stalled: opts.NotifyStalled}, opts, p.opts.LogInterval, w)
}

// serialLog is a VM's serial port 1 read on from the byte offset where the previous read ended.
//
// Once it has been read, the API failing (unavailable or throttling) does not end a followed
// log: reads are skipped for a back-off that doubles from LogInterval up to maxLogBackoff
// (logged when the failure starts and when it ends), and the error ends the stream only after
// maxLogOutage of failing. Nothing is lost meanwhile: the next read starts at the same offset.
// Each failed read is told to the stream's LogOptions.Stalled.
type serialLog struct {
	p          *Provider
	zone, name string
	next       int64 // where the next read starts
	read       bool  // whether a read has been made
	ended      bool  // whether Ended said the VM stopped: the next read is the last
	down       outage
	stalled    func(error)
}

// Back-off of a followed serial port whose reads fail.
const (
	maxLogBackoff = time.Minute
	maxLogOutage  = 10 * time.Minute
)

var _ vmnode.PolledLog = (*serialLog)(nil)

// Read returns the port's output from where the previous read ended. After the first read a
// VM that is not found was deleted, and its output went with it (io.EOF).
func (s *serialLog) Read(ctx context.Context) (string, error) {
	if s.read && !s.down.due(time.Now()) {
		return "", nil
	}
	more, next, err := s.p.serialOutput(ctx, s.zone, s.name, s.next)
	if errors.Is(err, launcher.ErrNotFound) && s.read {
		return "", io.EOF
	}
	if err != nil {
		if s.read && !s.ended {
			return "", s.failed(err)
		}
		return "", err // the first read, or the last (the VM stopped): nothing to wait for
	}
	s.answered()
	s.next, s.read = next, true
	return more, nil
}

// Ended reports whether the VM no longer runs (or is gone); while the API fails, it has not.
func (s *serialLog) Ended(ctx context.Context) (bool, error) {
	if !s.down.due(time.Now()) {
		return false, nil
	}
	ended, err := s.p.stopped(ctx, s.zone, s.name)
	if err != nil {
		return false, s.failed(err)
	}
	s.answered()
	s.ended = ended
	return ended, nil
}

// failed backs the port off after an infra fault, and returns the errors that end the stream:
// any other, and one that has lasted maxLogOutage.
func (s *serialLog) failed(err error) error {
	if !errors.Is(err, launcher.ErrUnavailable) && !errors.Is(err, launcher.ErrThrottled) {
		return err
	}
	s.stalled(err)
	now := time.Now()
	if s.down.failures > 0 && now.Sub(s.down.since) >= maxLogOutage {
		return fmt.Errorf("gcp: serial port of %s unreadable for %v: %w", s.name, now.Sub(s.down.since).Round(time.Second), err)
	}
	wait, first := s.down.fail(now, s.p.opts.LogInterval, maxLogBackoff, rand.Float64())
	log := s.p.log.With(zap.String("zone", s.zone), zap.String("instance", s.name))
	if first {
		log.Warn("following a serial port: the API is not answering; reading it less often until it does", zap.Error(err))
	} else {
		log.Debug("following a serial port: the API is still not answering", zap.Int("failed_reads", s.down.failures), zap.Duration("next_in", wait))
	}
	return nil
}

// answered ends a run of failures, saying so.
func (s *serialLog) answered() {
	if run := s.down.end(); run.failures > 0 {
		s.p.log.Info("following a serial port: the API answers again", zap.String("zone", s.zone), zap.String("instance", s.name),
			zap.Duration("failing_for", time.Since(run.since).Round(time.Millisecond)))
	}
}

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
