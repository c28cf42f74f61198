package api

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/proxy"
)

// Standalone proxies (`ferry proxy --attach SERVICE`) follow a service through two routes:
//
//	GET  /v1/services/{name}/replicaset?after=SEQ&wait=SECONDS  long poll for the READY set
//	POST /v1/services/{name}/proxyload                         the proxy's load, every 500 ms
//
// The long poll answers at once when the service's set is not the one the proxy has (Seq
// differs from after), and otherwise when it changes or after wait seconds, so a proxy hears
// of a new set within a round trip while an idle one costs a request every half minute.

// Long-poll bounds for GET .../replicaset.
const (
	// DefaultReplicaSetWait is how long a poll without wait= is held.
	DefaultReplicaSetWait = 30 * time.Second
	// MaxReplicaSetWait caps wait=, so a poll never outlives ordinary idle timeouts between
	// the proxy and the controller.
	MaxReplicaSetWait = 60 * time.Second
)

// ReplicaSet is what an attached proxy serves: a service's READY replicas and the proxy
// configuration from its YAML. Seq identifies it: it grows with every change of either, and a
// restarted controller starts above any Seq its predecessor handed out. Seq 0 means the
// controller has not published a set for the service yet (it is still probing the replicas it
// adopted); a proxy keeps what it serves until a set with a non-zero Seq arrives.
type ReplicaSet struct {
	Service  string            `json:"service"`
	Seq      uint64            `json:"seq"`
	Backends []AttachedBackend `json:"backends"`
	Config   ProxyConfig       `json:"config"`
}

// AttachedBackend is one READY replica, as proxy.Backend.
type AttachedBackend struct {
	ID int `json:"id"`
	// Addr is host:port.
	Addr        string `json:"addr"`
	Accelerator string `json:"accelerator,omitempty"`
	Version     int    `json:"version"`
}

// ProxyConfig is the part of a service's YAML a proxy needs to serve it as the controller's own
// proxy does. TLS is not in it: a standalone proxy terminates TLS with its own certificate.
type ProxyConfig struct {
	Policy                  string             `json:"load_balancing_policy"`
	TargetQPSPerAccelerator map[string]float64 `json:"target_qps_per_accelerator,omitempty"`
	// AuthRequired makes the proxy require an API key from APIKeyHashes (hex SHA-256 of each
	// key, configs.HashAPIKey); with no hashes it rejects every request. The flag keeps "no
	// auth" apart from "auth with no keys", which an empty JSON list would blur.
	AuthRequired bool     `json:"auth_required"`
	APIKeyHashes []string `json:"api_key_hashes,omitempty"`
	// Limits, as service.limits; zero keeps the proxy's default.
	MaxRequestBodyMB      int `json:"max_request_body_mb,omitempty"`
	MaxConcurrentRequests int `json:"max_concurrent_requests,omitempty"`
	IdleTimeoutSeconds    int `json:"idle_timeout_seconds,omitempty"`
	MaxQueuedRequests     int `json:"max_queued_requests,omitempty"`
	MaxQueueWaitSeconds   int `json:"max_queue_wait_seconds,omitempty"`
	MaxConcurrentStreams  int `json:"max_concurrent_streams,omitempty"`
	MaxInFlightPerReplica int `json:"max_in_flight_per_replica,omitempty"`
	// RateLimitPerKey is service.limits.rate_limit_per_key with its default burst filled in;
	// nil means none.
	RateLimitPerKey *configs.RateLimit `json:"rate_limit_per_key,omitempty"`
	// HealthCheck is service.health_check; nil keeps the proxy's defaults.
	HealthCheck *configs.HealthCheck `json:"health_check,omitempty"`
}

