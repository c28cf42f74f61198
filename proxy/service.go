// Package proxy is Ferry's data plane: it accepts client requests for one service, picks a READY
// replica with a policy.Picker, forwards the request and streams the response back.
//
// The proxy's request path takes no service-wide lock and, for a non-streaming request,
// allocates nothing a benchmark can avoid: it loads an immutable replica snapshot through an
// atomic.Pointer, bumps atomic counters, and reuses pooled per-request state. The locks it does
// take are narrow:
//
//   - one shard of the client-watch set, to join and leave it (clientwatch.go): 4×GOMAXPROCS
//     shards, so concurrent requests rarely meet there;
//   - the binder of the replica it is sent to, from the start of fasthttp's Do until fasthttp
//     has acquired a connection (upstream.go says why it cannot go);
//   - with RateLimit on and no API keys, one shard of the per-address limiter (ratelimit.go);
//   - only while requests wait for a slot under MaxInFlightPerReplica, or for a first replica,
//     the lock of the line they wait in (slots.go, queue.go);
//   - only for a body over 16 KiB or chunked, and for requests arriving while such a body is
//     being read, the process's body budget (budget.go), at the headers and in the handler.
//
// Opening or closing an upstream connection, not a request, takes its replica's
// connection-set lock (upstreamconn.go); accepting or closing a client connection takes the
// Guard's per-address lock, unless the per-address cap is off (guard.go). Pickers are
// the policy package's: least_load and the other policies that read only counters lock
// nothing, while prefix_affinity and llm_aware hold their service's prefix index for about a
// microsecond per pick (policy/prefix.go), and least_ttft takes each replica's index lock for
// a few lookups and the chosen one's for its update, and a replica's learning lock once per
// streamed answer (Learn) and once per new scrape (policy/leastttft.go).
//
// Membership changes (SetBackends) build a new snapshot and swap it in; requests already
// running keep the replica and upstream client they picked until their stream ends.
package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ferryserve/ferry/policy"
)

// Defaults for ServiceConfig's zero values.
const (
	// DefaultMaxRequestBodySize bounds a buffered request body. 32 MiB holds any chat or
	// completion request (a 128k-token prompt is well under 1 MiB of JSON) with room for
	// base64 images, while keeping a hostile client from making the proxy buffer gigabytes.
	DefaultMaxRequestBodySize = 32 << 20

	// DefaultIdleTimeout is how long an upstream connection may go without a byte in either
	// direction before the proxy gives up on it, and how long a client may refuse to accept
	// response bytes. It is a per-read deadline, not a whole-request timeout, so a stream of any
	// length lives as long as tokens keep coming. It must still cover the silent wait before
	// the headers of a non-streaming completion: 5 minutes is a 4k-token answer at 15
	// tokens/s, while a wedged replica or vanished client releases its slot in bounded time.
	DefaultIdleTimeout = 5 * time.Minute

	// DefaultMaxAttempts is SkyServe's retry budget (3 attempts on connection errors), but
	// Ferry always retries on a different replica.
	DefaultMaxAttempts = 3

	// DefaultMaxQueuedRequests bounds the requests held while a service has no ready replica
	// (see hold.go). A held request costs a goroutine, its buffered body and a pooled exchange,
	// so a thousand is a few tens of MiB at worst, while covering the burst that wakes a
	// service scaled to zero.
	DefaultMaxQueuedRequests = 1000

	// DefaultMaxQueueWait is how long one request is held for a replica. A cold start from
	// zero (provision a VM, pull the image, load the weights into vLLM) takes minutes; a client
	// that asked a scaled-to-zero service is better served late than refused.
	DefaultMaxQueueWait = 5 * time.Minute
)

// Server-side limits that are not per service.
const (
	// defaultRequestReadTimeout bounds reading one request's headers and body, so slow-loris
	// clients cannot hold connections. It never covers the response, whose length is unbounded.
	defaultRequestReadTimeout = 60 * time.Second
	// keepAliveIdleTimeout is how long an idle client connection stays open between requests
	// (nginx's keepalive_timeout default).
	keepAliveIdleTimeout = 75 * time.Second
	// readBufferSize is per connection and also the largest request header accepted.
	readBufferSize = 8 << 10
	// shutdownPoll is how often Shutdown re-checks in-flight requests.
	shutdownPoll = 10 * time.Millisecond
)

