package optimizer

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/catalog"
)

// pinInstanceType applies resources.instance_type as SkyPilot does: the type implies its
// accelerators, vCPUs and memory, so a request that says otherwise is an error rather than an
// empty plan, and so is a type the catalog does not have (with the closest names). Only the
// clouds sell instance types: Kubernetes and local are not candidates for a pinned type.
func (req *request) pinInstanceType(cat *catalog.Catalog, name string) error {
	rows := cat.InstanceType(name)
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: instance_type %s: %s", launcher.ErrInvalid, name, fmt.Sprintf(format, args...))
	}
	if len(rows) == 0 {
		return bad("not in the catalog%s", closeMatches(name, cat.InstanceTypes()))
	}
	t := &req.target
	switch {
	case t.kind == Local || t.kind == Kubernetes:
		return bad("an instance type is a cloud's, and infra is %s: give accelerators, cpus and memory instead", t.spec)
	case t.kind == Cloud && t.name != rows[0].Cloud:
		return bad("is a %s instance type, and infra is %s", rows[0].Cloud, t.spec)
	}
	row := rows[0]
	if len(req.accs) > 0 {
		i := slices.IndexFunc(req.accs, func(a configs.Accelerator) bool {
			return strings.EqualFold(a.Name, row.Accelerator) && a.Count == float64(row.AcceleratorCount)
		})
		if i < 0 {
			has := "no accelerators"
			if row.Accelerator != "" {
				has = fmt.Sprintf("%s:%d", row.Accelerator, row.AcceleratorCount)
			}
			return bad("has %s, which conflicts with accelerators %s (leave accelerators out: the type implies them)", has, accSpecs(req.accs))
		}
	}
	if !req.cpus.admits(row.VCPUs) {
		return bad("has %s vCPUs, which conflicts with cpus %s", formatNumber(row.VCPUs), req.cpus)
	}
	if !req.memory.admits(row.MemoryGiB) {
		return bad("has %s GiB memory, which conflicts with memory %s", formatNumber(row.MemoryGiB), req.memory)
	}
	req.accs = nil
	if row.Accelerator != "" {
		req.accs = []configs.Accelerator{{Name: row.Accelerator, Count: float64(row.AcceleratorCount)}}
	}
	req.instanceType = name
	return nil
}

func accSpecs(accs []configs.Accelerator) string {
	specs := make([]string, len(accs))
	for i, a := range accs {
		specs[i] = a.Spec()
	}
	return strings.Join(specs, ", ")
}

// closeMatches names up to three known types nearest to name by edit distance (ignoring case),
// as "; did you mean m7i.large, m6i.large?", or "" when none is near.
func closeMatches(name string, known []string) string {
	type scored struct {
		name string
		d    int
	}
	lname := strings.ToLower(name)
	limit := max(2, len(name)/3)
	var near []scored
	for _, k := range known {
		if d := editDistance(lname, strings.ToLower(k)); d <= limit {
			near = append(near, scored{k, d})
		}
	}
	if len(near) == 0 {
		return ""
	}
	slices.SortFunc(near, func(a, b scored) int {
		return cmp.Or(cmp.Compare(a.d, b.d), strings.Compare(a.name, b.name))
	})
	names := make([]string, 0, 3)
	for i := 0; i < len(near) && i < 3; i++ {
		names = append(names, near[i].name)
	}
	return "; did you mean " + strings.Join(names, ", ") + "?"
}

// editDistance is Levenshtein's distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
