package aws

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
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
//
// Each region is polled by a loop of its own, so that a region whose endpoint hangs (each call
// is cut by Options.RequestTimeout) or fails never delays another region's notices. A region
// whose poll fails for EC2's own reasons (unavailable, throttled) is skipped for a while that
// doubles with each failure in a row (noticeBackoff), so that a poll every few seconds does
// not hammer an endpoint that is down; the failure is logged when it starts and when the
// region answers again, not at every poll.
func (p *Provider) Notices(ctx context.Context) <-chan launcher.Notice {
	out := make(chan launcher.Notice, 16)
	var forwarders sync.WaitGroup
	for _, region := range p.opts.Regions {
		nr := &noticeRegion{name: region, seen: map[string]bool{}, failing: map[string]bool{}}
		in := launcher.PollNotices(ctx, p.opts.NoticeInterval, func(ctx context.Context, ch chan<- launcher.Notice) bool {
			return p.pollPreemptions(ctx, nr, ch)
		})
		forwarders.Go(func() {
			for n := range in {
				select {
				case out <- n:
				case <-ctx.Done():
					return
				}
			}
		})
	}
	go func() {
		forwarders.Wait()
		close(out)
	}()
	return out
}

// maxNoticeBackoff caps how long the notice poll skips a failing region: well inside EC2's two
// minutes' interruption warning, so that a region that recovers is heard from in time.
const maxNoticeBackoff = time.Minute

// noticeRegion is the notice poll's state of one region, touched by that region's loop only.
type noticeRegion struct {
	name string
	// seen are the instances already announced, trimmed to what EC2 still shows.
	seen map[string]bool
	// noWarnings: the credentials may not read spot requests here; shutdowns only.
	noWarnings bool
	// failing holds the reads (by what they read) whose last call failed for a reason other
	// than EC2's (a refused permission, say): logged once, retried every poll.
	failing map[string]bool
	// Failures of EC2 itself in a row, since when, and when the region is polled again.
	failures        int
	downSince, next time.Time
}

// noticeBackoff is how long the poll skips a region after failures failures of EC2 in a row:
// the interval doubled per failure after the first, up to maxNoticeBackoff, ±20% so that
// regions and controllers do not come back in step.
func noticeBackoff(interval time.Duration, failures int) time.Duration {
	d := interval
	for i := 1; i < failures && d < maxNoticeBackoff; i++ {
		d *= 2
	}
	d = min(d, max(maxNoticeBackoff, interval))
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// pollPreemptions sends notices for region's newly warned or reclaimed instances. nr.seen
// keeps those already sent and is trimmed to what EC2 still shows, warned or reclaimed (an
// instance moves from the one to the other between polls, and is in seen either way). It
// returns false once ctx has ended.
func (p *Provider) pollPreemptions(ctx context.Context, nr *noticeRegion, ch chan<- launcher.Notice) bool {
	now := time.Now()
	if now.Before(nr.next) {
		return true // backing off
	}
	reclaims, complete := p.pollRegion(ctx, nr, now)
	if ctx.Err() != nil {
		return false
	}
	for id, at := range reclaims {
		if nr.seen[id] {
			continue
		}
		select {
		case ch <- launcher.Notice{InstanceID: id, At: at}:
		case <-ctx.Done():
			return false
		}
	}
	if complete {
		// Trim to what EC2 still shows; after a failed read keep everything, so that what
		// the read would have shown is not announced again later.
		clear(nr.seen)
	}
	for id := range reclaims {
		nr.seen[id] = true
	}
	return true
}

// pollRegion reads nr's region's reclaims, instance id → when EC2 reclaims (or reclaimed) it,
// and whether every read succeeded.
func (p *Provider) pollRegion(ctx context.Context, nr *noticeRegion, now time.Time) (map[string]time.Time, bool) {
	region := nr.name
	reclaims := map[string]time.Time{}
	polls := []struct {
		what string
		poll func(ctx context.Context, region string, now time.Time, reclaims map[string]time.Time) error
	}{
		{"spot interruption warnings", p.spotWarnings},
		{"spot preemptions", p.spotTerminations},
		{"capacity block ends", p.blockEnds},
	}
	complete := true
	for i, pl := range polls {
		if i == 0 && nr.noWarnings {
			continue
		}
		err := pl.poll(ctx, region, now, reclaims)
		switch {
		case err == nil:
			if nr.failing[pl.what] {
				delete(nr.failing, pl.what)
				p.log.Info("poll for "+pl.what+" works again", zap.String("region", region))
			}
			continue
		case ctx.Err() != nil:
			return nil, false
		case i == 0 && errors.Is(err, launcher.ErrUnauthorized):
			// Not a passing failure: say so once and rely on shutdowns in this region.
			nr.noWarnings = true
			p.log.Warn("spot interruption warnings unavailable: the credentials may not call "+
				"DescribeSpotInstanceRequests; spot preemptions are noticed when instances shut down",
				zap.String("region", region), zap.Error(err))
			continue
		case errors.Is(err, launcher.ErrUnavailable), errors.Is(err, launcher.ErrThrottled):
			// EC2 failed: the region's other reads would fail alike. Back off.
			nr.failures++
			nr.next = time.Now().Add(noticeBackoff(p.opts.NoticeInterval, nr.failures))
			if nr.failures == 1 {
				nr.downSince = now
				p.log.Warn("EC2 fails the notice poll; polling this region less often until it answers",
					zap.String("region", region), zap.String("poll", pl.what), zap.Error(err))
			}
			return reclaims, false
		default:
			complete = false
			if !nr.failing[pl.what] {
				nr.failing[pl.what] = true
				p.log.Warn("poll for "+pl.what+" fails; retrying every poll", zap.String("region", region), zap.Error(err))
			}
		}
	}
	if nr.failures > 0 {
		p.log.Info("EC2 answers the notice poll again", zap.String("region", region),
			zap.Duration("failed_for", time.Since(nr.downSince).Round(time.Millisecond)), zap.Int("failed_polls", nr.failures))
		nr.failures, nr.next, nr.downSince = 0, time.Time{}, time.Time{}
	}
	return reclaims, complete
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