// Backend is one READY replica as the control plane hands it to the proxy. The JSON names are
// those of the replica set attached proxies poll (proxy/attach), so the controller's proxy and
// attached ones are handed the same values.
type Backend struct {
	ID int `json:"id"`
	// Addr is host:port, without a scheme.
	Addr        string `json:"addr"`
	Accelerator string `json:"accelerator,omitempty"`
	Version     int    `json:"version"`
}

// ServiceConfig configures one service's proxy. Zero values select the documented defaults.
type ServiceConfig struct {
	// Name is the service name, used in error messages and logs. Required.
	Name string
	// Policy is the load-balancing policy name (policy.New); empty means DefaultPolicy.
	Policy string
	// TargetQPSPerAccelerator feeds instance_aware_least_load.
	TargetQPSPerAccelerator map[string]float64
	// Adapters names the service's LoRA adapters, which requests name as their model; the
	// proxy also learns them from the replicas' /v1/models (an id with a parent) and
	// vllm:lora_requests_info. MaxLoRAs is the adapters a replica runs at once when its engine
	// does not report it (policy.Options.MaxLoRAs; 0 means policy's default).
	Adapters []string
	MaxLoRAs int
	// IgnoreAdapters routes requests as if they named no adapter: only to measure what
	// adapter-aware routing brings.
	IgnoreAdapters bool
	// LoadAdapters, when set, are adapters the proxy registers on a replica at their first
	// request there (vLLM's /v1/load_lora_adapter), name → path; MaxLoadedAdapters bounds
	// those registered per replica, the least recently used unloaded beyond it
	// (adapterload.go).
	LoadAdapters      map[string]string
	MaxLoadedAdapters int
	// APIKeyHashes, when non-nil, makes the service require an API key: the hex SHA-256 of
	// each accepted key (configs.HashAPIKey). A non-nil empty slice rejects every request.
	APIKeyHashes []string
	// MaxConcurrentRequests, when positive, caps requests in flight; more get 429 with
	// Retry-After. The cap is soft by the few requests admitted between check and count.
	MaxConcurrentRequests int
	// MaxConcurrentStreams, when positive, caps streaming requests in flight (a body whose
	// "stream" is not false); more get 429, while requests that do not stream pass. Streams
	// hold a replica's batch slot for their whole generation, so this keeps a few clients'
	// long streams from taking every slot.
	MaxConcurrentStreams int
	// RateLimit, when enabled, admits each API key's requests (each client address's without
	// APIKeyHashes) through a token bucket; more get 429 with Retry-After (ratelimit.go).
	RateLimit RateLimit
	// KVEvents, when set, gives the index each replica's engine reports its KV cache to (its
	// KV-cache events): a picker that reads prompts then matches their token ids, which the
	// proxy asks the engine's /tokenize for (tokenize.go). Nil: prompts are matched by bytes.
	KVEvents KVIndexes
	// Tenancy, when set, is the process's managed API keys and their ledger (tenancy.go).
	Tenancy *Tenancy
	// TLS, when set, makes Serve terminate TLS on every listener (see LoadTLS).
	TLS *tls.Config
	// Guard applies the process's ClientLimits (connections, request bodies being read) to this
	// service's clients together with every other listener's; nil shares the process default.
	Guard *Guard
	// RequestReadTimeout bounds reading one request's headers and body, so slow-loris clients
	// cannot hold connections; it never covers the response. Default 60 s.
	RequestReadTimeout time.Duration
	// Logger receives warnings about upstream failures; nil discards them. The proxy never logs
	// request bodies or the Authorization header.
	Logger *zap.Logger
	// MaxRequestBodySize is the largest request body accepted, in bytes; larger requests get
	// 413. Default DefaultMaxRequestBodySize.
	MaxRequestBodySize int
	// IdleTimeout is the per-read and per-write idle deadline on upstream connections, and the
	// per-write deadline on client connections. Default DefaultIdleTimeout (see there why).
	IdleTimeout time.Duration
	// MaxAttempts bounds how many replicas one request is tried on. Retries happen only when the
	// request provably never reached a replica (dial error, or its connection pool was full),
	// and always go to a replica not tried yet. Default DefaultMaxAttempts.
	MaxAttempts int
	// MaxInFlightPerReplica caps the requests this proxy has in flight on each replica:
	// beyond it requests wait in the proxy and go to the first replica that frees a slot (late
	// binding, slots.go), within MaxQueuedRequests and MaxQueueWait, so that they no longer
	// queue inside one replica while another frees a slot sooner. Zero (the default) caps each
	// replica at its batch size as learned from its engine metrics, which means scraping them
	// (every 250 ms unless a picker or ScrapeEngineMetrics wants them more often), and never
	// refuses a request for it; a positive value is a fixed cap, beyond which requests that
	// cannot wait get 503; a negative value turns late binding off.
	MaxInFlightPerReplica int
	// ReplicaShares is how many proxies share each replica (attached proxies: the controller
	// tells them); 0 or 1 means this proxy alone. A configured cap becomes this proxy's floor
	// share, at least 1, so N proxies never exceed it together; a learned batch size the
	// rounded-up share, as a learned cap only delays requests and the engine queues the rest.
	ReplicaShares int

	// Scale from zero.

	// MaxQueuedRequests is how many requests may wait at once for a replica while the service
	// has none ready, as Knative's activator holds them: a service scaled to zero answers its
	// first requests late instead of refusing them. More get 503 with Retry-After. Zero means
	// DefaultMaxQueuedRequests; a negative value disables holding (503 at once).
	MaxQueuedRequests int
	// MaxQueueWait is how long one request waits for a replica before it gets 503 with
	// Retry-After. Zero means DefaultMaxQueueWait.
	MaxQueueWait time.Duration
	// OnColdRequest, when set, is called when a request arrives while the service has no ready
	// replica, whether it is then held or refused, at most once per 100 ms (coldRequestEvery),
	// so a controller can start scaling from zero now instead of at its next tick. It runs on
	// its own goroutine, so a slow hook never delays a request; it should still return quickly.
	OnColdRequest func()
	// ScrapeEngineMetrics makes the service scrape its replicas' engine metrics (queue, batch,
	// KV-cache use; see ReplicaLoad) even when its load-balancing policy does not need them, for
	// an autoscaler that does.
	ScrapeEngineMetrics bool
	// HealthCheck configures the proxy's own checks that take a hung replica out of rotation
	// within seconds, without the controller (healthcheck.go).
	HealthCheck HealthCheck

	// Observability.

	// Metrics records this service's Prometheus metrics; one Metrics is shared by every Service
	// of a process. Nil records none, at the cost of a nil check per hook.
	Metrics *Metrics
	// AccessLog receives one Info line per finished request, sampled per service (each second
	// the first 100 lines, then every 100th) and level-checked before any field is built; nil
	// logs none. Lines never carry headers, query strings or bodies.
	AccessLog *zap.Logger
	// Tracing records a span tree per request and sends the replicas W3C trace context
	// (tracing.go); one Tracing serves a process. Nil records none, at the cost of a nil
	// check per hook.
	Tracing *Tracing
}

