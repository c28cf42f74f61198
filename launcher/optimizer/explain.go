package optimizer

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/catalog"
)

// NoCandidateError is Plan's answer when no enabled infra can run a request: for every
// alternative, why each infra it may use cannot. Adding capacity (a Kubernetes node pool, an
// enabled cloud) or relaxing the request can fix it; retrying the same plan cannot.
type NoCandidateError struct {
	// Key is "any_of" or "ordered" when the resources have alternatives, else "".
	Key string
	// Unmet has one entry per alternative, in the order written.
	Unmet []Unmet
}

// Unmet is one alternative and why it fits nowhere.
type Unmet struct {
	// Request is the alternative in short form: "A100:1 or L4:1 with cpus=8+ on aws (spot)".
	Request string
	// Reasons has one entry per infra and accelerator: "aws has A100 only in counts 8".
	Reasons []string
}

// Error reads "no candidate for A100:3: aws has A100 only in counts 8; kubernetes/lab has no
// A100", with one indented line per alternative when there are several.
func (e *NoCandidateError) Error() string {
	if len(e.Unmet) == 1 {
		u := e.Unmet[0]
		return "no candidate for " + u.Request + ": " + strings.Join(u.Reasons, "; ")
	}
	var b strings.Builder
	b.WriteString("no candidate for any alternative:")
	for i, u := range e.Unmet {
		fmt.Fprintf(&b, "\n  %s[%d] %s: %s", e.Key, i, u.Request, strings.Join(u.Reasons, "; "))
	}
	return b.String()
}

// explain builds the NoCandidateError for a plan that came out empty. It runs only then, so it
// favours clear messages over speed.
func explain(r configs.Resources, alts []configs.Resources, reqs []request, cat *catalog.Catalog, infras []Infra) error {
	e := &NoCandidateError{}
	switch {
	case len(r.AnyOf) > 0:
		e.Key = "any_of"
	case len(r.Ordered) > 0:
		e.Key = "ordered"
	}
	for i := range reqs {
		e.Unmet = append(e.Unmet, Unmet{Request: describe(alts[i]), Reasons: reqs[i].reasons(cat, infras)})
	}
	return e
}

// describe renders an alternative in the YAML's own terms.
func describe(r configs.Resources) string {
	var extra []string
	if r.CPUs != "" {
		extra = append(extra, "cpus="+r.CPUs)
	}
	if r.Memory != "" {
		extra = append(extra, "memory="+r.Memory)
	}
	var s string
	switch {
	case len(r.Accelerators) > 0:
		specs := make([]string, len(r.Accelerators))
		for i, a := range r.Accelerators {
			specs[i] = a.Spec()
		}
		s = strings.Join(specs, " or ")
		if len(extra) > 0 {
			s += " with " + strings.Join(extra, ", ")
		}
	case len(extra) > 0:
		s = strings.Join(extra, ", ")
	default:
		s = "any instance"
	}
	if t, err := parseTarget(r); err == nil && !t.anywhere && !t.auto {
		s += " on " + t.spec
	}
	if r.UseSpot {
		s += " (spot)"
	}
	return s
}

func (req *request) reasons(cat *catalog.Catalog, infras []Infra) []string {
	var out []string
	admitted := false
	for i := range infras {
		inf := &infras[i]
		if !req.target.admits(inf) {
			continue
		}
		admitted = true
		switch {
		case inf.Kind == Local && req.target.auto:
			out = append(out, req.localReasons(inf)...)
			continue
		case inf.Kind == Kubernetes && req.instanceType != "":
			out = append(out, inf.Name+" has no instance types (give accelerators, cpus and memory)")
			continue
		}
		for _, acc := range req.wanted() {
			switch inf.Kind {
			case Kubernetes:
				if _, ok := fittingOffering(inf, acc, req.shares(acc)); !ok {
					out = append(out, kubeReason(inf, acc, req.shares(acc)))
				}
			case Cloud:
				out = append(out, req.cloudReason(cat, inf, acc))
			}
		}
	}
	if !admitted {
		out = append(out, req.target.notEnabled(infras))
	}
	return out
}

func kubeReason(inf *Infra, acc configs.Accelerator, shared bool) string {
	named := func(o launcher.Offering) bool { return strings.EqualFold(o.Accelerator, acc.Name) }
	sharing := func(o launcher.Offering) bool { return named(o) && o.SharesGPU }
	if shared && slices.ContainsFunc(inf.Offerings, named) && !slices.ContainsFunc(inf.Offerings, sharing) {
		return fmt.Sprintf("%s cannot share %s GPUs: no %s node advertises HAMi (the hami.io/node-nvidia-register annotation, or nvidia.com/gpumem and nvidia.com/gpucores allocatable); %s runs on local or on a context with HAMi",
			inf.Name, acc.Name, acc.Name, acc.Spec())
	}
	most, name := -1.0, acc.Name
	for _, o := range inf.Offerings {
		if strings.EqualFold(o.Accelerator, acc.Name) && o.AcceleratorCount > most {
			most, name = o.AcceleratorCount, o.Accelerator
		}
	}
	if most < 0 {
		return fmt.Sprintf("%s has no %s", inf.Name, acc.Name)
	}
	return fmt.Sprintf("%s has %s only up to %s per node", inf.Name, name, formatNumber(most))
}

