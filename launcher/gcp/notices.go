package gcp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
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
// it runs, with that time. The channel is closed when ctx ends. Notices may
// name VMs Ferry did not make; callers ignore unknown ids.
//
// Each zone is polled on its own. A zone whose calls fail is asked again after a back-off that
// doubles from NoticeInterval up to maxNoticeBackoff (with jitter), so that a zone (or all of
// GCP) that is down is neither hammered every tick nor logged every tick: its failure is
// logged when it starts and when it ends. What was noticed there is kept meanwhile, so nothing
// is reported twice, and a preemption that happened during the outage is reported once the
// zone answers (its operation is still listed).
func (p *Provider) Notices(ctx context.Context) <-chan launcher.Notice {
	w := &noticeWatch{p: p, since: time.Now().Add(-p.opts.NoticeLookback), zones: map[string]*zoneWatch{},
		rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x6e6f7469636573))}
	return launcher.PollNotices(ctx, p.opts.NoticeInterval, func(ctx context.Context, ch chan<- launcher.Notice) (ok bool) {
		defer func() {
			if r := recover(); r != nil {
				p.log.Error("preemption watcher panicked", zap.Any("panic", r))
				ok = false
			}
		}()
		return w.poll(ctx, ch)
	})
}

// maxNoticeBackoff caps how long a failing zone goes unasked: a preemption there is noticed at
// most this late once the zone answers again.
const maxNoticeBackoff = time.Minute

// noticeWatch is one Notices loop's state.
type noticeWatch struct {
	p     *Provider
	since time.Time
	zones map[string]*zoneWatch
	rng   *rand.Rand
}

// zoneWatch is what a zone's polls have noticed, and its failures.
type zoneWatch struct {
	// preempted are the preemption operations noticed (by name) and ends the VMs whose end
	// was noticed ("NAME/ID"), each kept while still listed.
	preempted, ends map[string]bool
	down            outage
}

// poll asks every zone that is due; false when ctx ended.
func (w *noticeWatch) poll(ctx context.Context, ch chan<- launcher.Notice) bool {
	for _, zone := range w.p.listZones() {
		z := w.zones[zone]
		if z == nil {
			z = &zoneWatch{preempted: map[string]bool{}, ends: map[string]bool{}}
			w.zones[zone] = z
		}
		now := time.Now()
		if !z.down.due(now) {
			continue
		}
		err := w.pollZone(ctx, zone, z, ch)
		if ctx.Err() != nil {
			return false
		}
		w.observe(zone, z, err, now)
	}
	return true
}

// observe records a zone's poll: a failure backs the zone off (logged when the zone starts
// failing); an answer after failures is logged once.
func (w *noticeWatch) observe(zone string, z *zoneWatch, err error, now time.Time) {
	log := w.p.log.With(zap.String("zone", zone))
	if err == nil {
		if run := z.down.end(); run.failures > 0 {
			log.Info("preemption watcher: zone answers again", zap.Duration("failing_for", now.Sub(run.since).Round(time.Millisecond)),
				zap.Int("failed_polls", run.failures))
		}
		return
	}
	interval := w.p.opts.NoticeInterval
	wait, first := z.down.fail(now, interval, maxNoticeBackoff, w.rng.Float64())
	if first {
		log.Warn("preemption watcher: zone not answering; asking it less often until it does", zap.Error(err))
	} else {
		log.Debug("preemption watcher: zone still not answering", zap.Int("failed_polls", z.down.failures), zap.Duration("next_in", wait), zap.Error(err))
	}
}

// pollZone sends the zone's new preemption and window-end notices.
func (w *noticeWatch) pollZone(ctx context.Context, zone string, z *zoneWatch, ch chan<- launcher.Notice) error {
	ops, err := w.p.preemptionOps(ctx, zone)
	if err != nil {
		return err
	}
	vms, err := w.p.rawListZone(ctx, zone, ownedFilter(nil))
	if err != nil {
		return err
	}
	send := func(n launcher.Notice) error {
		select {
		case ch <- n:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	listed := map[string]bool{}
	for _, op := range ops {
		listed[op.GetName()] = true
		at, err := time.Parse(time.RFC3339, op.GetInsertTime())
		if z.preempted[op.GetName()] || err != nil || at.Before(w.since) {
			continue
		}
		n := launcher.Notice{InstanceID: InfraName + "/" + zone + "/" + lastSegment(op.GetTargetLink()), At: at}
		if err := send(n); err != nil {
			return err
		}
		w.p.log.Info("spot preemption", zap.String("instance", n.InstanceID), zap.Time("at", at))
	}
	z.preempted = listed

	// Window ends: one notice per running VM that GCE will end at a known time (endOf), with
	// that time, well ahead of it.
	listed = map[string]bool{}
	for _, vm := range vms {
		at := endOf(vm)
		if at.IsZero() || vm.GetStatus() != "RUNNING" {
			continue
		}
		key := vm.GetName() + "/" + strconv.FormatUint(vm.GetId(), 10)
		listed[key] = true
		if z.ends[key] {
			continue
		}
		n := launcher.Notice{InstanceID: InfraName + "/" + zone + "/" + vm.GetName(), At: at}
		if err := send(n); err != nil {
			return err
		}
		z.ends[key] = true
		w.p.log.Info("capacity window ends", zap.String("instance", n.InstanceID), zap.Time("at", at))
	}
	maps.DeleteFunc(z.ends, func(key string, _ bool) bool { return !listed[key] })
	return nil
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
