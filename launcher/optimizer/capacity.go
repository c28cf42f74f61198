package optimizer

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// Queued and reserved capacity (configs.Capacity). Providers report it as offerings: one with
// Reservation set is a reservation or capacity block, already paid for; one with QueueWait set
// is capacity reached through the cloud's queue (flex-start, a ProvisioningRequest). Neither is
// capacity available now at a list price, so Plan never sees them; PlanCapacity ranks them:
//
//   - reserved capacity first, at marginal cost zero: an unused reservation whose window covers
//     now, or starts within max_wait (the task waits for it), and, with max_run_duration, lasts
//     long enough. Active windows first, then the earliest start;
//   - then Plan's on-demand and spot candidates, in Plan's order;
//   - then queued capacity, shortest expected wait first, then price.
//
// capacity.mode on_demand (or none) is Plan unchanged; reserved keeps only the first tier;
// queued keeps all three, or the first two with NoQueue (a service). Candidates of every alternative share one tier (a free reservation
// beats ordered[0] at a price); within a tier earlier alternatives come first.

// CapacityOptions are what PlanCapacity measures windows against.
type CapacityOptions struct {
	// Now is the planning time.
	Now time.Time
	// MinWindow is the least a window with an end must have left once the task can start
	// in it: a service replica is replaced that long before the end (replicas' window
	// lead), so a window shorter than it would be left as soon as entered.
	MinWindow time.Duration
}

// PlanCapacity is Plan for resources that may use queued or reserved capacity.
func PlanCapacity(r configs.Resources, infras []Infra, o CapacityOptions) ([]Candidate, error) {
	mode := r.Capacity.ModeOf()
	base := withoutCapacityOfferings(infras)
	var plain []Candidate
	var planErr error
	if mode != configs.CapacityReserved {
		plain, planErr = Plan(r, base)
		if mode == configs.CapacityOnDemand || errors.Is(planErr, launcher.ErrInvalid) {
			return plain, planErr
		}
	}
	reserved, queued, unmet, err := capacityCandidates(r, infras, o)
	if err != nil {
		return nil, err
	}
	out := slices.Concat(reserved, plain)
	if mode == configs.CapacityQueued && !r.Capacity.NoQueue {
		out = append(out, queued...)
	}
	if len(out) == 0 {
		if planErr != nil && mode == configs.CapacityQueued {
			return nil, planErr
		}
		return nil, &NoCandidateError{Unmet: []Unmet{{Request: describeCapacity(r), Reasons: unmet}}}
	}
	return out, nil
}

// withoutCapacityOfferings copies infras leaving out reservation and queue offerings, which
// are not capacity at a list price (a Kubernetes context would otherwise fit a task to a node
// pool that does not exist until its queue provisions it).
func withoutCapacityOfferings(infras []Infra) []Infra {
	out := slices.Clone(infras)
	for i := range out {
		if !slices.ContainsFunc(out[i].Offerings, isCapacityOffering) {
			continue
		}
		out[i].Offerings = slices.DeleteFunc(slices.Clone(out[i].Offerings), isCapacityOffering)
	}
	return out
}

func isCapacityOffering(o launcher.Offering) bool { return o.Reservation != nil || o.QueueWait > 0 }

// capacityCandidates returns the reserved and queued candidates of every alternative, sorted
// each, and why the capacity offerings that did not fit were left out.
func capacityCandidates(r configs.Resources, infras []Infra, opts CapacityOptions) (reserved, queued []Candidate, unmet []string, err error) {
	cp := r.Capacity
	for ai, alt := range r.Candidates() {
		m, err := newCapacityMatch(ai, alt)
		if err != nil {
			return nil, nil, nil, err
		}
		for i := range infras {
			inf := &infras[i]
			for _, o := range inf.Offerings {
				if !isCapacityOffering(o) {
					continue
				}
				c, why, ok := m.candidate(inf, o, cp, opts)
				switch {
				case !ok:
					// Not this alternative's shape: neither a candidate nor a reason.
				case why != "":
					unmet = append(unmet, why)
				case o.Reservation != nil:
					reserved = append(reserved, c)
				default:
					queued = append(queued, c)
				}
			}
		}
	}
	slices.SortStableFunc(reserved, compareReserved)
	slices.SortStableFunc(queued, func(a, b Candidate) int {
		return cmp.Or(cmp.Compare(a.Alternative, b.Alternative), cmp.Compare(a.Wait, b.Wait),
			cmp.Compare(a.Placement.PricePerHour, b.Placement.PricePerHour), compareCandidates(&a, &b))
	})
	if len(unmet) == 0 {
		unmet = []string{"no enabled infra offers " + map[bool]string{true: "a reservation", false: "queued capacity"}[cp.ModeOf() == configs.CapacityReserved] +
			" (`ferry show-gpus --reservations` lists what each infra has)"}
	}
	return reserved, queued, dedupe(unmet), nil
}