func (c ServiceConfig) withDefaults() ServiceConfig {
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.MaxRequestBodySize == 0 {
		c.MaxRequestBodySize = DefaultMaxRequestBodySize
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.RequestReadTimeout == 0 {
		c.RequestReadTimeout = defaultRequestReadTimeout
	}
	if c.MaxQueuedRequests == 0 {
		c.MaxQueuedRequests = DefaultMaxQueuedRequests
	}
	if c.MaxQueueWait == 0 {
		c.MaxQueueWait = DefaultMaxQueueWait
	}
	c.HealthCheck = c.HealthCheck.withDefaults()
	return c
}

func (c ServiceConfig) validate() error {
	var errs []error
	errs = append(errs, c.HealthCheck.validate()...)
	if c.Name == "" {
		errs = append(errs, errors.New("name: must not be empty"))
	}
	if c.MaxRequestBodySize < 0 {
		errs = append(errs, fmt.Errorf("max request body size: %d must not be negative", c.MaxRequestBodySize))
	}
	if c.IdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("idle timeout: %v must not be negative", c.IdleTimeout))
	}
	if c.MaxAttempts < 0 {
		errs = append(errs, fmt.Errorf("max attempts: %d must not be negative", c.MaxAttempts))
	}
	if c.MaxConcurrentRequests < 0 {
		errs = append(errs, fmt.Errorf("max concurrent requests: %d must not be negative", c.MaxConcurrentRequests))
	}
	if c.MaxQueueWait < 0 {
		errs = append(errs, fmt.Errorf("max queue wait: %v must not be negative", c.MaxQueueWait))
	}
	if c.MaxConcurrentStreams < 0 {
		errs = append(errs, fmt.Errorf("max concurrent streams: %d must not be negative", c.MaxConcurrentStreams))
	}
	if r := c.RateLimit; r.RequestsPerSecond < 0 || math.IsNaN(r.RequestsPerSecond) || math.IsInf(r.RequestsPerSecond, 0) || r.Burst < 0 {
		errs = append(errs, fmt.Errorf("rate limit: %g requests per second, burst %d: want a finite rate ≥ 0 and a burst ≥ 0", r.RequestsPerSecond, r.Burst))
	}
	return errors.Join(errs...)
}

