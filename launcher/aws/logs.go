package aws

import (
	"context"
	"encoding/base64"
	"io"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/ferryserve/ferry/launcher"
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
func (p *Provider) StreamLogs(ctx context.Context, id string, opts launcher.LogOptions, w io.Writer) error {
	region, iid, err := p.parseID(id)
	if err != nil {
		return err
	}
	return launcher.StreamPolledLog(ctx, &consoleLog{p: p, region: region, iid: iid}, opts, p.opts.LogInterval, w)
}

// consoleLog is an instance's console output read again and again: each read is EC2's latest
// window, of which only what follows the previous one is new.
type consoleLog struct {
	p           *Provider
	region, iid string
	last        string // the previous read's window
}

var _ launcher.PolledLog = (*consoleLog)(nil)

// Read returns what the console window gained since the previous read (newOutput).
func (c *consoleLog) Read(ctx context.Context) (string, error) {
	next, err := c.p.consoleOutput(ctx, c.region, c.iid)
	if err != nil {
		return "", err
	}
	more := newOutput(c.last, next)
	c.last = next
	return more, nil
}

// Ended reports whether the instance has ended (or is ending).
func (c *consoleLog) Ended(ctx context.Context) (bool, error) { return c.p.ended(ctx, c.region, c.iid) }

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