// compareReserved orders reservations: earlier alternatives, then active windows (no wait),
// then the earliest start, then the most room, then location.
func compareReserved(a, b Candidate) int {
	return cmp.Or(cmp.Compare(a.Alternative, b.Alternative), cmp.Compare(a.Wait, b.Wait),
		cmp.Compare(b.Free, a.Free), compareCandidates(&a, &b),
		strings.Compare(a.Placement.Reservation, b.Placement.Reservation))
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	return slices.DeleteFunc(s, func(v string) bool {
		dup := seen[v]
		seen[v] = true
		return dup
	})
}

// capacityMatch is one alternative, parsed for matching capacity offerings.
type capacityMatch struct {
	alt          int
	accs         []configs.Accelerator
	cpus, memory quantity
	target       target
	instanceType string
}

func newCapacityMatch(alt int, r configs.Resources) (capacityMatch, error) {
	m := capacityMatch{alt: alt, accs: r.Accelerators, instanceType: r.InstanceType}
	var err error
	if m.cpus, err = parseQuantity("cpus", r.CPUs); err != nil {
		return m, err
	}
	if m.memory, err = parseQuantity("memory", r.Memory); err != nil {
		return m, err
	}
	m.target, err = parseTarget(r)
	return m, err
}

// candidate turns a capacity offering of inf into a candidate for this alternative, or says
// why it cannot take the task (a reason); ok is false when the offering is not this
// alternative's shape at all, which is neither.
func (m *capacityMatch) candidate(inf *Infra, o launcher.Offering, cp *configs.Capacity, opts CapacityOptions) (c Candidate, why string, ok bool) {
	now := opts.Now
	acc, ok := m.fits(inf, o)
	if !ok {
		return Candidate{}, "", false
	}
	where := inf.Name
	if o.Zone != "" {
		where += "/" + o.Zone
	} else if o.Region != "" {
		where += "/" + o.Region
	}
	p := launcher.Placement{Infra: inf.Name, Region: o.Region, Zone: o.Zone, InstanceType: o.InstanceType,
		Accelerator: o.Accelerator, AcceleratorCount: acc.Count, VCPUs: o.VCPUs, MemoryGiB: o.MemoryGiB}
	if acc.Name == "" {
		p.AcceleratorCount = 0
	}
	c = Candidate{Alternative: m.alt}
	if res := o.Reservation; res != nil {
		if why := reservationProblem(*res, cp, opts); why != "" {
			return Candidate{}, fmt.Sprintf("%s: reservation %s %s", where, res.ID, why), true
		}
		p.Reservation, p.WindowStart, p.WindowEnd = res.ID, res.Start, res.End
		p.Region, p.Zone = cmp.Or(p.Region, res.Region), cmp.Or(p.Zone, res.Zone)
		c.Wait, c.Free = max(0, res.Start.Sub(now)), res.Free()
		c.Placement = p // PricePerHour 0: paid for whether used or not
		return c, "", true
	}
	if cp.MaxWait > 0 && o.QueueWait > cp.MaxWait {
		return Candidate{}, fmt.Sprintf("%s: the queue for %s is expected to take %s, beyond max_wait %s", where, o.Accelerator,
			formatWait(o.QueueWait), formatWait(cp.MaxWait)), true
	}
	p.Queued, p.PricePerHour = true, o.PricePerHour
	c.Placement, c.Wait = p, o.QueueWait
	return c, "", true
}