// DefaultPolicy is the load-balancing policy of a service that names none, for packages that
// report it without importing policy.
const DefaultPolicy = policy.Default

// Service proxies one service's traffic to its READY replicas. Its methods are safe for
// concurrent use.
type Service struct {
	cfg    ServiceConfig
	log    *zap.Logger
	picker policy.Picker
	needs  policy.Needs
	// learner is the picker as a policy.Learner, fed each streamed answer's TTFT; nil when it
	// learns nothing.
	learner policy.Learner
	// adapters numbers the LoRA adapters requests may name (policy/adapters.go).
	adapters *policy.Adapters
	// prefill is the pool of prefill replicas of a disaggregated service (pd.go).
	prefill prefillState
	keys    *apiKeys // nil: no auth
	// tenancy is cfg.Tenancy: managed keys, their limits and usage (tenancy.go); nil without.
	tenancy *Tenancy
	errs    errorBodies
	front   frontend
	// obs records metrics and the access log (metrics.go).
	obs observability

	// limiter applies RateLimit; nil without one. authFailures limits failed API key attempts
	// per address (auth.go); nil without keys. streams counts admitted streaming requests while
	// MaxConcurrentStreams is set (limits.go).
	limiter      *rateLimiter
	authFailures *rateLimiter
	streams      atomic.Int64

	// snap is the current replica set; the request path only ever loads it.
	snap atomic.Pointer[snapshot]
	// inflight counts requests from pick to the end of their response stream.
	inflight atomic.Int64
	// slots holds requests beyond MaxInFlightPerReplica (slots.go); nil without the cap.
	// Without it, held is the line requests held for a first replica wait in (queue.go).
	slots *slotQueue
	held  waitLine
	// classify, when set (tests), sets a request's priority class and fair-share tenant
	// (exchange.class, exchange.tenant) once it has been described. Otherwise a managed key
	// sets them (admitTenant) and every other request is standard and anonymous. It is set
	// before the service serves and never changed after.
	classify func(ctx *fasthttp.RequestCtx, ex *exchange)
	// arrivals counts requests that reached routing (Arrivals); waiting counts those held for
	// a replica (Waiting).
	arrivals atomic.Uint64
	waiting  atomic.Int64
	// lastCold is when OnColdRequest was last called, in unix nanoseconds.
	lastCold atomic.Int64
	// tokenizeNext turns the replicas asked for token ids (tokenize.go).
	tokenizeNext atomic.Uint32
	// kvForgotten lets Shutdown release the engines' KV reports once (forgetKV).
	kvForgotten sync.Once
	// exchanges pools per-request state, including the upstream request and response.
	exchanges sync.Pool
	// clientWatch holds the exchanges whose clients are watched for leaving (clientwatch.go).
	clientWatch clientWatch

	// dial opens a raw connection to a replica; tests swap it for in-memory listeners before
	// the first SetBackends.
	dial func(addr string) (net.Conn, error)

	// scraper polls replicas' /metrics for pickers that score on engine load
	// (policy.NeedsMetrics), the autoscaler, and learned late-binding caps; nil when none
	// wants them. It is made on the first SetBackends, so it uses the dial function tests
	// install.
	scraper *scraper
	// health checks the replicas and ejects hung ones (healthcheck.go); made on the first
	// SetBackends, like the scraper.
	health *healthChecker

	// draining are clients SetBackends retired while requests still used them, so Busy can
	// count streams on a replica that has left the snapshot. Guarded by mu; pruned lazily.
	draining []*hostClient
	// lastModels are the model ids the replicas of the last snapshot that had any reported, so
	// a service scaled to zero stays routable by model on a gateway (see Models).
	lastModels atomic.Pointer[[]string]

	// onModels is called when Models may have changed. It is set when the service joins a
	// Gateway; only then does the proxy ask replicas for their models.
	onModels modelsHook
	// stopped is closed by Shutdown, ending background work such as model discovery.
	stopped  chan struct{}
	stopOnce sync.Once
	// closeConns makes every response close its connection: a Handover retired the service
	// (handover.go), or the proxy is draining before it stops (CloseConnections).
	closeConns atomic.Bool

	// mu serializes SetBackends (and watchModels, Busy); the request path never takes it.
	mu sync.Mutex
}

