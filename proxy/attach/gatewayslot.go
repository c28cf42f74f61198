package attach

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/proxy"
)

// slotDrainPoll is how often a retired Service of a gateway slot is looked at while it drains.
const slotDrainPoll = 10 * time.Millisecond

// gatewaySlot is one followed service's place in an attached gateway: the Service the gateway
// routes the service's models to, and those a new configuration replaced, draining. It is a
// Handover without a listener of its own: requests reach the Service through the gateway's, so
// a retired Service drains by its requests (in flight and waiting), not by its connections.
type gatewaySlot struct {
	log *zap.Logger
	// changed is called, without mu, when the current Service changed: the gateway routes to
	// the new one from then on.
	changed func()

	mu       sync.Mutex
	cur      *proxy.Service // nil once the slot is closed
	draining []*proxy.Service
	// retired counts the arrivals of Services that finished draining, so Arrivals never goes
	// down.
	retired uint64
	drains  sync.WaitGroup
}

var _ serving = (*gatewaySlot)(nil)

func newGatewaySlot(first *proxy.Service, changed func(), log *zap.Logger) *gatewaySlot {
	return &gatewaySlot{cur: first, changed: changed, log: log}
}

// current is the Service the gateway routes to; nil once closed.
func (s *gatewaySlot) current() *proxy.Service {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// Swap makes next the slot's Service and drains the one it replaces, within drainTimeout.
// next answers to the old one's models until its replicas have reported theirs, so the gateway
// does not answer them 404 in between (proxy.Service.KeepModels).
func (s *gatewaySlot) Swap(next *proxy.Service, drainTimeout time.Duration) {
	s.mu.Lock()
	old := s.cur
	if old == nil { // closed meanwhile
		s.mu.Unlock()
		_ = next.Shutdown(context.Background())
		return
	}
	next.KeepModels(old)
	s.cur = next
	s.retireLocked(old)
	s.mu.Unlock()
	s.changed() // no new request reaches old from here on
	go s.drain(old, drainTimeout)
}

// close takes the slot's Service out of the gateway and drains it, within drainTimeout; wait
// waits for that.
func (s *gatewaySlot) close(drainTimeout time.Duration) {
	s.mu.Lock()
	old := s.cur
	s.cur = nil
	if old != nil {
		s.retireLocked(old)
	}
	s.mu.Unlock()
	if old != nil {
		s.changed()
		go s.drain(old, drainTimeout)
	}
}

// wait waits until every retired Service has drained.
func (s *gatewaySlot) wait() { s.drains.Wait() }

// retireLocked counts old with the slot (Busy, Arrivals...) until drain has drained it; with
// mu held.
func (s *gatewaySlot) retireLocked(old *proxy.Service) {
	s.draining = append(s.draining, old)
	s.drains.Add(1)
}

// drain waits until old has no request in flight or waiting (a replica may still come for
// those held: SetBackends reaches old too), at most drainTimeout, then shuts it down, which
// answers any still waiting with 503.
func (s *gatewaySlot) drain(old *proxy.Service, drainTimeout time.Duration) {
	defer s.drains.Done()
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	tick := time.NewTicker(slotDrainPoll)
	defer tick.Stop()
	// The first look comes a tick late: a request the gateway handed to old just before the
	// swap may not count in flight yet (its admission runs first).
	for first := true; first || old.InFlight() > 0 || old.Waiting() > 0; first = false {
		select {
		case <-tick.C:
			continue
		case <-ctx.Done():
		}
		break
	}
	if err := old.Shutdown(ctx); err != nil {
		s.log.Warn("retired proxy did not drain in time", zap.String("service", old.Name()), zap.Error(err))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, d := range s.draining {
		if d == old {
			s.draining = append(s.draining[:i], s.draining[i+1:]...)
			break
		}
	}
	s.retired += old.Arrivals()
}

// services returns the current Service, if any, and those draining.
func (s *gatewaySlot) services() []*proxy.Service {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*proxy.Service, 0, 1+len(s.draining))
	if s.cur != nil {
		out = append(out, s.cur)
	}
	return append(out, s.draining...)
}

// SetBackends gives the replica set to the current Service and to those draining.
func (s *gatewaySlot) SetBackends(bs []proxy.Backend) {
	for _, svc := range s.services() {
		svc.SetBackends(bs)
	}
}

// SetPrefillBackends gives the prefill pool to the current Service and to those draining.
func (s *gatewaySlot) SetPrefillBackends(bs []proxy.Backend) error {
	var err error
	for _, svc := range s.services() {
		err = errors.Join(err, svc.SetPrefillBackends(bs))
	}
	return err
}

// Busy is Service.Busy summed over the current Service and those draining.
func (s *gatewaySlot) Busy(addr string) int64 {
	var n int64
	for _, svc := range s.services() {
		n += svc.Busy(addr)
	}
	return n
}

// Waiting is Service.Waiting summed over the current Service and those draining.
func (s *gatewaySlot) Waiting() int64 { return s.sum((*proxy.Service).Waiting) }

// PrefillTokens is Service.PrefillTokens summed over the current Service and those draining.
func (s *gatewaySlot) PrefillTokens() int64 { return s.sum((*proxy.Service).PrefillTokens) }

// InFlight is Service.InFlight summed over the current Service and those draining.
func (s *gatewaySlot) InFlight() int64 { return s.sum((*proxy.Service).InFlight) }

func (s *gatewaySlot) sum(f func(*proxy.Service) int64) int64 {
	var n int64
	for _, svc := range s.services() {
		n += f(svc)
	}
	return n
}

// PrefillBusy is Service.PrefillBusy summed over the current Service and those draining.
func (s *gatewaySlot) PrefillBusy() map[string]int64 {
	var out map[string]int64
	for _, svc := range s.services() {
		for addr, n := range svc.PrefillBusy() {
			if out == nil {
				out = map[string]int64{}
			}
			out[addr] += n
		}
	}
	return out
}

// Arrivals counts the requests every Service of the slot received; it never goes down.
func (s *gatewaySlot) Arrivals() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.retired
	if s.cur != nil {
		n += s.cur.Arrivals()
	}
	for _, d := range s.draining {
		n += d.Arrivals()
	}
	return n
}
