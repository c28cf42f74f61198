package jobs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/ferryserve/ferry/launcher"
)

// When an infra fails. A job's gang runs in one location, so the manager asks only the infras
// its nodes run on: an infra the job does not use — failing, throttled or hung — never delays
// the judgement of its gang (a local 2-node job whose ranks had both exited once stayed RUNNING
// for minutes while GCP answered 503, because every look listed every infra). What a listing
// could not read is a launcher.Gap, and a node in a gap is unknown, never gone: its gang is not
// judged, relaunched or failed until its infra answers again (watch.go, adopt.go). What cannot
// be stopped because its infra does not answer is handed to the provisioner as a
// launcher.Leftover, recorded in Job.LeftBehind and said in the job's reason; the job ends
// anyway (release, stopNodes).

// infraLister is the optional capability of listing some infras only (the provisioner's
// ListIn): a job lists where its nodes run. Providers without it are listed whole (List).
type infraLister interface {
	ListIn(ctx context.Context, infras []string, selector map[string]string) ([]launcher.Instance, error)
}

// jobInfras are the infras of job j's recorded nodes, sorted; nil when none is recorded.
func jobInfras(j Job) []string {
	var out []string
	for _, n := range j.Nodes {
		if n.Infra != "" && !slices.Contains(out, n.Infra) {
			out = append(out, n.Infra)
		}
	}
	slices.Sort(out)
	return out
}

// listJob lists job j's instances, of every attempt: on the infras its nodes run on when the
// provider can list by infra and nodes are recorded, else everywhere (a launch cut short may
// have left nodes anywhere). The error is the provider's; a *launcher.PartialListError comes
// with good instances outside its gaps (launcher.Partial).
func (m *Manager) listJob(ctx context.Context, j Job) ([]launcher.Instance, error) {
	sel := map[string]string{launcher.LabelJob: strconv.FormatInt(j.ID, 10)}
	if l, ok := m.cfg.Provider.(infraLister); ok {
		if infras := jobInfras(j); len(infras) > 0 {
			return l.ListIn(ctx, infras, sel)
		}
	}
	return m.cfg.Provider.List(ctx, sel)
}

// listGaps splits a listing of job j into what it read and what it could not: the gaps that
// may hide something of the job. A listing that failed whole is a gap over each infra of the
// job's nodes (or over everything, Infra "", when none is recorded); a gap whose place does not
// exist (launcher.ErrNotFound: a zone the infra lacks, an infra not enabled) holds nothing and
// is dropped.
func listGaps(j Job, insts []launcher.Instance, err error) ([]launcher.Instance, []launcher.Gap) {
	gaps, partial := launcher.Partial(err)
	if !partial {
		infras := jobInfras(j)
		if len(infras) == 0 {
			infras = []string{""}
		}
		gaps = make([]launcher.Gap, len(infras))
		for i, infra := range infras {
			gaps[i] = launcher.Gap{Infra: infra, Err: err}
		}
		return nil, gaps
	}
	return insts, slices.DeleteFunc(slices.Clone(gaps), func(g launcher.Gap) bool { return errors.Is(g.Err, launcher.ErrNotFound) })
}

// covers reports whether gap g may hide an instance at infra, region and zone; a gap with no
// infra is a listing that failed whole.
func covers(gaps []launcher.Gap, infra, region, zone string) (launcher.Gap, bool) {
	for _, g := range gaps {
		if g.Infra == "" || g.Covers(infra, region, zone) {
			return g, true
		}
	}
	return launcher.Gap{}, false
}

// hiddenNodes returns the gaps that cover a node of job j's current gang, each once.
func hiddenNodes(j Job, gaps []launcher.Gap) []launcher.Gap {
	var out []launcher.Gap
	for _, n := range j.Nodes {
		g, ok := covers(gaps, n.Infra, n.Region, n.Zone)
		if ok && !slices.ContainsFunc(out, func(o launcher.Gap) bool { return o.Where() == g.Where() }) {
			out = append(out, g)
		}
	}
	return out
}

// gapsWhere names gaps for people: "gcp", "aws/us-east-1, gcp/us-central1-a"; "every infra" for
// a listing that failed whole.
func gapsWhere(gaps []launcher.Gap) string {
	names := make([]string, 0, len(gaps))
	for _, g := range gaps {
		w := g.Where()
		if g.Infra == "" {
			w = "every infra"
		}
		if !slices.Contains(names, w) {
			names = append(names, w)
		}
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// gapErr is the first gap's error, for a reason.
func gapErr(gaps []launcher.Gap) error {
	for _, g := range gaps {
		if g.Err != nil {
			return g.Err
		}
	}
	return launcher.ErrUnavailable
}

// leftNote says what stopping a job left behind, per infra: "2 node(s) left on gcp, stopped
// when gcp answers again".
func leftNote(left []launcher.Leftover) string {
	nodes := map[string]int{}
	for _, l := range left {
		if l.InstanceID != "" {
			nodes[l.Infra]++
		} else if _, ok := nodes[l.Infra]; !ok {
			nodes[l.Infra] = 0
		}
	}
	var parts []string
	for _, infra := range slices.Sorted(maps.Keys(nodes)) {
		if n := nodes[infra]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d node(s) left on %s, stopped when %s answers again", n, infra, infra))
		} else {
			parts = append(parts, fmt.Sprintf("%s could not be listed: any node of it there is stopped when %s answers again", infra, infra))
		}
	}
	return strings.Join(parts, "; ")
}

// withLeftNote adds what was left behind to a job's reason (once).
func withLeftNote(reason string, left []launcher.Leftover) string {
	note := leftNote(left)
	switch {
	case note == "" || strings.Contains(reason, note):
		return reason
	case reason == "":
		return note
	}
	return reason + "; " + note
}

// mergeLeftovers adds more to have, replacing those with the same key.
func mergeLeftovers(have, more []launcher.Leftover) []launcher.Leftover {
	for _, l := range more {
		if i := slices.IndexFunc(have, func(h launcher.Leftover) bool { return h.Key == l.Key }); i >= 0 {
			have[i] = l
			continue
		}
		have = append(have, l)
	}
	return have
}