// snapshot is an immutable replica set. replicas, clients and caps are parallel: clients[i]
// talks to replicas[i], and caps[i] is what late binding learned about it (slots.go). Nothing in
// a published snapshot is ever written again, except that an empty snapshot's ready channel is
// closed once.
type snapshot struct {
	replicas []*policy.Replica
	clients  []*hostClient
	caps     []*learnedCap
	backends []Backend
	// pick is what the picker chooses from: replicas minus those the health checks ejected
	// (healthcheck.go), the same slice when none is; pickCaps is parallel to it.
	pick     []*policy.Replica
	pickCaps []*learnedCap
	// ready is set only in a snapshot without replicas: SetBackends closes it when it publishes
	// one with replicas, waking the requests held for one (hold.go). Consecutive empty
	// snapshots share it.
	ready chan struct{}
}

// clientFor finds the upstream client of a replica the picker returned. A linear scan over a
// service's replicas (tens, rarely hundreds) is cheaper than hashing and needs no extra state.
func (s *snapshot) clientFor(r *policy.Replica) *hostClient {
	for i, candidate := range s.replicas {
		if candidate == r {
			return s.clients[i]
		}
	}
	return nil
}

// carryOver returns backend b's replica, upstream client and learned cap for the next
// snapshot: the old snapshot's where b's address was in it, new ones where not. The client
// follows the address; the replica and its cap only the same id, accelerator and version,
// since pickers read identity fields without locks: a relabelled replica (same address, new id
// or version) gets a fresh Replica instead of a mutated one. Called with s.mu held.
func (s *Service) carryOver(b Backend, old *snapshot, oldIndex map[string]int) (*policy.Replica, *hostClient, *learnedCap) {
	var replica *policy.Replica
	var client *hostClient
	var learned *learnedCap
	if i, ok := oldIndex[b.Addr]; ok {
		client = old.clients[i]
		if r := old.replicas[i]; r.ID == b.ID && r.Accelerator == b.Accelerator && r.Version == b.Version {
			replica, learned = r, old.caps[i]
		}
	}
	if client == nil {
		client = s.newHostClient(b.Addr)
		if s.cfg.KVEvents != nil {
			client.kv = s.cfg.KVEvents.For(b.Addr) // matched by Forget when the address leaves
		}
		if s.onModels.Load() != nil || s.needs&policy.NeedsPrompt != 0 {
			// For a gateway's routing table, and for the LoRA adapters a picker that reads
			// the request's model routes by.
			go s.fetchModels(client)
		}
	}
	s.trackReplica(client, b.ID)
	if replica == nil {
		replica, learned = &policy.Replica{ID: b.ID, Addr: b.Addr, Accelerator: b.Accelerator, Version: b.Version}, &learnedCap{}
		replica.SetKV(client.kv)
	}
	return replica, client, learned
}