// cloudReason replays the row filters in order and names the first that left nothing.
func (req *request) cloudReason(cat *catalog.Catalog, inf *Infra, acc configs.Accelerator) string {
	rows := cat.Lookup(inf.Name, acc.Name)
	if req.instanceType != "" {
		if rows = cat.InstanceType(req.instanceType); len(rows) == 0 || rows[0].Cloud != inf.Name {
			return fmt.Sprintf("%s has no instance type %s", inf.Name, req.instanceType)
		}
	}
	switch {
	case len(rows) == 0 && acc.Name == "":
		return inf.Name + " has no CPU-only instance types in the catalog"
	case len(rows) == 0:
		return fmt.Sprintf("%s has no %s", inf.Name, acc.Name)
	case acc.Count != math.Trunc(acc.Count) || req.shares(acc):
		return fmt.Sprintf("%s sells whole GPUs only (a fraction or gpu_share such as %s runs on local, or on Kubernetes with HAMi)", inf.Name, acc.Spec())
	}
	what := "CPU-only instance types"
	if acc.Name != "" {
		what = rows[0].Accelerator + ":" + formatNumber(acc.Count)
	}
	t := &req.target
	byName := t.unresolvedZone(inf)
	keep := func(rows []catalog.Row, ok func(*catalog.Row) bool) []catalog.Row {
		var out []catalog.Row
		for i := range rows {
			if ok(&rows[i]) {
				out = append(out, rows[i])
			}
		}
		return out
	}

	next := keep(rows, func(r *catalog.Row) bool { return float64(r.AcceleratorCount) == acc.Count })
	if len(next) == 0 {
		return fmt.Sprintf("%s has %s only in counts %s", inf.Name, rows[0].Accelerator,
			distinct(rows, func(r *catalog.Row) int { return r.AcceleratorCount }, strconv.Itoa))
	}
	rows, next = next, keep(next, t.inRegion)
	if len(next) == 0 {
		return fmt.Sprintf("%s has %s only in %s", inf.Name, what, distinct(rows, func(r *catalog.Row) string { return r.Region }, identity))
	}
	rows, next = next, keep(next, func(r *catalog.Row) bool { _, ok := t.zoneOf(inf, r, byName); return ok })
	if len(next) == 0 {
		zones := distinct(rows, func(r *catalog.Row) string {
			if name, ok := inf.ZoneNames[r.Zone]; ok {
				return name
			}
			return r.Zone
		}, identity)
		if t.zone == "" {
			return fmt.Sprintf("%s has %s only in AZs this account lacks (%s)", inf.Name, what, zones)
		}
		return fmt.Sprintf("%s has %s in %s only in zones %s", inf.Name, what, t.region, zones)
	}
	rows, next = next, keep(next, func(r *catalog.Row) bool { _, ok := r.Price(req.spot); return ok })
	if len(next) == 0 {
		pricing, where := "on-demand", ""
		if req.spot {
			pricing = "spot"
		}
		if t.region != "" {
			where = " in " + strings.Join(nonEmpty(t.region, t.zone), "/")
		}
		return fmt.Sprintf("%s has no %s price for %s%s (%s)", inf.Name, pricing, what, where,
			distinct(rows, func(r *catalog.Row) string { return r.InstanceType }, identity))
	}
	rows, next = next, keep(next, func(r *catalog.Row) bool { return req.cpus.admits(r.VCPUs) })
	if len(next) == 0 {
		return fmt.Sprintf("%s has %s only with %s vCPUs, not %s", inf.Name, what,
			distinct(rows, func(r *catalog.Row) float64 { return r.VCPUs }, formatNumber), req.cpus)
	}
	rows, next = next, keep(next, func(r *catalog.Row) bool { return req.memory.admits(r.MemoryGiB) })
	if len(next) == 0 {
		return fmt.Sprintf("%s has %s only with %s GiB memory, not %s", inf.Name, what,
			distinct(rows, func(r *catalog.Row) float64 { return r.MemoryGiB }, formatNumber), req.memory)
	}
	return fmt.Sprintf("%s has no match for %s", inf.Name, what) // unreachable while the filters agree with plan
}

func identity(s string) string { return s }

// distinct lists the sorted distinct values of a row field: "1, 2, 4, 8".
func distinct[T cmp.Ordered](rows []catalog.Row, field func(*catalog.Row) T, format func(T) string) string {
	vals := make([]T, 0, len(rows))
	for i := range rows {
		vals = append(vals, field(&rows[i]))
	}
	slices.Sort(vals)
	vals = slices.Compact(vals)
	parts := make([]string, len(vals))
	for i, v := range vals {
		parts[i] = format(v)
	}
	return strings.Join(parts, ", ")
}

// notEnabled says why an alternative's infra admitted no enabled infra.
func (t *target) notEnabled(infras []Infra) string {
	switch {
	case t.anywhere:
		return "no infra other than local is enabled (local runs only when asked for by name)"
	case t.auto:
		return "no infra is enabled"
	case t.kind == Kubernetes && t.name == "":
		return "no Kubernetes context is enabled"
	case t.kind == Kubernetes:
		var enabled []string
		for _, inf := range infras {
			if inf.Kind == Kubernetes {
				enabled = append(enabled, inf.Name)
			}
		}
		if len(enabled) > 0 {
			return fmt.Sprintf("%s is not enabled (enabled: %s)", t.name, strings.Join(enabled, ", "))
		}
	}
	return t.name + " is not enabled"
}