// fits reports whether o has what the alternative asks for on inf, and which accelerator.
func (m *capacityMatch) fits(inf *Infra, o launcher.Offering) (configs.Accelerator, bool) {
	region, zone := o.Region, o.Zone
	if res := o.Reservation; res != nil {
		region, zone = cmp.Or(region, res.Region), cmp.Or(zone, res.Zone)
	}
	if !m.target.admits(inf) || (m.target.region != "" && region != m.target.region) ||
		(m.target.zone != "" && zone != m.target.zone && inf.ZoneNames[zone] != m.target.zone) {
		return configs.Accelerator{}, false
	}
	if m.instanceType != "" && o.InstanceType != m.instanceType {
		return configs.Accelerator{}, false
	}
	if o.VCPUs > 0 && inf.Kind == Cloud && (!m.cpus.admits(o.VCPUs) || !m.memory.admits(o.MemoryGiB)) {
		return configs.Accelerator{}, false
	}
	if len(m.accs) == 0 {
		if m.instanceType != "" {
			// The instance type names its accelerators, as in Plan: a p4d.24xlarge task takes a
			// p4d.24xlarge reservation with its A100s.
			return configs.Accelerator{Name: o.Accelerator, Count: o.AcceleratorCount}, true
		}
		return configs.Accelerator{}, o.Accelerator == ""
	}
	for _, a := range m.accs {
		if !strings.EqualFold(a.Name, o.Accelerator) {
			continue
		}
		// A cloud instance has exactly its GPUs; a node holds up to its count.
		if o.AcceleratorCount == a.Count || (inf.Kind == Kubernetes && o.AcceleratorCount >= a.Count) {
			return a, true
		}
	}
	return configs.Accelerator{}, false
}

// reservationProblem says why res cannot take the task now or within its wait ("" if it can).
func reservationProblem(res launcher.ReservationOffer, cp *configs.Capacity, opts CapacityOptions) string {
	now, name := opts.Now, cp.Reservation
	from := now
	if res.Start.After(now) {
		from = res.Start
	}
	switch {
	case name != "" && name != configs.ReservationAny && name != res.ID && name != res.Name:
		return "is not " + name
	case !res.End.IsZero() && !now.Before(res.End):
		return "has ended (" + res.End.UTC().Format(time.RFC3339) + ")"
	case res.Free() < 1:
		return fmt.Sprintf("is fully used (%d of %d)", res.InUse, res.Count)
	case cp.MaxWait > 0 && res.Start.Sub(now) > cp.MaxWait:
		return fmt.Sprintf("starts in %s, beyond max_wait %s", formatWait(res.Start.Sub(now)), formatWait(cp.MaxWait))
	case cp.MaxRunDuration > 0 && !res.Covers(now, cp.MaxRunDuration):
		return fmt.Sprintf("ends %s, before max_run_duration %s would", res.End.UTC().Format(time.RFC3339), formatWait(cp.MaxRunDuration))
	case !res.End.IsZero() && res.End.Sub(from) <= opts.MinWindow:
		return fmt.Sprintf("ends %s, within %s of the start (a replica is replaced that long before the end)",
			res.End.UTC().Format(time.RFC3339), formatWait(opts.MinWindow))
	}
	return ""
}

// describeCapacity is the request in a NoCandidateError about capacity.
func describeCapacity(r configs.Resources) string {
	s := describe(r)
	if len(r.AnyOf) > 0 || len(r.Ordered) > 0 {
		s = r.String()
	}
	cp := r.Capacity
	if cp.ModeOf() == configs.CapacityReserved {
		return s + " in reservation " + cp.Reservation
	}
	return s + " (capacity " + cp.ModeOf() + ")"
}

// formatWait writes a wait the way durations are written in YAML ("90m", "2h"), rounded to
// the minute above a minute.
func formatWait(d time.Duration) string {
	if d >= time.Minute {
		d = d.Round(time.Minute)
	}
	return configs.FormatDuration(d)
}

// waitCell and windowCell are the plan table's WAIT and WINDOW columns.
func waitCell(c *Candidate) string {
	switch {
	case c.Placement.Queued && c.Wait >= time.Second:
		return "~" + formatWait(c.Wait)
	case c.Placement.Queued: // a queue that does not say how long (a Kubernetes node pool)
		return "queued"
	case c.Wait >= time.Second:
		return formatWait(c.Wait)
	}
	return "-"
}

func windowCell(p *launcher.Placement) string {
	if p.WindowStart.IsZero() && p.WindowEnd.IsZero() {
		return "-"
	}
	const day, clock = "01-02 15:04", "15:04"
	start, end := "now", "open"
	if !p.WindowStart.IsZero() {
		start = p.WindowStart.UTC().Format(day)
	}
	if !p.WindowEnd.IsZero() {
		layout := day
		if !p.WindowStart.IsZero() && p.WindowStart.UTC().YearDay() == p.WindowEnd.UTC().YearDay() {
			layout = clock
		}
		end = p.WindowEnd.UTC().Format(layout)
	}
	return start + "–" + end + " UTC"
}

// hasCapacity reports whether any candidate is reserved or queued, so the table shows the
// WAIT and WINDOW columns.
func hasCapacity(cands []Candidate) bool {
	return slices.ContainsFunc(cands, func(c Candidate) bool {
		return c.Placement.Reservation != "" || c.Placement.Queued || !c.Placement.WindowEnd.IsZero()
	})
}