// NewService validates cfg and returns a Service with no replicas: until SetBackends gives it
// some, it holds requests (MaxQueuedRequests, MaxQueueWait), or answers 503 at once when holding
// is disabled, like SkyServe with no READY replica.
func NewService(cfg ServiceConfig) (*Service, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("proxy config for service %q: %w", cfg.Name, err)
	}
	picker, err := policy.New(cfg.Policy, policy.Options{TargetQPSPerAccelerator: cfg.TargetQPSPerAccelerator, MaxLoRAs: cfg.MaxLoRAs})
	if err != nil {
		return nil, fmt.Errorf("proxy config for service %q: %w", cfg.Name, err)
	}
	keys, err := newAPIKeys(cfg.APIKeyHashes)
	if err != nil {
		return nil, fmt.Errorf("proxy config for service %q: %w", cfg.Name, err)
	}
	if keys != nil {
		keys.managed = cfg.Tenancy
	}
	s := &Service{
		keys:     keys,
		tenancy:  cfg.Tenancy,
		cfg:      cfg,
		log:      sampledLogger(cfg.Logger).With(zap.String("service", cfg.Name)),
		picker:   picker,
		needs:    policy.NeedsOf(picker),
		errs:     newErrorBodies(cfg.Name, cfg.MaxRequestBodySize).withHoldBodies(cfg.Name, cfg.MaxQueuedRequests, cfg.MaxQueueWait),
		dial:     defaultDial,
		stopped:  make(chan struct{}),
		slots:    newSlotQueue(cfg.MaxInFlightPerReplica, cfg.ReplicaShares),
		obs:      newObservability(cfg),
		adapters: policy.NewAdapters(),
	}
	s.adapters.Add(cfg.Adapters...)
	s.learner, _ = picker.(policy.Learner)
	s.errs = s.errs.withLimitBodies(cfg.Name, cfg.RateLimit, keys != nil, cfg.MaxConcurrentStreams)
	s.limiter = newRateLimiter(cfg.RateLimit, len(cfg.APIKeyHashes))
	if keys != nil {
		s.authFailures = newAuthFailureLimiter()
	}
	s.clientWatch.init()
	s.exchanges.New = func() any { return &exchange{svc: s, watchShard: s.clientWatch.shardIndex()} }
	s.snap.Store(&snapshot{ready: make(chan struct{})})
	s.front.server = newServer(s.serveRequest, s.requestError, s.headerReceived, cfg.MaxRequestBodySize, cfg.RequestReadTimeout, s.log)
	s.front.guard, s.front.log = guardOr(cfg.Guard), s.log
	return s, nil
}

// InFlight returns the number of requests picked but whose response has not finished streaming.
func (s *Service) InFlight() int64 { return s.inflight.Load() }

// Backends returns the current replica set, in the order SetBackends received it.
func (s *Service) Backends() []Backend {
	return slices.Clone(s.snap.Load().backends)
}

// SetBackends replaces the replica set. It builds a new snapshot and publishes it atomically, so
// a request sees either the old set or the new one, never a mix.
//
// A backend whose Addr is unchanged keeps its upstream client (warm connections) and, if its
// identity is unchanged too, its *policy.Replica, so in-flight counts carry over. A removed
// backend's client is closed only once its last in-flight request has finished streaming: a
// scale-down or rollout never cuts a stream (Busy tells when it has). Backends with an invalid
// or duplicate Addr are skipped and logged. The first set with a replica after none releases
// the requests held meanwhile.
func (s *Service) SetBackends(bs []Backend) {
	s.mu.Lock()
	defer s.mu.Unlock()

	old := s.snap.Load()
	oldIndex := make(map[string]int, len(old.clients))
	for i, c := range old.clients {
		oldIndex[c.addr] = i
	}

	next := &snapshot{
		replicas: make([]*policy.Replica, 0, len(bs)),
		clients:  make([]*hostClient, 0, len(bs)),
		caps:     make([]*learnedCap, 0, len(bs)),
		backends: make([]Backend, 0, len(bs)),
	}
	kept := make(map[string]bool, len(bs))
	for _, b := range bs {
		if err := validateAddr(b.Addr); err != nil {
			s.log.Error("skipping replica with an invalid address", zap.Int("replica_id", b.ID), zap.String("addr", b.Addr), zap.Error(err))
			continue
		}
		if kept[b.Addr] {
			s.log.Error("skipping replica with a duplicate address", zap.Int("replica_id", b.ID), zap.String("addr", b.Addr))
			continue
		}
		kept[b.Addr] = true

		replica, client, learned := s.carryOver(b, old, oldIndex)
		next.replicas = append(next.replicas, replica)
		next.clients = append(next.clients, client)
		next.caps = append(next.caps, learned)
		next.backends = append(next.backends, b)
	}
	if p, ok := s.picker.(policy.Preparer); ok {
		p.Prepare(next.replicas)
	}
	s.updateHealthLocked(next)
	next.ready = readySignal(old, next)
	s.rememberModels(old)
	s.snap.Store(next)
	if len(old.replicas) == 0 && len(next.replicas) > 0 {
		close(old.ready) // after the Store: a woken request must find the replicas
	}
	if s.slots != nil {
		s.slots.grant(s) // a new replica has free slots
	}
	if s.scraper == nil {
		s.scraper = s.newScraper()
	}
	if s.scraper != nil {
		s.scraper.update(next.replicas, next.caps) // a no-op after Shutdown closed it
	}

	s.pruneDraining()
	for _, c := range old.clients {
		if !kept[c.addr] {
			if f, ok := s.cfg.KVEvents.(kvForgetter); ok {
				f.Forget(c.addr)
			}
			c.retire()
			if c.active.Load() > 0 {
				s.draining = append(s.draining, c)
			}
		}
	}
	s.modelsChanged()
}