// ProxyConfigFor extracts a service's proxy configuration; it is the same mapping the
// controller's own proxy uses.
func ProxyConfigFor(svc *configs.Service) ProxyConfig {
	if svc == nil {
		return ProxyConfig{}
	}
	pc := ProxyConfig{Policy: svc.LoadBalancingPolicy}
	if len(svc.ReplicaPolicy.TargetQPSPerAccelerator) > 0 {
		pc.TargetQPSPerAccelerator = maps.Clone(svc.ReplicaPolicy.TargetQPSPerAccelerator)
	}
	if a := svc.Auth; a != nil {
		pc.AuthRequired = true
		pc.APIKeyHashes = slices.Clone(a.KeyHashes)
	}
	if l := svc.Limits; l != nil {
		pc.MaxRequestBodyMB = l.MaxRequestBodyMB
		pc.MaxConcurrentRequests = l.MaxConcurrentRequests
		pc.IdleTimeoutSeconds = l.IdleTimeoutSeconds
		pc.MaxQueuedRequests = l.MaxQueuedRequests
		pc.MaxQueueWaitSeconds = l.MaxQueueWaitSeconds
		pc.MaxConcurrentStreams = l.MaxConcurrentStreams
		pc.MaxInFlightPerReplica = l.MaxInFlightPerReplica
		if r := l.RateLimitPerKey; r != nil {
			rate := *r
			pc.RateLimitPerKey = &rate
		}
	}
	if h := svc.HealthCheck; h != nil {
		hc := *h
		pc.HealthCheck = &hc
	}
	return pc
}

// ProxyLoadReport is what an attached proxy tells the controller about itself, about twice a
// second: enough for the replica manager to know when a leaving replica is idle everywhere and
// for the autoscaler to count the proxy's traffic.
type ProxyLoadReport struct {
	// ProxyID is random per proxy process, so a restarted proxy is a new one.
	ProxyID string `json:"proxy_id"`
	// Seq is the ReplicaSet the proxy serves. Until it equals the controller's, the proxy may
	// still send new requests to a replica that has left the set.
	Seq uint64 `json:"seq"`
	// InFlight maps a replica's address to the requests in flight there, streams included,
	// also for replicas that have already left the set.
	InFlight map[string]int64 `json:"in_flight,omitempty"`
	// Arrivals counts the requests the proxy received since it started.
	Arrivals uint64 `json:"arrivals"`
	// Waiting counts the requests held for want of a READY replica.
	Waiting int64 `json:"waiting"`
}

// ReplicaSetFeed holds one service's replica set for long polls: Publish moves Seq and wakes
// every Wait. The zero value is ready to use, with Seq 0 (nothing published).
type ReplicaSetFeed struct {
	mu       sync.Mutex
	seq      uint64
	backends []AttachedBackend
	// changed is closed, and replaced, when seq moves.
	changed chan struct{}
}

// Publish replaces the backends (nil keeps them: a configuration change) and moves Seq.
//
// The first Seq is the wall clock in nanoseconds, later ones count up from it, so a
// restarted controller's Seqs are above any its predecessor handed out and a proxy still on
// the old set is seen to lag.
func (f *ReplicaSetFeed) Publish(backends []AttachedBackend) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if backends != nil {
		f.backends = slices.Clone(backends)
	}
	next := f.seq + 1
	if now := time.Now().UnixNano(); f.seq == 0 && now > 0 && uint64(now) > next {
		next = uint64(now)
	}
	f.seq = next
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

// Seq returns the current Seq; 0 before the first Publish.
func (f *ReplicaSetFeed) Seq() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seq
}

// Wait returns the current set (Seq and Backends; the caller adds the rest) as soon as it is
// not the one a proxy at Seq after has: at once when a set was published and Seq differs from
// after, else once Publish moves Seq, wait passes or ctx ends, whichever is first. A Seq above
// after is the usual answer; one below means the proxy followed another controller.
func (f *ReplicaSetFeed) Wait(ctx context.Context, after uint64, wait time.Duration) ReplicaSet {
	var timeout <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	for {
		f.mu.Lock()
		rs := ReplicaSet{Seq: f.seq, Backends: slices.Clone(f.backends)}
		if rs.Backends == nil {
			rs.Backends = []AttachedBackend{}
		}
		if f.changed == nil {
			f.changed = make(chan struct{})
		}
		changed := f.changed
		f.mu.Unlock()
		if (rs.Seq != 0 && rs.Seq != after) || timeout == nil {
			return rs
		}
		select {
		case <-changed:
		case <-timeout:
			timeout = nil // answer with the set as it is now
		case <-ctx.Done():
			timeout = nil
		}
	}
}

