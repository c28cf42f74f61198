package configs

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Capacity is `resources.capacity`: where the task's accelerators may come from beyond
// on-demand and spot capacity available now (docs/jobs.md, "Queued and reserved capacity"):
//
//	resources:
//	  capacity:
//	    mode: queued            # on_demand (default) | queued | reserved
//	    max_wait: 2h            # queued/reserved: longest wait for capacity (default: no limit)
//	    max_run_duration: 4h    # the nodes' run limit; a job gets SIGTERM + its grace at it
//	    reservation: NAME       # reserved: a reservation or capacity block id, or `any` (default)
//
// It is set once, at the top of resources, and applies to every alternative.
type Capacity struct {
	// Mode is CapacityOnDemand, CapacityQueued or CapacityReserved.
	Mode string `json:"mode" yaml:"mode"`
	// MaxWait bounds how long a queued or reserved task waits for its capacity (SkyPilot's
	// provision_timeout for queued resources); 0 waits until cancelled.
	MaxWait time.Duration `json:"max_wait,omitempty" yaml:"max_wait"`
	// MaxRunDuration is how long the nodes may run once started (0: no limit). Clouds that
	// take it (GCP flex-start) get it too; Ferry stops a job at it on every infra.
	MaxRunDuration time.Duration `json:"max_run_duration,omitempty" yaml:"max_run_duration"`
	// Reservation is the reservation or capacity block a reserved task uses, by name or id,
	// or ReservationAny; "" unless Mode is reserved.
	Reservation string `json:"reservation,omitempty" yaml:"reservation"`
	// NoQueue keeps a queued task out of the cloud's queue, leaving it reserved capacity
	// first, then on-demand and spot. The parser sets it for services: a replica that
	// waited would be relaunched under a new name, queueing a new request each time.
	NoQueue bool `json:"no_queue,omitempty" yaml:"-"`
}

// Capacity modes.
const (
	// CapacityOnDemand is today's behaviour: on-demand or spot capacity available now; none
	// within the infra's provision timeout moves on to the next candidate, then fails.
	CapacityOnDemand = "on_demand"
	// CapacityQueued also takes capacity already paid for (an unused reservation) and waits in
	// the cloud's queue (flex-start, a ProvisioningRequest) for the rest; a service's replicas
	// never wait in a queue (NoQueue).
	CapacityQueued = "queued"
	// CapacityReserved takes only a reservation or capacity block, waiting for its window.
	CapacityReserved = "reserved"
	// ReservationAny lets a reserved task use any active reservation that matches it.
	ReservationAny = "any"
)

// CapacityModes lists the modes, the default first.
var CapacityModes = []string{CapacityOnDemand, CapacityQueued, CapacityReserved}