// Service log sampling: each second the first serviceLogFirst lines of one message, then every
// serviceLogThereafter-th. A replica failing under a flood of requests (its connection pool
// full, say) would otherwise write a warning per request.
const (
	serviceLogFirst      = 10
	serviceLogThereafter = 100
)

func sampledLogger(l *zap.Logger) *zap.Logger {
	return l.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return newSampler(c, time.Second, serviceLogFirst, serviceLogThereafter)
	}))
}

func validateAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "" || port == "" {
		return fmt.Errorf("address %q: want host:port", addr)
	}
	return nil
}

// ErrClosed is returned by Serve after Shutdown.
var ErrClosed = errors.New("proxy: service is shut down")

// Serve accepts connections on ln and serves them with Handler until Shutdown, then returns nil.
// It may be called for several listeners.
func (s *Service) Serve(ln net.Listener) error {
	return s.front.serve(ln, s.cfg.IdleTimeout, s.cfg.TLS)
}

// Shutdown stops accepting connections, tells keep-alive clients to close, and waits until every
// in-flight request, streams included, has finished or ctx ends. Requests held for a replica
// get 503 at once rather than waiting out MaxQueueWait. After the drain it closes the idle
// upstream connections. On return it drops the service's metrics series.
func (s *Service) Shutdown(ctx context.Context) error {
	defer s.releaseMetrics()
	defer s.forgetKV()
	s.stopOnce.Do(func() { close(s.stopped) })
	s.mu.Lock()
	if s.scraper != nil {
		s.scraper.close()
	}
	s.mu.Unlock()
	s.stopHealthChecks()
	if err := s.front.shutdown(ctx); err != nil {
		return err
	}

	ticker := time.NewTicker(shutdownPoll)
	defer ticker.Stop()
	for s.inflight.Load() > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("shutting down service %q with %d requests in flight: %w", s.cfg.Name, s.inflight.Load(), ctx.Err())
		case <-ticker.C:
		}
	}
	for _, c := range s.snap.Load().clients {
		c.hc.CloseIdleConnections()
	}
	return nil
}

// forgetKV lets go of the engines' KV reports of every address the service routes to
// (kvForgetter), once: the service is shut down.
func (s *Service) forgetKV() {
	f, ok := s.cfg.KVEvents.(kvForgetter)
	if !ok {
		return
	}
	s.kvForgotten.Do(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.snap.Load().clients {
			f.Forget(c.addr)
		}
	})
}

// fasthttpLogger sends fasthttp's own messages (mostly clients misbehaving) to debug level, so a
// client flood cannot flood the logs. An error in them is replaced by its kind: fasthttp quotes
// the offending header line or value in its parse errors, and that may be an API key.
type fasthttpLogger struct{ log *zap.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	if ce := l.log.Check(zap.DebugLevel, "http server"); ce != nil {
		safe := make([]any, len(args))
		for i, a := range args {
			if err, ok := a.(error); ok {
				a = errorKind(err)
			}
			safe[i] = a
		}
		ce.Write(zap.String("detail", fmt.Sprintf(format, safe...)))
	}
}

// errorKind says what went wrong reading a request without quoting it: the text of errors known
// to carry no request content, a generic kind for the others.
func errorKind(err error) string {
	var small *fasthttp.ErrSmallBuffer
	var op *net.OpError
	switch {
	case isTimeout(err):
		return "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed mid-request"
	case errors.As(err, &small):
		return "request headers too large"
	case errors.As(err, &op), errors.Is(err, fasthttp.ErrBodyTooLarge), errors.Is(err, fasthttp.ErrDuplicateContentLength),
		errors.Is(err, fasthttp.ErrUnsupportedTransferEncoding), errors.Is(err, fasthttp.ErrGetOnly):
		return err.Error()
	default:
		return "malformed request (not shown: it may quote request headers)"
	}
}

// CloseConnections makes every response from now on close its client connection. A proxy
// that is about to stop calls it as it turns unready (Readiness.DrainFor): a keep-alive client
// then reconnects, through its load balancer, to another proxy, instead of finding its idle
// connection closed under it at the shutdown, which fails a POST its HTTP client may not retry.
func (s *Service) CloseConnections() { s.closeConns.Store(true) }