func (s *server) replicaSet(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var after uint64
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request", "after must be a non-negative integer")
			return
		}
		after = n
	}
	wait := DefaultReplicaSetWait
	if v := q.Get("wait"); v != "" {
		secs, err := strconv.ParseFloat(v, 64)
		if err != nil || secs < 0 || math.IsNaN(secs) || math.IsInf(secs, 0) {
			writeError(w, http.StatusBadRequest, "invalid_request", "wait must be a non-negative number of seconds")
			return
		}
		wait = min(time.Duration(secs*float64(time.Second)), MaxReplicaSetWait)
	}
	rs, err := s.b.ReplicaSet(r.Context(), r.PathValue("name"), after, wait)
	if err != nil {
		if r.Context().Err() != nil {
			return // the proxy went away while it waited; nobody reads an answer
		}
		s.fail(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, rs)
}

func (s *server) proxyLoad(w http.ResponseWriter, r *http.Request) {
	var rep ProxyLoadReport
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&rep); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "decode report: "+err.Error())
		return
	}
	if rep.ProxyID == "" {
		writeError(w, http.StatusBadRequest, "invalid_request", "proxy_id must not be empty")
		return
	}
	if err := s.b.ReportProxyLoad(r.PathValue("name"), rep); err != nil {
		s.fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// ReplicaSet long-polls a service's replica set: it returns at once when the controller's Seq
// differs from after (pass 0 for the current set), else when the set changes or after wait
// (at most MaxReplicaSetWait; 0 answers at once with the current set). Cancel ctx to give up.
func (c *Client) ReplicaSet(ctx context.Context, name string, after uint64, wait time.Duration) (ReplicaSet, error) {
	q := url.Values{}
	q.Set("after", strconv.FormatUint(after, 10))
	q.Set("wait", strconv.FormatFloat(max(wait, 0).Seconds(), 'f', -1, 64))
	var rs ReplicaSet
	err := c.Do(ctx, http.MethodGet, "/v1/services/"+url.PathEscape(name)+"/replicaset?"+q.Encode(), nil, &rs)
	if err == nil && rs.Service != name {
		err = fmt.Errorf("replica set of %q answered for %q", name, rs.Service)
	}
	return rs, err
}

// ReportProxyLoad sends an attached proxy's load report.
func (c *Client) ReportProxyLoad(ctx context.Context, name string, r ProxyLoadReport) error {
	return c.Do(ctx, http.MethodPost, "/v1/services/"+url.PathEscape(name)+"/proxyload", r, nil)
}

// Apply adds this configuration of a service to a proxy's own (name, TLS, logs, metrics): the
// one mapping from a service's YAML to its proxy, used by the controller's proxies and by
// attached ones.
func (pc ProxyConfig) Apply(base proxy.ServiceConfig) proxy.ServiceConfig {
	cfg := base
	cfg.Policy = pc.Policy
	cfg.TargetQPSPerAccelerator = pc.TargetQPSPerAccelerator
	cfg.APIKeyHashes = nil
	if pc.AuthRequired {
		cfg.APIKeyHashes = append([]string{}, pc.APIKeyHashes...) // non-nil even when empty: reject all
	}
	cfg.MaxRequestBodySize = pc.MaxRequestBodyMB << 20
	cfg.MaxConcurrentRequests = pc.MaxConcurrentRequests
	cfg.IdleTimeout = time.Duration(pc.IdleTimeoutSeconds) * time.Second
	cfg.MaxQueuedRequests = pc.MaxQueuedRequests
	cfg.MaxQueueWait = time.Duration(pc.MaxQueueWaitSeconds) * time.Second
	cfg.MaxConcurrentStreams = pc.MaxConcurrentStreams
	cfg.MaxInFlightPerReplica = pc.MaxInFlightPerReplica
	cfg.RateLimit = proxy.RateLimit{}
	if r := pc.RateLimitPerKey; r != nil {
		cfg.RateLimit = proxy.RateLimit{RequestsPerSecond: r.RequestsPerSecond, Burst: r.Burst}
	}
	cfg.HealthCheck = proxy.HealthCheck{}
	if h := pc.HealthCheck; h != nil {
		cfg.HealthCheck = proxy.HealthCheckFor(h.Path, h.IntervalSeconds, h.TimeoutSeconds, h.Disabled)
	}
	return cfg
}
