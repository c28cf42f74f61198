package replicas

import (
	"context"
	"runtime/debug"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
)

// noticeRetryEvery is how often notices no service claimed are offered again, and
// maxPendingNotices how many are kept.
const (
	noticeRetryEvery  = time.Second
	maxPendingNotices = 1024
)

// RelayNotices hands an infra's preemption notices to the services' managers until ch closes
// or ctx ends. The manager whose replica runs on the instance replaces it now, while it still
// serves (an advance warning, such as EC2's two minutes, buys that much of the replacement's
// cold start), and on a notice's first offer every other manager resyncs at once, so a replica
// already reclaimed is replaced without waiting for its probes or the next pass. A notice no
// manager claims yet is offered again until its reclaim time: a controller started as an infra
// warns may get the warning before its services have loaded their replica records, and an
// infra announces each instance once. A panic while relaying one notice is logged and the
// relay goes on.
func RelayNotices(ctx context.Context, infra string, ch <-chan launcher.Notice, managers func() []*Manager, log *zap.Logger) {
	relay := noticeRelay{offer: func(n launcher.Notice, first bool) bool { return offerNotice(managers(), n, first) }, now: time.Now}
	retry := time.NewTicker(noticeRetryEvery)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case notice, ok := <-ch:
			if !ok {
				return
			}
			log.Warn("spot preemption notice", zap.String("infra", infra), zap.String("instance", notice.InstanceID),
				zap.Time("at", notice.At))
			relaySafely(log, func() { relay.add(notice) })
		case <-retry.C:
			relaySafely(log, relay.retry)
		}
	}
}

func relaySafely(log *zap.Logger, step func()) {
	defer func() {
		if p := recover(); p != nil {
			log.Error("recovered panic relaying a preemption notice", zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
		}
	}()
	step()
}

// offerNotice hands a notice to every manager and reports whether one of them runs a replica
// on the instance; on the first offer the others resync.
func offerNotice(managers []*Manager, n launcher.Notice, first bool) bool {
	claimed := false
	for _, m := range managers {
		if m.Notice(n.InstanceID, n.At) {
			claimed = true
		} else if first {
			m.Resync()
		}
	}
	return claimed
}

// noticeRelay keeps the notices no manager claimed yet and offers them again until their
// instance's reclaim time.
type noticeRelay struct {
	// offer's first is true for a notice's first offer.
	offer   func(n launcher.Notice, first bool) bool
	now     func() time.Time
	pending []launcher.Notice
}

func (r *noticeRelay) add(n launcher.Notice) {
	if !r.offer(n, true) && r.now().Before(n.At) && len(r.pending) < maxPendingNotices {
		r.pending = append(r.pending, n)
	}
}

func (r *noticeRelay) retry() {
	now := r.now()
	r.pending = slices.DeleteFunc(r.pending, func(n launcher.Notice) bool { return !now.Before(n.At) || r.offer(n, false) })
}
