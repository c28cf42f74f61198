package jobs

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
)

// Preemption between jobs, as Kueue preempts within a ClusterQueue (withinClusterQueue:
// LowerPriority). Serving takes GPUs from jobs through the infra's own scheduler (Kubernetes'
// PriorityClasses, local's capacity.go); between jobs Ferry's queue decides, because only it
// knows which jobs are preemptible: a job that found no capacity preempts running jobs that are
// preemptible, of a lower priority, and on capacity Ferry owns (local, Kubernetes: a cloud's
// capacity is not freed for Ferry by stopping a VM), asking for the same GPU. Victims are taken
// lowest priority first, then the most recently started (the least work lost), until they free
// the GPUs the waiting gang asks for (the queue does not know how much of the infra is free
// besides, so it may free more than needed when part of it is); none are taken when all of
// them together could not free that much. A victim's watch ends its gang as a lost node (SIGTERM and its grace to
// checkpoint, then RECOVERING, resumed from its checkpoint once capacity frees), and the
// waiting job takes the GPUs at its next try, ahead of the victim in the queue's priority
// order. A job preempted is safe from another preemption for Config.PreemptionCooldown, so a
// stream of higher-priority work cannot starve it.

// DefaultPreemptionCooldown is Config.PreemptionCooldown's default.
const DefaultPreemptionCooldown = 5 * time.Minute

// gpuAsk is the GPUs of one name a job's gang asks for, in total.
func gpuAsk(j Job, name string) float64 {
	most := 0.0
	for _, c := range j.Task.Resources.Candidates() {
		for _, a := range c.Accelerators {
			if strings.EqualFold(a.Name, name) {
				most = max(most, a.Count)
			}
		}
	}
	nodes := len(j.Nodes)
	if nodes == 0 {
		nodes = gangSize(j)
	}
	return most * float64(nodes)
}

// mayRunOn reports whether some alternative of job j may be placed on infra (an instance's:
// "local", "kubernetes/CONTEXT"): freeing capacity there for a job that cannot use it would
// stop the victim for nothing.
func mayRunOn(j Job, infra string) bool {
	for _, c := range j.Task.Resources.Candidates() {
		switch {
		case c.Infra == "" || c.Infra == infra:
			return true
		case c.Infra == "*" && infra != "local":
			return true
		case strings.HasPrefix(infra, c.Infra+"/"): // kubernetes: every context
			return true
		}
	}
	return false
}

// accelerators are the GPU names job j may run on.
func accelerators(j Job) []string {
	var out []string
	for _, c := range j.Task.Resources.Candidates() {
		for _, a := range c.Accelerators {
			if !slices.ContainsFunc(out, func(n string) bool { return strings.EqualFold(n, a.Name) }) {
				out = append(out, a.Name)
			}
		}
	}
	return out
}

// victimOf reports whether running job v may be preempted for waiting job h, freeing GPUs
// named name.
func (m *Manager) victimOf(v, h Job, name string) bool {
	if v.ID == h.ID || v.State != Running || len(v.Nodes) == 0 || !v.Preemptible || v.Priority >= h.Priority {
		return false
	}
	if !v.PreemptedAt.IsZero() && m.cfg.Now().Sub(v.PreemptedAt) < m.cfg.PreemptionCooldown {
		return false
	}
	for _, n := range v.Nodes {
		if !launcher.OwnedCapacity(n.Infra) || !mayRunOn(h, n.Infra) {
			return false
		}
	}
	return gpuAsk(v, name) > 0
}

// preemptFor marks the fewest running jobs that make room for waiting job h (see above) to be
// preempted by their watches, and returns what it did for h's reason ("" when nothing).
func (m *Manager) preemptFor(h Job) string {
	all := m.List()
	for _, name := range accelerators(h) {
		need := gpuAsk(h, name)
		var going, candidates []Job
		for _, v := range all {
			if v.PreemptFor != "" && v.State == Running {
				going = append(going, v) // already on its way out: its GPUs count
			} else if m.victimOf(v, h, name) {
				candidates = append(candidates, v)
			}
		}
		for _, v := range going {
			need -= gpuAsk(v, name)
		}
		if need <= 0 {
			return "; waiting for " + describeJobs(going) + " to stop"
		}
		slices.SortFunc(candidates, func(a, b Job) int {
			return cmp.Or(cmp.Compare(a.Priority, b.Priority), b.StateSince.Compare(a.StateSince), cmp.Compare(b.ID, a.ID))
		})
		var chosen []Job
		for _, v := range candidates {
			if need <= 0 {
				break
			}
			chosen = append(chosen, v)
			need -= gpuAsk(v, name)
		}
		if need > 0 {
			continue // not enough to take: take nothing
		}
		why := fmt.Sprintf("preempted for job %d (%s, priority %d)", h.ID, h.Name, h.Priority)
		for _, v := range chosen {
			m.update(v.ID, func(cur *Job) bool {
				if cur.State != Running || cur.PreemptFor != "" {
					return false
				}
				cur.PreemptFor = why
				return true
			})
			m.log.Info("preempting a job for a higher-priority one", zap.Int64("job", v.ID), zap.Int("priority", v.Priority),
				zap.Int64("for", h.ID), zap.Int("for_priority", h.Priority), zap.String("gpu", name))
		}
		return "; preempting " + describeJobs(chosen)
	}
	return ""
}

func describeJobs(js []Job) string {
	parts := make([]string, len(js))
	for i, j := range js {
		parts[i] = fmt.Sprintf("job %d (%s, priority %d)", j.ID, j.Name, j.Priority)
	}
	return strings.Join(parts, ", ")
}

// preempted is the assessment a watch acts on for a job marked PreemptFor: its gang is lost,
// every node stopped with its grace.
func preempted(j Job) assessment {
	a := assessment{verdict: nodeLost, reason: j.PreemptFor, exitCodes: make([]int, gangSize(j))}
	for i := range a.exitCodes {
		a.exitCodes[i] = -1
	}
	return a
}
