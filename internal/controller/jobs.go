package controller

import (
	"context"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/jobs"
)

// startJobs runs the jobs manager on the provisioner services use, so that both draw from one
// optimizer, one set of failover blocks and one view of capacity.
func (c *Controller) startJobs(ctx context.Context) error {
	m, err := jobs.New(jobs.Config{
		Provider:           c.provider,
		Store:              c.store,
		Dir:                filepath.Join(c.opts.Home.Dir, "jobs"),
		Logger:             c.log,
		WatchInterval:      c.opts.JobWatchInterval,
		RetryInterval:      c.opts.JobRetryInterval,
		PreemptionCooldown: c.opts.PreemptionCooldown,
	})
	if err != nil {
		return err
	}
	if err := m.Start(ctx); err != nil {
		return err
	}
	c.jobs = m
	// The fleet's gauges read the jobs manager too: exported from here on.
	return c.registry.Register(fleetCollector{c})
}

// jobRoutes are the jobs API and the capacity view.
func (c *Controller) jobRoutes() []api.Route {
	return append(api.JobRoutes(c.jobs, c.log.Named("api")),
		api.Route{Method: http.MethodGet, Pattern: "/v1/capacity", Handler: func(w http.ResponseWriter, _ *http.Request) {
			api.WriteJSON(w, http.StatusOK, c.capacity())
		}})
}

// capacity is who holds what: every service replica with an instance and every job node,
// where it runs and what it costs, ordered by infra then owner.
func (c *Controller) capacity() []api.Holding {
	var out []api.Holding
	for _, s := range c.serviceList() {
		for _, r := range s.mgr.Replicas() {
			if r.InstanceID == "" {
				continue // nothing launched yet, or gone
			}
			out = append(out, api.Holding{Kind: "service", Owner: s.name, Unit: "replica " + strconv.Itoa(r.ID), State: string(r.Status),
				Infra: r.Infra, Zone: r.Zone, Spot: r.Spot, Resources: r.Resources, PricePerHour: r.Price, Since: r.LaunchedAt})
		}
	}
	if c.jobs != nil {
		for _, j := range c.jobs.List() {
			for _, n := range j.Nodes {
				h := api.Holding{Kind: "job", Owner: j.Name + " (" + strconv.FormatInt(j.ID, 10) + ")", Unit: "node " + strconv.Itoa(n.Rank), State: string(j.State),
					Infra: n.Infra, Zone: n.Zone, Spot: n.Spot, PricePerHour: n.Price, Since: j.StateSince, Priority: j.Priority,
					Preemptible: j.Preemptible}
				if j.Task != nil {
					h.Resources = j.Task.Resources.String()
				}
				out = append(out, h)
			}
		}
	}
	slices.SortStableFunc(out, func(a, b api.Holding) int {
		if x := strings.Compare(a.Infra, b.Infra); x != 0 {
			return x
		}
		return strings.Compare(a.Owner, b.Owner)
	})
	if out == nil {
		out = []api.Holding{}
	}
	return out
}
