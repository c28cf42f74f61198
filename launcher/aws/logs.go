package aws

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

// DefaultLogInterval is how often StreamLogs reads the console output again when following.
const DefaultLogInterval = 5 * time.Second

// StreamLogs writes an instance's console output: what its user-data printed (a real VM's
// console also has the kernel's and cloud-init's lines), the last opts.Tail lines, then with
// opts.Follow what follows, read again every Options.LogInterval until the instance has ended
// (and its last output is written) or ctx ends.
//
// This is EC2's console output and its limits are EC2's: GetConsoleOutput returns the last
// 64 KiB only, so an earlier part of a long log is gone, and following it skips whatever
// scrolled out between two reads; on instances other than Nitro it is posted only at boot,
// reboot and termination, so following shows nothing new until the instance ends. A job that
// needs its whole log belongs in CloudWatch Logs (its agent on the image) or in its checkpoint
// bucket; EC2 ships nothing else off the VM. The output stays readable for as long as EC2
// shows the terminated instance (about an hour).
//
// Once following, a read that fails for EC2's own reasons (unavailable, throttled) does not
// end the stream: the instance is still there, and its output will be too. The reads back off
// (the interval doubled per failure up to maxLogBackoff) until EC2 answers again or ctx ends,
// and the log says so when it starts and when it ends, not at every read; each failed read
// is told to opts.Stalled.
func (p *Provider) StreamLogs(ctx context.Context, id string, opts launcher.LogOptions, w io.Writer) error {
	region, iid, err := p.parseID(id)
	if err != nil {
		return err
	}
	return vmnode.StreamPolledLog(ctx, &consoleLog{p: p, region: region, iid: iid, stalled: opts.NotifyStalled}, opts, p.opts.LogInterval, w)
}

// maxLogBackoff caps the wait between two reads of a console whose reads fail.
const maxLogBackoff = time.Minute

// consoleLog is an instance's console output read again and again: each read is EC2's latest
// window, of which only what follows the previous one is new.
type consoleLog struct {
	p           *Provider
	region, iid string
	last        string // the previous read's window
	// read is set once the first read succeeded: the stream is following.
	read bool
	// failingSince is when reads began failing for EC2's reasons; zero while they work.
	failingSince time.Time
	// stalled hears of each read that failed for EC2's reasons while following.
	stalled func(error)
}

var _ vmnode.PolledLog = (*consoleLog)(nil)

// Read returns what the console window gained since the previous read (newOutput).
func (c *consoleLog) Read(ctx context.Context) (string, error) {
	var next string
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		next, err = c.p.consoleOutput(ctx, c.region, c.iid)
		return err
	})
	if err != nil {
		return "", err
	}
	c.read = true
	more := newOutput(c.last, next)
	c.last = next
	return more, nil
}

// Ended reports whether the instance has ended (or is ending).
func (c *consoleLog) Ended(ctx context.Context) (bool, error) {
	var ended bool
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		ended, err = c.p.ended(ctx, c.region, c.iid)
		return err
	})
	return ended, err
}

// retry calls call, and while following calls it again as long as it fails for EC2's own
// reasons, waiting longer each time, until it succeeds, fails otherwise, or ctx ends.
func (c *consoleLog) retry(ctx context.Context, call func(context.Context) error) error {
	wait := c.p.opts.LogInterval
	for {
		err := call(ctx)
		if err == nil && !c.failingSince.IsZero() {
			c.p.log.Info("EC2 serves the console output again", zap.String("instance", c.iid), zap.String("region", c.region),
				zap.Duration("failed_for", time.Since(c.failingSince).Round(time.Millisecond)))
			c.failingSince = time.Time{}
		}
		if err == nil || !c.read || ctx.Err() != nil || !(errors.Is(err, launcher.ErrUnavailable) || errors.Is(err, launcher.ErrThrottled)) {
			return err
		}
		c.stalled(err)
		if c.failingSince.IsZero() {
			c.failingSince = time.Now()
			c.p.log.Warn("EC2 fails to serve the console output; reading it less often until it answers",
				zap.String("instance", c.iid), zap.String("region", c.region), zap.Error(err))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
		wait = min(wait*2, max(maxLogBackoff, c.p.opts.LogInterval))
	}
}

// ended reports whether the instance has ended (or is ending): its output is then complete.
func (p *Provider) ended(ctx context.Context, region, iid string) (bool, error) {
	out, err := p.clients[region].DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{iid}})
	if errorCode(err) == "InvalidInstanceID.NotFound" {
		return true, nil
	}
	if err != nil {
		return false, classify(err, "describe "+iid)
	}
	for _, r := range out.Reservations {
		for _, in := range r.Instances {
			if in.State != nil {
				switch in.State.Name {
				case types.InstanceStateNamePending, types.InstanceStateNameRunning:
					return false, nil
				}
			}
		}
	}
	return true, nil
}

// newOutput is what next, a later read of a console that keeps its last 64 KiB, adds to prev:
// what follows the longest end of prev that next starts with (the window moved by what
// scrolled out), all of next when nothing of prev is left.
func newOutput(prev, next string) string {
	for i := max(0, len(prev)-len(next)); i < len(prev); i++ {
		if strings.HasPrefix(next, prev[i:]) {
			return next[len(prev)-i:]
		}
	}
	return next
}

// decodeConsole decodes GetConsoleOutput's base64; output that is not base64 is returned as is.
func decodeConsole(s string) string {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return s
	}
	return string(b)
}
