package controller

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/proxy/attach"
	"github.com/ferryserve/ferry/proxy/kvevents"
)

// proxyConfig turns a service's YAML into its proxy's configuration. TLS files are read here, so
// a bad certificate fails `serve up` with the file's name rather than every handshake later.
func (c *Controller) proxyConfig(name string, svc *configs.Service) (proxy.ServiceConfig, error) {
	cfg := attach.ProxyConfigFor(svc).Apply(proxy.ServiceConfig{
		Name:      name,
		Guard:     c.guard,
		Logger:    c.log.Named("proxy"), // the proxy adds the service
		Metrics:   c.metrics,
		AccessLog: c.log.Named("access"),
		Tenancy:   c.tenancy,
		Tracing:   c.tracing,
	})
	if c.kvEvents != nil {
		cfg.KVEvents = c.kvEvents
	}
	if t := svc.TLS; t != nil {
		tlsCfg, err := proxy.LoadTLS(t.CertFile, t.KeyFile)
		if err != nil {
			return cfg, fmt.Errorf("service %q: service.tls: %w", name, err)
		}
		cfg.TLS = tlsCfg
	}
	return cfg, nil
}

// listenKVEvents binds the endpoint replicas publish their KV-cache events to, or connects to
// each replica's publisher, when configured: one source for every service, since engines are
// named by address.
func (c *Controller) listenKVEvents() error {
	l, err := kvevents.Open(c.opts.KVEventsAddr, c.opts.KVEventsPort, c.log.Named("kvevents"))
	if l == nil || err != nil {
		return err
	}
	for _, col := range l.Collectors() {
		if err := c.registry.Register(col); err != nil {
			l.Close()
			return err
		}
	}
	c.kvEvents = l
	c.log.Info("hearing the replicas' KV-cache events: " + l.Describe())
	return nil
}

// startGateway binds the shared model-routing endpoint. The default address may be taken (by a
// second FERRY_HOME's controller, say): then the controller runs without a gateway rather than
// not at all. An address the user chose must work.
func (c *Controller) startGateway() error {
	ln, err := c.listenOptional(c.opts.GatewayAddr, DefaultGatewayAddr, "gateway")
	if ln == nil {
		return err
	}
	c.gateway = proxy.NewGateway(proxy.GatewayConfig{
		Guard:     c.guard,
		Logger:    c.log.Named("gateway"),
		Metrics:   c.metrics,
		AccessLog: c.log.Named("access"),
		Tracing:   c.tracing,
	})
	c.gatewayAddr = ln.Addr().String()
	go func() {
		if err := c.gateway.Serve(ln); err != nil {
			c.log.Error("gateway stopped", zap.Error(err))
		}
	}()
	c.log.Info("gateway serving", zap.String("endpoint", "http://"+c.gatewayAddr))
	return nil
}

// updateGateway gives the gateway the current services.
func (c *Controller) updateGateway() {
	if c.gateway == nil {
		return
	}
	var svcs []*proxy.Service
	for _, s := range c.serviceList() {
		svcs = append(svcs, s.front.Current())
	}
	c.gateway.SetServices(svcs)
}
