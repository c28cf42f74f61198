package replicas

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher/privnet"
)

// Probe defaults, SkyServe's, used when the task leaves a field at zero.
const (
	DefaultProbePath       = "/"
	DefaultProbeTimeout    = 15 * time.Second
	DefaultInitialDelay    = 1200 * time.Second
	maxProbeBodyDrain      = 64 << 10
	firstProbeAfterLaunch  = 250 * time.Millisecond
	probeContentTypeHeader = "Content-Type"
)

// probeState is what the manager knows from a replica's readiness probes.
type probeState struct {
	// At is when the latest probe finished; zero until this manager has probed the replica.
	At time.Time
	OK bool
	// FailingSince is when the current run of failed probes began; zero while OK.
	FailingSince time.Time
	// Err says why the latest probe failed.
	Err string
}

// record folds one probe result in.
func (s probeState) record(now time.Time, err error) probeState {
	s.At = now
	if err == nil {
		return probeState{At: now, OK: true}
	}
	if s.OK || s.FailingSince.IsZero() {
		s.FailingSince = now
	}
	s.OK = false
	s.Err = err.Error()
	return s
}

// newProbeClient is the default probe client: no proxy from the environment (replicas are
// dialled directly, a local replica in Ferry's private network with a socket from its helper)
// and no kept-alive connections, so a replica that restarted on the same address is not probed
// over a dead connection.
func newProbeClient() *http.Client {
	var direct net.Dialer
	return &http.Client{Transport: &http.Transport{
		Proxy:             nil,
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if privnet.Private(addr) {
				return privnet.DialContext(ctx, addr)
			}
			return direct.DialContext(ctx, network, addr)
		},
	}}
}

// probeReplica runs one readiness probe against addr (host:port) exactly as SkyServe does: GET
// the path, or POST PostData as JSON when it is set, with the probe's headers and timeout. Only
// HTTP 200 means ready; every other outcome is an error saying why. Errors never include
// header values, which may hold tokens.
func probeReplica(ctx context.Context, client *http.Client, addr string, p configs.Probe) error {
	timeout := time.Duration(p.TimeoutSeconds) * time.Second
	if timeout <= 0 {
		timeout = DefaultProbeTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	path := p.Path
	if path == "" {
		path = DefaultProbePath
	}
	method := http.MethodGet
	var body io.Reader
	if p.PostData != "" {
		method = http.MethodPost
		body = strings.NewReader(p.PostData)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, body)
	if err != nil {
		return fmt.Errorf("build probe request: %w", err)
	}
	if body != nil {
		req.Header.Set(probeContentTypeHeader, "application/json")
	}
	for k, v := range p.Headers {
		if strings.EqualFold(k, "Host") {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() == context.DeadlineExceeded {
			return fmt.Errorf("%s %s: no response within %v", method, path, timeout)
		}
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProbeBodyDrain))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: HTTP %d", method, path, resp.StatusCode)
	}
	return nil
}

// nextProbeDelay paces probes: fast while a replica has never answered 200 (so startup is
// noticed within a fraction of a second), doubling up to interval, then every interval.
func nextProbeDelay(prev, interval time.Duration, everReady bool) time.Duration {
	if everReady {
		return interval
	}
	next := max(prev*2, firstProbeAfterLaunch)
	return min(next, interval)
}
