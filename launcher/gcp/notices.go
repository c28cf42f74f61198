package gcp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"go.uber.org/zap"
	"google.golang.org/api/iterator"
	"google.golang.org/protobuf/proto"

	"github.com/ferryserve/ferry/launcher"
)

// Notices watches for Spot preemptions until ctx ends: every NoticeInterval (default
// DefaultNoticeInterval, 10s) it lists the compute.instances.preempted operations of the
// listed zones and sends one Notice per new operation, with the time the preemption began
// (GCP stops the VM about 30 seconds later; from outside the VM there is no earlier warning).
// Preemptions up to NoticeLookback before the call are reported too. A VM that GCE will end at a
// known time (its calendar reservation's end, its maxRunDuration) is noticed once, as soon as
// it runs, with that time (windowNotices). The channel is closed
// when ctx ends. Notices may name VMs Ferry did not make; callers ignore unknown ids.
func (p *Provider) Notices(ctx context.Context) <-chan launcher.Notice {
	since := time.Now().Add(-p.opts.NoticeLookback)
	seen, ends := map[string]bool{}, map[string]bool{}
	return launcher.PollNotices(ctx, p.opts.NoticeInterval, func(ctx context.Context, ch chan<- launcher.Notice) (ok bool) {
		defer func() {
			if r := recover(); r != nil {
				p.log.Error("preemption watcher panicked", zap.Any("panic", r))
				ok = false
			}
		}()
		return p.pollPreemptions(ctx, since, seen, ch) && p.pollWindowEnds(ctx, ends, ch)
	})
}

// pollPreemptions sends notices for unseen preemption operations; false when ctx ended.
// seen keeps only the operations still listed, so it stays as small as GCP's operation log.
func (p *Provider) pollPreemptions(ctx context.Context, since time.Time, seen map[string]bool, ch chan<- launcher.Notice) bool {
	listed := map[string]bool{}
	for _, zone := range p.listZones() {
		ops, err := p.preemptionOps(ctx, zone)
		if err != nil {
			if ctx.Err() != nil {
				return false
			}
			p.log.Warn("list preemptions", zap.String("zone", zone), zap.Error(err))
			// Keep what was seen in this zone so it is not reported again.
			for k := range seen {
				if strings.HasPrefix(k, zone+"/") {
					listed[k] = true
				}
			}
			continue
		}
		for _, op := range ops {
			key := zone + "/" + op.GetName()
			listed[key] = true
			at, err := time.Parse(time.RFC3339, op.GetInsertTime())
			if seen[key] || err != nil || at.Before(since) {
				continue
			}
			n := launcher.Notice{InstanceID: InfraName + "/" + zone + "/" + lastSegment(op.GetTargetLink()), At: at}
			select {
			case ch <- n:
			case <-ctx.Done():
				return false
			}
			p.log.Info("spot preemption", zap.String("instance", n.InstanceID), zap.Time("at", at))
		}
	}
	clear(seen)
	for k := range listed {
		seen[k] = true
	}
	return true
}

func (p *Provider) preemptionOps(ctx context.Context, zone string) ([]*computepb.Operation, error) {
	var out []*computepb.Operation
	it := p.zoneOps.List(ctx, &computepb.ListZoneOperationsRequest{Project: p.opts.Project, Zone: zone,
		Filter: proto.String(fmt.Sprintf("(operationType = %q)", preemptedOpType))})
	for {
		op, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return nil, classify(err, "list preemptions in "+zone)
		}
		out = append(out, op)
	}
}

func lastSegment(url string) string {
	return url[strings.LastIndexByte(url, '/')+1:]
}
