package controller

import (
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/proxy/attach"
)

// Standalone proxies (`ferry proxy --attach`) follow a service through the controller API
// (proxy/attach). What the controller adds is the wiring: each service's attach.Hub, fed by
// the service's READY set and task, and read by the drain check and the autoscaler.

// newAttachHub is s's hub; now is its clock.
func (c *Controller) newAttachHub(s *service, now func() time.Time) *attach.Hub {
	return attach.NewHub(attach.HubConfig{
		Config: func() attach.ProxyConfig {
			if t := s.attachedTask(); t != nil {
				return attach.ProxyConfigFor(t.Service)
			}
			return attach.ProxyConfig{}
		},
		OnWaiting: s.pokeScaler,
		Stopping:  c.ctx,
		Started:   c.startedAt,
		Now:       now,
	})
}

// attachRoutes are the attach routes of the controller API.
func (c *Controller) attachRoutes() []api.Route {
	return append(attach.Routes(c.attachedService, c.log.Named("api")), attach.TenantRoutes(c, c.log.Named("api"))...)
}

// attachedService finds a service for the attach routes.
func (c *Controller) attachedService(name string) (attach.Service, error) {
	s, err := c.serviceNamed(name)
	if err != nil {
		return nil, err
	}
	return s.attach, nil
}

// attachedTask is the service's current task; an update may replace it.
func (s *service) attachedTask() *configs.Task {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.task
}

// busy is how many requests still use the replica at addr, in this process's proxy and in
// every attached proxy (see attach.Hub.Busy).
func (c *Controller) busy(s *service, addr string) int64 {
	return s.front.Busy(addr) + s.attach.Busy(addr)
}

// remoteLoad sums what attached proxies reported: requests in flight or waiting for a replica
// in the latest fresh reports, and a count of their arrivals that never goes down.
func (c *Controller) remoteLoad(s *service) (inflight float64, arrivals uint64) {
	return s.attach.Load()
}
