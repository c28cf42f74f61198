package main

import (
	"errors"
	"strings"
	"sync/atomic"

	"github.com/spf13/pflag"
	"github.com/valyala/fasthttp"
)

// runPassThrough is the `passthrough` subcommand, the target of that name: the least a fasthttp
// reverse proxy does, built from the same fasthttp as Ferry. It forwards each request as it
// came, round robin over the upstreams, and streams the answer back (StreamResponseBody, as
// Ferry's proxy does, so SSE passes through). No header rewriting, routing, metrics, deadlines or
// client watching. Measured beside ferry and nginx it splits Ferry's cost into what fasthttp and
// Go's runtime cost any proxy built on them (passthrough ÷ nginx) and what Ferry's own work
// adds (ferry ÷ passthrough).
func runPassThrough(args []string) error {
	listen, upstreams, err := parseBareProxyFlags(targetPass, args)
	if err != nil {
		return err
	}
	clients := make([]*fasthttp.HostClient, len(upstreams))
	for i, u := range upstreams {
		clients[i] = &fasthttp.HostClient{Addr: strings.TrimPrefix(u, "http://"), MaxConns: 1024, StreamResponseBody: true}
	}
	var next atomic.Uint64
	handler := func(ctx *fasthttp.RequestCtx) {
		c := clients[next.Add(1)%uint64(len(clients))]
		if err := c.Do(&ctx.Request, &ctx.Response); err != nil {
			ctx.Error(err.Error(), fasthttp.StatusBadGateway)
		}
	}
	return fasthttp.ListenAndServe(listen, handler)
}

// parseBareProxyFlags reads the flags of the bare proxies (passthrough, epoll): where to listen
// and the upstreams to forward to, round robin.
func parseBareProxyFlags(name string, args []string) (listen string, upstreams []string, err error) {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.StringVar(&listen, "listen", "", "loopback host:port to serve on")
	fs.StringArrayVar(&upstreams, "upstream", nil, "host:port to forward to (repeatable)")
	if err := fs.Parse(args); err != nil {
		return "", nil, err
	}
	if listen == "" || len(upstreams) == 0 {
		return "", nil, errors.New("--listen and at least one --upstream are required")
	}
	return listen, upstreams, nil
}
