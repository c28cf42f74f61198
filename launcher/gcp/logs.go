package gcp

import (
	"context"
	"errors"
	"io"
	"strings"
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
	contents, next, err := p.serialOutput(ctx, zone, name, 0)
	if err != nil {
		return err
	}
	if _, err := io.WriteString(w, tail(contents, opts.Tail)); err != nil || !opts.Follow {
		return err
	}
	t := time.NewTicker(p.opts.LogInterval)
	defer t.Stop()
	for {
		ended, err := p.stopped(ctx, zone, name)
		if err != nil {
			return err
		}
		var more string
		more, next, err = p.serialOutput(ctx, zone, name, next)
		switch {
		case errors.Is(err, launcher.ErrNotFound):
			return nil // deleted: its output went with it
		case err != nil:
			return err
		}
		if _, err := io.WriteString(w, more); err != nil {
			return err
		}
		if ended {
			return nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
		}
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

// tail is the last n lines of s (all when n is negative).
func tail(s string, n int) string {
	if n < 0 || s == "" {
		return s
	}
	if n == 0 {
		return ""
	}
	end := len(s)
	if strings.HasSuffix(s, "\n") {
		end--
	}
	for i := 0; i < n; i++ {
		j := strings.LastIndexByte(s[:end], '\n')
		if j < 0 {
			return s
		}
		end = j
	}
	return s[end+1:]
}
