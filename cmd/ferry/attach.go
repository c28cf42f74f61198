package main

import (
	"context"
	"net"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/proxy/attach"
)

// `ferry proxy --attach SERVICE`: a standalone proxy that follows a service of the controller
// in FERRY_HOME (attach.Follower); `ferry proxy --attach-all`: a standalone gateway that follows
// every service (attach.GatewayFollower). This file only wires the command line to them.

// runAttached binds the listeners, then follows the service until ctx ends and drains.
func runAttached(ctx context.Context, opts proxyOptions, log *zap.Logger) error {
	h, err := home.Default()
	if err != nil {
		return err
	}
	ln, adminLn, err := bindProxyListeners(opts)
	if err != nil {
		return err
	}
	return serveAttached(ctx, opts, h, ln, adminLn, log)
}

// serveAttached serves ln for the service opts.attach of the controller of h, or for every
// service with opts.attachAll, and metrics on adminLn unless it is nil, until ctx ends; it
// accepts nothing before the controller first answered, as until then it knows neither the
// replicas nor whether the service requires an API key. It closes both listeners.
func serveAttached(ctx context.Context, opts proxyOptions, h home.Home, ln, adminLn net.Listener, log *zap.Logger) error {
	ready := new(proxy.Readiness)
	base, stopAdmin, err := proxyBaseConfig(opts, adminLn, ready, log)
	if err != nil {
		ln.Close()
		return err
	}
	defer stopAdmin()
	// The controller's managed keys and their limits, synced with its hub (attach.SyncLoop).
	base.Tenancy = proxy.NewTenancy(nil)
	if opts.attachAll {
		return attach.NewGatewayFollower(attach.GatewayFollowerConfig{
			Base: base,
			Gateway: proxy.GatewayConfig{TLS: base.TLS, Guard: base.Guard, Logger: log.Named("gateway"), Metrics: base.Metrics,
				AccessLog: base.AccessLog, Tracing: base.Tracing},
			Listener:     ln,
			Home:         h,
			Controllers:  opts.controllers,
			DrainTimeout: opts.shutdownTimeout,
			DrainDelay:   opts.drainDelay,
			Readiness:    ready,
			Logger:       log,
		}).Start(ctx)
	}
	return attach.NewFollower(attach.FollowerConfig{
		Service:      opts.attach,
		Base:         base,
		Listener:     ln,
		Home:         h,
		Controllers:  opts.controllers,
		DrainTimeout: opts.shutdownTimeout,
		DrainDelay:   opts.drainDelay,
		Readiness:    ready,
		Logger:       log,
	}).Start(ctx)
}
