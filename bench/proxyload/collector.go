package main

import (
	"io"
	"net"
	"net/http"
	"sync/atomic"
)

// collector stands in for an OTLP/HTTP collector: it reads every export ferry-otlp posts and
// drops it, counting the bytes, so that the proxy's exporter does all its work while the
// collector's own (here, on the load generator's core) stays out of the proxy's CPU.
type collector struct {
	url   string
	bytes atomic.Int64
}

func startCollector() (*collector, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c := &collector{url: "http://" + ln.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		c.bytes.Add(n)
	})}
	go func() { _ = srv.Serve(ln) }() // lives as long as the driver
	return c, nil
}
