package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
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
	if addr == "" || addr == ListenerOff {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if addr == DefaultMetricsAddr && errors.Is(err, syscall.EADDRINUSE) {
			c.log.Warn("metrics address in use; running without the metrics listener", zap.String("addr", addr))
			return nil
		}
		return fmt.Errorf("metrics listen on %s: %w", addr, err)
	}
	c.admin = proxy.NewAdminServer(c.registry, c.log.Named("metrics"))
	c.metricsAddr = ln.Addr().String()
	c.adminDone = make(chan struct{})
	go func() {
		defer close(c.adminDone)
		if err := c.admin.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			c.log.Error("metrics listener stopped", zap.Error(err))
		}
	}()
	c.log.Info("metrics serving", zap.String("endpoint", c.metricsURL()))
	return nil
}

// stopMetrics closes the metrics listener and waits until its address is free. Start calls it
// last, so that the drain of every service can still be scraped.
func (c *Controller) stopMetrics() {
	if c.admin == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminShutdownTimeout)
	defer cancel()
	if err := c.admin.Shutdown(ctx); err != nil {
		_ = c.admin.Close()
	}
	<-c.adminDone // Serve closes the listener itself when Shutdown came first
}

// metricsURL is where Prometheus scrapes this controller; empty without a metrics listener.
func (c *Controller) metricsURL() string {
	if c.metricsAddr == "" {
		return ""
	}
	return "http://" + c.metricsAddr + "/metrics"
}
