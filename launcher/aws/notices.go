package aws

import (
	"context"
	"errors"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
)

// InterruptionNotice is how long EC2 lets a spot instance run after its interruption warning.
const InterruptionNotice = 2 * time.Minute

// spotWarningCodes are the spot request status codes that carry EC2's interruption warning
// ("Spot request status", EC2 User Guide). A one-time request whose instance terminates on
// interruption, as Ferry's do, goes straight to instance-terminated-no-capacity while the
// instance runs out its notice (and keeps that code after); the guide's lifecycle table also
// lists marked-for-termination for a request whose instance still runs. Either code's update
// time is when the warning was given.
var spotWarningCodes = []string{"marked-for-termination", "instance-terminated-no-capacity"}

// Notices reports Ferry's instances that EC2 reclaims (spot, and those in capacity blocks that
// end), until ctx ends. EC2 has no watch API, so a goroutine polls every
// Options.NoticeInterval, 5s by default, and sends each instance once:
//
//   - at EC2's interruption warning, two minutes ahead: DescribeSpotInstanceRequests, filtered
//     to requests tagged as Ferry's (Launch tags a spot request like its instance) whose
//     status code carries the warning, with At the warning's time plus InterruptionNotice;
//   - failing that, once the instance shuts down: DescribeInstances, filtered to Ferry's
//     shutting-down or terminated spot instances with reason Server.SpotInstanceTermination,
//     with At the time it was seen. This catches a warning that fell between two polls, an
//     instance launched before Launch tagged spot requests, and an account whose credentials
//     may not call DescribeSpotInstanceRequests (logged once per region, after which the region
//     is polled for shutdowns only);
//   - for an instance in a capacity block, Options.ReservationNoticeLead before EC2 begins
//     terminating the block's instances, with At that time (capacityblocks.go):
//     DescribeInstances, filtered to Ferry's capacity-block instances, and
//     DescribeCapacityReservations for their blocks' end dates.
//
// An instance's warning and its shutdown are one notice. The calls are made once per region
// per poll; the credentials need ec2:DescribeSpotInstanceRequests, ec2:DescribeInstances and
// ec2:DescribeCapacityReservations.
func (p *Provider) Notices(ctx context.Context) <-chan launcher.Notice {
	seen := map[string]bool{}
	noWarnings := map[string]bool{} // regions whose credentials may not read spot requests
	return launcher.PollNotices(ctx, p.opts.NoticeInterval, func(ctx context.Context, ch chan<- launcher.Notice) bool {
		return p.pollPreemptions(ctx, seen, noWarnings, ch)
	})
}

// pollPreemptions sends notices for newly warned or reclaimed spot instances. seen keeps those
// already sent and is trimmed to what EC2 still shows, warned or reclaimed (an instance moves
// from the one to the other between polls, and is in seen either way). It returns false once
// ctx has ended.
func (p *Provider) pollPreemptions(ctx context.Context, seen, noWarnings map[string]bool, ch chan<- launcher.Notice) bool {
	now := time.Now()
	reclaims := map[string]time.Time{} // instance id -> when EC2 reclaims (or reclaimed) it
	failed := false
	polls := []struct {
		what string
		poll func(ctx context.Context, region string, now time.Time, reclaims map[string]time.Time) error
	}{
		{"spot interruption warnings", p.spotWarnings},
		{"spot preemptions", p.spotTerminations},
		{"capacity block ends", p.blockEnds},
	}
	for _, region := range p.opts.Regions {
		for i, pl := range polls {
			if i == 0 && noWarnings[region] {
				continue
			}
			err := pl.poll(ctx, region, now, reclaims)
			switch {
			case err == nil:
			case ctx.Err() != nil:
				return false
			case i == 0 && errors.Is(err, launcher.ErrUnauthorized):
				// Not a passing failure: say so once and rely on shutdowns in this region.
				noWarnings[region] = true
				p.log.Warn("spot interruption warnings unavailable: the credentials may not call "+
					"DescribeSpotInstanceRequests; spot preemptions are noticed when instances shut down",
					zap.String("region", region), zap.Error(err))
			default:
				p.log.Warn("poll for "+pl.what, zap.String("region", region), zap.Error(err))
				failed = true
			}
		}
	}
	for id, at := range reclaims {
		if seen[id] {
			continue
		}
		select {
		case ch <- launcher.Notice{InstanceID: id, At: at}:
		case <-ctx.Done():
			return false
		}
	}
	if !failed {
		// Trim to what EC2 still shows; after a failed call keep everything, so that a region
		// that did not answer does not announce its instances again later.
		clear(seen)
	}
	for id := range reclaims {
		seen[id] = true
	}
	return true
}

// spotWarnings adds region's Ferry spot instances whose requests carry an interruption
// warning, reclaimed InterruptionNotice after the warning.
func (p *Provider) spotWarnings(ctx context.Context, region string, now time.Time, reclaims map[string]time.Time) error {
	pages := ec2.NewDescribeSpotInstanceRequestsPaginator(p.clients[region], &ec2.DescribeSpotInstanceRequestsInput{
		Filters: []types.Filter{
			{Name: awssdk.String("tag:" + launcher.LabelOwner), Values: []string{"true"}},
			{Name: awssdk.String("status-code"), Values: spotWarningCodes},
		},
		MaxResults: awssdk.Int32(1000),
	})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return classify(err, "describe spot instance requests in "+region)
		}
		for _, r := range page.SpotInstanceRequests {
			iid := awssdk.ToString(r.InstanceId)
			if iid == "" {
				continue
			}
			warned := now
			if r.Status != nil && r.Status.UpdateTime != nil {
				warned = *r.Status.UpdateTime
			}
			id := InfraName + "/" + region + "/" + iid
			if at, ok := reclaims[id]; !ok || warned.Add(InterruptionNotice).Before(at) {
				reclaims[id] = warned.Add(InterruptionNotice)
			}
		}
	}
	return nil
}

// spotTerminations adds region's Ferry spot instances that EC2 is shutting down or has
// terminated, reclaimed by now at the latest.
func (p *Provider) spotTerminations(ctx context.Context, region string, now time.Time, reclaims map[string]time.Time) error {
	filters := []types.Filter{
		{Name: awssdk.String("tag:" + launcher.LabelOwner), Values: []string{"true"}},
		{Name: awssdk.String("instance-lifecycle"), Values: []string{"spot"}},
		{Name: awssdk.String("instance-state-name"), Values: []string{"shutting-down", "terminated"}},
	}
	return p.describe(ctx, region, filters, func(in types.Instance) {
		if code, _ := stateReason(in); code != reasonSpotTermination {
			return
		}
		id := InfraName + "/" + region + "/" + awssdk.ToString(in.InstanceId)
		if at, ok := reclaims[id]; !ok || at.After(now) {
			reclaims[id] = now
		}
	})
}
