package controller

import (
	"context"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/proxy/attach"
)

// Standalone proxies (`ferry proxy --attach`) follow a service through the controller API
// (proxy/attach). What the controller adds is the wiring: each service's attach.Hub, fed by
// the service's READY set and task, and read by the drain check and the autoscaler; and the
// list of services an attached gateway (`ferry proxy --attach-all`) fronts, published once the
// stored services are restored and at every service that starts or is taken down.

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
	log := c.log.Named("api")
	routes := append(attach.Routes(c.attachedService, log), attach.ServiceListRoutes(c, log)...)
	return append(routes, attach.TenantRoutes(c, log)...)
}

// ListServices implements attach.ServiceLister: a long poll for the names of the services an
// attached gateway fronts. It answers at once once the controller is stopping, rather than hold
// the API server's shutdown.
func (c *Controller) ListServices(ctx context.Context, after uint64, wait time.Duration) attach.ServiceList {
	if c.ctx != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(c.ctx, cancel)()
	}
	return c.attachList.Wait(ctx, after, wait)
}

// publishServices hands attached gateways the names of the services now running, those being
// taken down left out (their models are unknown there at once, while their requests drain).
// Before the stored services are restored it publishes nothing: a gateway would drop every
// service a restarted controller has not restored yet.
func (c *Controller) publishServices() {
	c.listMu.Lock()
	defer c.listMu.Unlock()
	if !c.listRestored {
		return
	}
	var names []string
	for _, s := range c.serviceList() {
		s.mu.Lock()
		down := s.shuttingDown
		s.mu.Unlock()
		if !down {
			names = append(names, s.name)
		}
	}
	c.attachList.Publish(names)
}

// servicesRestored starts publishing the list of services (publishServices).
func (c *Controller) servicesRestored() {
	c.listMu.Lock()
	c.listRestored = true
	c.listMu.Unlock()
	c.publishServices()
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
