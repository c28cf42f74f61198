package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/proxy"
)

// adminShutdownTimeout bounds waiting for a scrape in progress when the controller stops.
const adminShutdownTimeout = 5 * time.Second

// initMetrics creates the controller's registry, whose proxy metrics every service and the
// gateway share.
func (c *Controller) initMetrics() error {
	reg, m, err := proxy.NewRegistry()
	if err != nil {
		return err
	}
	c.registry, c.metrics = reg, m
	return nil
}

// startMetrics serves /metrics and /healthz on their own listener, apart from service traffic,
// so a scrape works while the endpoints are saturated and metrics are never exposed where
// clients connect. Like the gateway, the default address may be taken (by a second FERRY_HOME's
// controller): then the controller runs without it. An address the user chose must work.
func (c *Controller) startMetrics() error {
	addr := c.opts.MetricsAddr
	ln, err := c.listenOptional(addr, DefaultMetricsAddr, "metrics")
	if ln == nil {
		return err
	}
	c.stopAdmin = proxy.ServeAdmin(ln, c.registry, c.opts.MetricsToken, c.log.Named("metrics"))
	c.metricsAddr = ln.Addr().String()
	c.log.Info("metrics serving", zap.String("endpoint", c.metricsURL()), zap.Bool("token_required", c.opts.MetricsToken != ""))
	return nil
}

// stopMetrics closes the metrics listener and waits until its address is free. Start calls it
// last, so that the drain of every service can still be scraped.
func (c *Controller) stopMetrics() {
	if c.stopAdmin == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminShutdownTimeout)
	defer cancel()
	c.stopAdmin(ctx)
}

// listenOptional binds an optional listener (the gateway, metrics): none when addr is empty or
// ListenerOff. The default address may be taken (by a second FERRY_HOME's controller, say): then
// the controller runs without that listener rather than not at all; an address the user chose
// must bind. A nil listener with a nil error means "run without it".
func (c *Controller) listenOptional(addr, defaultAddr, what string) (net.Listener, error) {
	if addr == "" || addr == ListenerOff {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if addr == defaultAddr && errors.Is(err, syscall.EADDRINUSE) {
			c.log.Warn(what+" address in use; running without it", zap.String("addr", addr))
			return nil, nil
		}
		return nil, fmt.Errorf("%s listen on %s: %w", what, addr, err)
	}
	return ln, nil
}

// metricsURL is where Prometheus scrapes this controller; empty without a metrics listener.
func (c *Controller) metricsURL() string {
	if c.metricsAddr == "" {
		return ""
	}
	return "http://" + c.metricsAddr + "/metrics"
}
