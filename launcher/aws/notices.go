package aws

import (
	"context"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
)

// Notices reports Ferry's spot instances that EC2 reclaims, until ctx ends. EC2 has no watch
// API, so a goroutine polls DescribeInstances (one call per region, filtered to Ferry's
// shutting-down or terminated spot instances) every Options.NoticeInterval, 5s by default,
// and sends each reclaimed instance once, with At the time it was seen.
//
// This sees a preemption when EC2 starts shutting the VM down, not at EC2's two-minute
// interruption warning: that warning is only published to the VM's metadata service and to
// EventBridge, neither of which this provider reads yet.
func (p *Provider) Notices(ctx context.Context) <-chan launcher.Notice {
	seen := map[string]bool{}
	return launcher.PollNotices(ctx, p.opts.NoticeInterval, func(ctx context.Context, ch chan<- launcher.Notice) bool {
		return p.pollPreemptions(ctx, seen, ch)
	})
}

// pollPreemptions sends notices for newly reclaimed spot instances; seen keeps those already
// sent and is trimmed to what EC2 still shows. It returns false once ctx has ended.
func (p *Provider) pollPreemptions(ctx context.Context, seen map[string]bool, ch chan<- launcher.Notice) bool {
	filters := []types.Filter{
		{Name: awssdk.String("tag:" + launcher.LabelOwner), Values: []string{"true"}},
		{Name: awssdk.String("instance-lifecycle"), Values: []string{"spot"}},
		{Name: awssdk.String("instance-state-name"), Values: []string{"shutting-down", "terminated"}},
	}
	now := make(map[string]bool)
	for _, region := range p.opts.Regions {
		err := p.describe(ctx, region, filters, func(in types.Instance) {
			if code, _ := stateReason(in); code == reasonSpotTermination {
				now[InfraName+"/"+region+"/"+awssdk.ToString(in.InstanceId)] = true
			}
		})
		if err != nil {
			if ctx.Err() != nil {
				return false
			}
			p.log.Warn("poll for spot preemptions", zap.String("region", region), zap.Error(err))
			// Keep what was seen: a failed region must not re-announce its instances later.
			for id := range seen {
				now[id] = now[id] || seen[id]
			}
		}
	}
	for id := range now {
		if seen[id] {
			continue
		}
		select {
		case ch <- launcher.Notice{InstanceID: id, At: time.Now()}:
		case <-ctx.Done():
			return false
		}
	}
	clear(seen)
	for id := range now {
		seen[id] = true
	}
	return true
}
