package infra

import (
	"context"
	"fmt"
	"sort"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/optimizer"
)

// capacityOfferings adds a cloud's reservations and queues (launcher.Offerer) to inf for a
// task that may use them; plain catalog rows stay the catalog's.
func (c cloud) capacityOfferings(ctx context.Context, inf *optimizer.Infra) error {
	o, ok := c.provider.(launcher.Offerer)
	if !ok {
		return nil
	}
	offers, err := o.Offerings(ctx)
	if _, partial := launcher.Partial(err); err != nil && !partial {
		return fmt.Errorf("reservations and queues: %w", err)
	}
	for _, off := range offers { // with a partial answer: what the parts that answered hold
		if off.Reservation != nil || off.QueueWait > 0 {
			inf.Offerings = append(inf.Offerings, off)
		}
	}
	if err != nil {
		return fmt.Errorf("reservations and queues: %w", err)
	}
	return nil
}

// Reservations lists the reservations and capacity blocks of every enabled infra that can
// tell (launcher.Reserver), each with its Infra set, sorted by infra, then start; an infra that
// cannot answer is reported in errs and left out.
func (s *Set) Reservations(ctx context.Context) ([]launcher.ReservationOffer, map[string]error) {
	type named struct {
		name string
		p    launcher.Provider
	}
	var all []named
	for _, k := range s.Kube {
		all = append(all, named{k.Infra(), k})
	}
	for _, c := range s.clouds {
		all = append(all, named{c.name, c.provider})
	}
	var out []launcher.ReservationOffer
	errs := map[string]error{}
	for _, n := range all {
		r, ok := n.p.(launcher.Reserver)
		if !ok {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, offeringsTimeout)
		list, err := r.Reservations(rctx)
		cancel()
		if err != nil {
			errs[n.name] = err
			if _, partial := launcher.Partial(err); !partial {
				continue
			} // else: a region or zone did not answer; the others' reservations are listed
		}
		for _, res := range list {
			if res.Infra == "" {
				res.Infra = n.name
			}
			out = append(out, res)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Infra != out[j].Infra {
			return out[i].Infra < out[j].Infra
		}
		return out[i].Start.Before(out[j].Start)
	})
	return out, errs
}