var (
	capacityKeys = keysOf[Capacity]()
	// durationRE is "<num>[s|m|h|d]", SkyPilot's spelling of durations; a bare number is seconds.
	durationRE = regexp.MustCompile(`^([0-9]+)([smhd]?)$`)
	// reservationRE fits GCP reservation names and AWS capacity reservation ids (cr-…), and
	// GCP's project-qualified "projects/P/reservations/NAME".
	reservationRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,253}[A-Za-z0-9])?$`)
)

// maxCapacityDuration bounds max_wait and max_run_duration: AWS sells capacity blocks of up
// to 182 days, the longest of any cloud's windows; a year leaves room and catches typos.
const maxCapacityDuration = 366 * 24 * time.Hour

// Queued reports whether the task may wait for capacity (mode queued or reserved).
func (c *Capacity) Queued() bool {
	return c != nil && (c.Mode == CapacityQueued || c.Mode == CapacityReserved)
}

// ModeOf is c's mode, CapacityOnDemand when c is nil.
func (c *Capacity) ModeOf() string {
	if c == nil || c.Mode == "" {
		return CapacityOnDemand
	}
	return c.Mode
}

func (c *Capacity) clone() *Capacity {
	if c == nil {
		return nil
	}
	out := *c
	return &out
}

// MarshalYAML writes the block in the spelling capacity reads, for ResolvedYAML.
func (c Capacity) MarshalYAML() (any, error) {
	type plain struct {
		Mode           string `yaml:"mode"`
		MaxWait        string `yaml:"max_wait,omitempty"`
		MaxRunDuration string `yaml:"max_run_duration,omitempty"`
		Reservation    string `yaml:"reservation,omitempty"`
	}
	return plain{Mode: c.Mode, MaxWait: FormatDuration(c.MaxWait), MaxRunDuration: FormatDuration(c.MaxRunDuration), Reservation: c.Reservation}, nil
}

// FormatDuration writes d in the spelling durations are read in: the largest whole unit
// ("2h", "90m", "45s"); "" for zero.
func FormatDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return ""
	case d%(24*time.Hour) == 0:
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	}
	return strconv.FormatInt(int64(d.Round(time.Second)/time.Second), 10) + "s"
}

// ParseDuration reads a capacity duration: seconds as a number, "<num>[s|m|h|d]" ("90m",
// "2h", "1d"), or a Go duration of whole seconds ("1h30m").
func ParseDuration(s string) (time.Duration, bool) {
	s = strings.TrimSpace(s)
	if m := durationRE.FindStringSubmatch(s); m != nil {
		v, err := strconv.ParseInt(m[1], 10, 64)
		unit := map[string]time.Duration{"": time.Second, "s": time.Second, "m": time.Minute, "h": time.Hour, "d": 24 * time.Hour}[m[2]]
		if err != nil || v > int64(maxCapacityDuration/unit) {
			return maxCapacityDuration + 1, true
		}
		return time.Duration(v) * unit, true
	}
	d, err := time.ParseDuration(s)
	if err != nil || d%time.Second != 0 || strings.HasPrefix(s, "-") {
		return 0, false
	}
	return d, true
}

// capacity reads resources.capacity; rs are the resolved candidates, to check the mode
// against where they may run, and isService refuses what only a job can do.
func (c *checker) capacity(e entry, field string, rs []Resources, isService bool) *Capacity {
	n := c.deref(e.value)
	f, ok := c.fields(n, field, capacityKeys)
	if !ok {
		return nil
	}
	out := &Capacity{Mode: CapacityOnDemand}
	good := true
	if m, ok := f["mode"]; ok {
		v, ok := c.oneOf(m.value, joinField(field, "mode"), CapacityModes, "capacity mode", "modes")
		out.Mode, good = v, ok
	} else if _, ok := f["reservation"]; ok {
		out.Mode = CapacityReserved
	}
	for _, d := range []struct {
		key string
		dst *time.Duration
	}{{"max_wait", &out.MaxWait}, {"max_run_duration", &out.MaxRunDuration}} {
		if v, ok := f[d.key]; ok {
			*d.dst, ok = c.duration(v.value, joinField(field, d.key))
			good = good && ok
		}
	}
	if r, ok := f["reservation"]; ok {
		v, ok := c.reservation(r.value, joinField(field, "reservation"))
		out.Reservation, good = v, good && ok
	}
	if !good {
		return nil
	}
	if !c.capacityAgrees(out, f, field, rs) || (isService && !c.serviceCapacity(out, f, field)) {
		return nil
	}
	if out.Mode == CapacityReserved && out.Reservation == "" {
		out.Reservation = ReservationAny
	}
	return out
}

// capacityAgrees reports fields that contradict the mode or the candidates.
func (c *checker) capacityAgrees(cp *Capacity, f map[string]entry, field string, rs []Resources) bool {
	if r, ok := f["reservation"]; ok && cp.Mode != CapacityReserved {
		c.errorf(r.keyNode, joinField(field, "reservation"), "reservation needs mode: reserved (mode is %s)", cp.Mode)
		return false
	}
	if w, ok := f["max_wait"]; ok && cp.Mode == CapacityOnDemand {
		c.errorf(w.keyNode, joinField(field, "max_wait"), "max_wait is for mode: queued or reserved; on_demand never waits in a queue (kubernetes.provision_timeout_seconds bounds its wait for a node)")
		return false
	}
	for _, r := range rs {
		if cp.Mode == CapacityReserved && r.UseSpot {
			c.errorf(f["mode"].value, joinField(field, "mode"), "reserved capacity is never spot: leave use_spot out, or use mode: queued")
			return false
		}
	}
	if cp.Mode == CapacityReserved && !slices.ContainsFunc(rs, func(r Resources) bool { return !isLocal(r.Infra) }) {
		at := f["mode"].value
		if at == nil {
			at = f["reservation"].value
		}
		c.errorf(at, joinField(field, "mode"), "local has no reservations: give infra (gcp, aws, kubernetes or *) to use one")
		return false
	}
	return true
}

// serviceCapacity keeps a service out of the cloud's queue (NoQueue) and refuses a run limit:
// replicas run until scaled down (in a reservation they are replaced before it ends).
func (c *checker) serviceCapacity(cp *Capacity, f map[string]entry, field string) bool {
	cp.NoQueue = true
	if e, ok := f["max_run_duration"]; ok {
		c.errorf(e.keyNode, joinField(field, "max_run_duration"), "max_run_duration is a job's run limit: a service's replicas run until scaled down (in a reservation they are replaced before it ends)")
		return false
	}
	return true
}

func isLocal(infra string) bool {
	return infra == InfraLocal || strings.HasPrefix(infra, InfraLocal+"/")
}

// duration reads one capacity duration: at least a second, at most maxCapacityDuration.
func (c *checker) duration(n *yaml.Node, field string) (time.Duration, bool) {
	const want = `a duration such as "90m", "2h", "1d" or seconds (3600)`
	if n.Kind != yaml.ScalarNode || isNull(n) || (!isScalar(n, "!!int") && !isScalar(n, "!!str")) {
		c.errorf(n, field, "expected %s, got %s", want, describe(n))
		return 0, false
	}
	d, ok := ParseDuration(n.Value)
	switch {
	case !ok:
		c.errorf(n, field, "expected %s, got %s", want, quoteShort(n.Value))
		return 0, false
	case d < time.Second:
		c.errorf(n, field, "%s: give at least one second, or leave %s out", quoteShort(n.Value), field)
		return 0, false
	case d > maxCapacityDuration:
		c.errorf(n, field, "%s is out of range: at most 366d", quoteShort(n.Value))
		return 0, false
	}
	return d, true
}

func (c *checker) reservation(n *yaml.Node, field string) (string, bool) {
	v, ok := c.str(n, field)
	if !ok {
		return "", false
	}
	v = strings.TrimSpace(v)
	if !reservationRE.MatchString(v) {
		c.errorf(n, field, "%s is not a reservation name or id (e.g. my-a3-block, cr-0abc12345def67890) or any", quoteShort(v))
		return "", false
	}
	return v, true
}

// setCapacity puts cp on r and on each of its alternatives.
func (r *Resources) setCapacity(cp *Capacity) {
	r.Capacity = cp
	for i := range r.AnyOf {
		r.AnyOf[i].Capacity = cp.clone()
	}
	for i := range r.Ordered {
		r.Ordered[i].Capacity = cp.clone()
	}
}

// QueuedProvisioning marks a Kubernetes context (kubernetes.contexts[i].queued_provisioning)
// whose cluster autoscaler provisions nodes for ProvisioningRequests:
//
//	contexts:
//	  - name: gke-a3
//	    queued_provisioning: true                             # class queued-provisioning.gke.io
//	    # or queued_provisioning: {class: queued-provisioning.gke.io}
type QueuedProvisioning struct {
	// Class is the ProvisioningRequest's provisioningClassName.
	Class string `json:"class" yaml:"class"`
	// Accelerators are the GPUs the queued node pools create, with the count one node has
	// (accelerators: [H100:8]): a pool scaled to zero shows no node, so Ferry offers these.
	Accelerators []Accelerator `json:"accelerators,omitempty" yaml:"accelerators"`
}

// DefaultProvisioningClass is GKE's class for queued provisioning (Dynamic Workload Scheduler).
const DefaultProvisioningClass = "queued-provisioning.gke.io"

// queuedProvisioningKeys are queued_provisioning's keys.
var queuedProvisioningKeys = keysOf[QueuedProvisioning]()

// queuedProvisioning reads true, false or {class: NAME}; nil for false.
func (c *checker) queuedProvisioning(n *yaml.Node, field string) *QueuedProvisioning {
	n = c.deref(n)
	if n.Kind != yaml.MappingNode {
		if v, ok := c.boolean(n, field); ok && v {
			return &QueuedProvisioning{Class: DefaultProvisioningClass}
		}
		return nil
	}
	f, ok := c.fields(n, field, queuedProvisioningKeys)
	if !ok {
		return nil
	}
	q := &QueuedProvisioning{Class: DefaultProvisioningClass}
	if e, ok := f["class"]; ok {
		fld := joinField(field, "class")
		v, ok := c.str(e.value, fld)
		if !ok {
			return nil
		}
		if !dnsSubdomainRE.MatchString(v) {
			c.errorf(e.value, fld, "%s is not a provisioning class name such as %s", quoteShort(v), DefaultProvisioningClass)
			return nil
		}
		q.Class = v
	}
	if e, ok := f["accelerators"]; ok {
		if q.Accelerators, ok = c.accelerators(c.deref(e.value), joinField(field, "accelerators")); !ok {
			return nil
		}
	}
	return q
}

// kueueLocalQueue reads kubernetes.kueue_local_queue: the LocalQueue (in each context's
// namespace) that queued jobs go through when Kueue is installed. Empty: the provider looks
// for one (launcher/kubernetes).
func (c *checker) kueueLocalQueue(n *yaml.Node, field string) string {
	v, ok := c.str(n, field)
	if !ok {
		return ""
	}
	if !dnsSubdomainRE.MatchString(v) {
		c.errorf(n, field, "%s is not a LocalQueue name (lowercase letters, digits, '-' and '.')", quoteShort(v))
		return ""
	}
	return v
}
