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
	console, err := p.consoleOutput(ctx, region, iid)
	if err != nil {
		return err
	}
	if _, err := io.WriteString(w, tail(console, opts.Tail)); err != nil || !opts.Follow {
		return err
	}
	t := time.NewTicker(p.opts.LogInterval)
	defer t.Stop()
	for {
		ended, err := p.ended(ctx, region, iid)
		if err != nil {
			return err
		}
		next, err := p.consoleOutput(ctx, region, iid)
		if err != nil {
			return err
		}
		if _, err := io.WriteString(w, newOutput(console, next)); err != nil {
			return err
		}
		console = next
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
