package policy

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"sync/atomic"
	"time"
)

// Policy names, as written in a service's load_balancing_policy (SkyServe's names).
const (
	RoundRobin             = "round_robin"
	LeastLoad              = "least_load"
	InstanceAwareLeastLoad = "instance_aware_least_load"
	// Policies beyond SkyServe's, for LLM serving (see their files for what each does).
	PowerOfTwo      = "power_of_two"
	SessionAffinity = "session_affinity"
	PrefixAffinity  = "prefix_affinity"
	LLMAware        = "llm_aware"
	LeastTTFT       = "least_ttft"
	// Default is what an empty name selects: least_ttft, which on bench/routing beat
	// least_load (SkyServe's default and Ferry's before) on TTFT p50 and p99 both on the Azure
	// trace replay and on the multi-turn workload with long shared prefixes (docs/measurements.md,
	// "Routing quality"). Without a prompt to read, or with nothing shared, it picks as
	// least_load does.
	Default = LeastTTFT
)

// Picker chooses the replica for one request. Pick returns nil when replicas is empty. It is
// called concurrently from every request goroutine, so implementations keep no per-call state
// except atomics (and their own bounded, synchronized caches), and must retain neither req nor
// the slice, nor modify them, except req.Estimate, which a Learner fills in. req is never nil.
type Picker interface {
	Pick(req *Request, replicas []*Replica) *Replica
}

// Request is what a policy may know of one request. The proxy fills only the fields the picker
// declares it reads (see Needs); the byte slices alias the proxy's request buffers and are valid
// only during Pick.
type Request struct {
	// SessionID is the x-session-id header; empty when absent.
	SessionID []byte
	// Prompt is the raw JSON value of the body's "messages" (chat) or "prompt" (completions)
	// field; empty when the body has neither.
	Prompt []byte
	// Model is the body's "model" field, unquoted; empty when absent.
	Model []byte
	// Adapter is the number (Adapters.Lookup) plus one of the LoRA adapter Model names; 0 when
	// it names none (the base model, or a service without adapters).
	Adapter int32
	// Tokens are the prompt's token ids as the engine will see them (its /tokenize), when the
	// proxy has them; pickers match them against the engines' own reports of their caches
	// (Replica.KV) and fall back to Prompt's bytes where there are none.
	Tokens []uint32
	// chain is Tokens cut into an engine's blocks (tokenMatch), kept so that it allocates once
	// per exchange, not per request: Reset keeps it.
	chain []uint64
	// Estimate is what a Learner's Pick noted about its choice; the proxy hands it back to
	// Learn with the request's outcome. The last Pick of a retried request wins.
	Estimate Estimate
	// Now is the time of the pick when the proxy has read the clock already (it times the
	// attempt from the same reading); zero means the picker reads its own (Options.Now).
	// Reading clocks was a tenth of the proxy's own CPU per small request (issue 39).
	Now time.Time
}

// at is the time of the pick: Now, or clock's reading when the proxy gave none.
func (r *Request) at(clock func() time.Time) time.Time {
	if r.Now.IsZero() {
		return clock()
	}
	return r.Now
}

// Reset empties the request for reuse, keeping the capacity of Tokens and of what Pick derives
// from them.
func (r *Request) Reset() {
	*r = Request{Tokens: r.Tokens[:0], chain: r.chain[:0]}
}

// Estimate is a Learner's note about one pick, carried by the request until it ends.
type Estimate struct {
	// Tokens is the prompt's estimated length in tokens; Cached how many of them the picker
	// expected the chosen replica to have in its prefix cache.
	Tokens, Cached int64
	// Queued is set when the picker expected the request to wait for a batch slot.
	Queued bool
	// Precise is set when Cached came from the engine's own report of its cache (KVBlocks)
	// rather than the proxy's guess.
	Precise bool
	// AdapterLoad is set when the picker expected the replica to load the request's adapter.
	AdapterLoad bool
}

// Learner is an optional capability of a Picker: it learns from how the requests it placed
// turned out. The proxy calls Learn once for every request whose streamed 2xx response it
// relayed, from the goroutine that ends the stream. It must be cheap and safe for concurrent
// use.
type Learner interface {
	Learn(r *Replica, est Estimate, out Outcome)
}

// Outcome is how one request went, as the proxy saw it and as the engine reported it.
type Outcome struct {
	// TTFT is from sending the request to the replica's first body byte; Total to its last.
	TTFT, Total time.Duration
	// PromptTokens and CachedTokens are the answer's usage.prompt_tokens and
	// usage.prompt_tokens_details.cached_tokens (vLLM reports them with
	// stream_options.include_usage): the engine's own count of the prompt and of what its
	// prefix cache held. Negative when the answer did not say.
	PromptTokens, CachedTokens int64
}

// cachedShare returns the share of the prompt the engine reported cached, and whether it
// reported it.
func (o Outcome) cachedShare() (float64, bool) {
	if o.PromptTokens <= 0 || o.CachedTokens < 0 {
		return 0, false
	}
	return min(float64(o.CachedTokens)/float64(o.PromptTokens), 1), true
}

// Needs says which Request fields a picker reads, so that the proxy parses request bodies only
// for pickers that use them.
type Needs uint8

const (
	// NeedsSession asks for Request.SessionID.
	NeedsSession Needs = 1 << iota
	// NeedsPrompt asks for Request.Prompt and Request.Model (which seeds prompt hashes).
	NeedsPrompt
	// NeedsMetrics asks the proxy to scrape every replica's /metrics endpoint into the Replica
	// (SetMetrics). Scraping costs a request per replica per interval, so only pickers that read
	// LoadMetrics declare it.
	NeedsMetrics
	// PromptOptional, with NeedsPrompt, says the picker routes a request whose body is not a
	// JSON object (Request.Prompt empty) by load, so the proxy must not refuse it: a service
	// that is not an OpenAI API works under the default policy too.
	PromptOptional
	// WeighsQueues says the picker estimates each replica's wait for a batch slot itself (from
	// its in-flight count, learned batch size and the engine's queue), so that under learned
	// per-replica caps the proxy offers it every replica, full ones included, and holds a
	// request only when every replica is full (proxy/slots.go).
	WeighsQueues
)

// NeedsOf returns what p reads of a Request: the result of its Needs method if it has one,
// nothing otherwise.
func NeedsOf(p Picker) Needs {
	if n, ok := p.(interface{ Needs() Needs }); ok {
		return n.Needs()
	}
	return 0
}

// Options tune the pickers that need more than the snapshot.
type Options struct {
	// TargetQPSPerAccelerator maps an accelerator name to the QPS one replica with it is
	// expected to sustain (SkyServe's target_qps_per_replica map). Required, with positive
	// values, by instance_aware_least_load.
	TargetQPSPerAccelerator map[string]float64
	// Rand returns uniformly distributed random numbers for tie breaks. Inject a seeded source to
	// replay decisions; it must be safe for concurrent use if the picker is. Nil uses
	// math/rand/v2's per-goroutine generator, which is lock-free.
	Rand func() uint64

	// SessionLoadFactor is session_affinity's c in consistent hashing with bounded loads
	// (Mirrokni et al.): a replica already holding ceil(c × (in-flight + 1) / replicas) requests
	// is skipped. Zero means DefaultSessionLoadFactor; otherwise it must be at least 1.
	SessionLoadFactor float64
	// PrefixLoadFactor bounds prefix affinity in prefix_affinity and llm_aware: a replica that
	// would hold more than max(f × mean, mean + 2) requests loses its affinity (see
	// affinityBound). Zero means DefaultPrefixLoadFactor; otherwise it must be at least 1.
	PrefixLoadFactor float64
	// PrefixCacheTokens is the KV cache size, in tokens, least_ttft assumes for a replica that
	// does not announce its own in vllm:cache_config_info. Zero means
	// DefaultPrefixCacheTokens.
	PrefixCacheTokens int64
	// TTFTLoadFactor is least_ttft's load bound (see DefaultTTFTLoadFactor). Zero means the
	// default; otherwise it must be at least 1.
	TTFTLoadFactor float64
	// PrefixCacheBlocks is how many prompt blocks (64 bytes of prompt, about 16 tokens, each)
	// prefix_affinity and llm_aware remember. Zero means DefaultPrefixCacheBlocks.
	PrefixCacheBlocks int
	// MetricsStaleAfter is the age beyond which llm_aware ignores a replica's scraped metrics,
	// and least_ttft its scraped queue. Zero means DefaultMetricsStaleAfter.
	MetricsStaleAfter time.Duration
	// MaxLoRAs is how many LoRA adapters least_ttft takes a replica to run at once when its
	// engine does not report max_lora (vllm:lora_requests_info). Zero means DefaultMaxLoRAs.
	MaxLoRAs int
	// Now is llm_aware's and least_ttft's clock, for judging staleness; nil means time.Now.
	// Tests inject one.
	Now func() time.Time
}

// Defaults for Options' zero values.
const (
	// DefaultSessionLoadFactor is c = 1.25: no replica holds more than 25% above the mean, and
	// a session leaves its replica only while that replica is that far ahead. A larger c keeps
	// sessions (and their KV caches) in place longer; a smaller one balances tighter.
	DefaultSessionLoadFactor = 1.25
	// DefaultPrefixLoadFactor lets a prefix-cache hit hold 50% more requests than the mean
	// before routing gives up the hit. A cached prefix saves its prefill, but a replica that
	// takes every request sharing a system prompt queues them, which costs more (vLLM
	// production-stack users report exactly that pile-up).
	DefaultPrefixLoadFactor = 1.5
	// DefaultPrefixCacheBlocks remembers 64k blocks, about 1M tokens of distinct prompt
	// prefixes across all replicas, in about 8 MB; llm-d keeps about 31k blocks per pod.
	DefaultPrefixCacheBlocks = 1 << 16
	// DefaultMetricsStaleAfter is ten scrape intervals of 100 ms: long enough to ride out a
	// slow scrape or two, short enough that a replica whose endpoint has stopped answering is
	// judged on what the proxy knows rather than on a picture of its past.
	DefaultMetricsStaleAfter = time.Second
)

func (o Options) withDefaults() Options {
	if o.Rand == nil {
		o.Rand = rand.Uint64
	}
	if o.SessionLoadFactor == 0 {
		o.SessionLoadFactor = DefaultSessionLoadFactor
	}
	if o.PrefixLoadFactor == 0 {
		o.PrefixLoadFactor = DefaultPrefixLoadFactor
	}
	if o.PrefixCacheBlocks == 0 {
		o.PrefixCacheBlocks = DefaultPrefixCacheBlocks
	}
	if o.PrefixCacheTokens == 0 {
		o.PrefixCacheTokens = DefaultPrefixCacheTokens
	}
	if o.TTFTLoadFactor == 0 {
		o.TTFTLoadFactor = DefaultTTFTLoadFactor
	}
	if o.MetricsStaleAfter == 0 {
		o.MetricsStaleAfter = DefaultMetricsStaleAfter
	}
	if o.MaxLoRAs == 0 {
		o.MaxLoRAs = DefaultMaxLoRAs
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// validate checks the fields the LLM-aware pickers read, after defaults, naming field, value
// and rule.
func (o Options) validate() error {
	var errs []error
	if !(o.SessionLoadFactor >= 1) || math.IsInf(o.SessionLoadFactor, 0) {
		errs = append(errs, fmt.Errorf("session load factor %v: must be a number of at least 1", o.SessionLoadFactor))
	}
	if !(o.PrefixLoadFactor >= 1) || math.IsInf(o.PrefixLoadFactor, 0) {
		errs = append(errs, fmt.Errorf("prefix load factor %v: must be a number of at least 1", o.PrefixLoadFactor))
	}
	if !(o.TTFTLoadFactor >= 1) || math.IsInf(o.TTFTLoadFactor, 0) {
		errs = append(errs, fmt.Errorf("TTFT load factor %v: must be a number of at least 1", o.TTFTLoadFactor))
	}
	if o.PrefixCacheTokens < 1 {
		errs = append(errs, fmt.Errorf("prefix cache tokens %d: must be positive", o.PrefixCacheTokens))
	}
	if o.PrefixCacheBlocks < 1 {
		errs = append(errs, fmt.Errorf("prefix cache blocks %d: must be positive", o.PrefixCacheBlocks))
	}
	if o.MaxLoRAs < 1 {
		errs = append(errs, fmt.Errorf("max LoRAs %d: must be positive", o.MaxLoRAs))
	}
	if o.MetricsStaleAfter < 0 {
		errs = append(errs, fmt.Errorf("metrics stale after %v: must not be negative", o.MetricsStaleAfter))
	}
	return errors.Join(errs...)
}

// Names returns the policy names New accepts, for help text and validation messages.
func Names() []string {
	return []string{InstanceAwareLeastLoad, LeastLoad, LeastTTFT, LLMAware, PowerOfTwo, PrefixAffinity, RoundRobin, SessionAffinity}
}

// New returns the picker named name. An empty name selects the default, least_ttft.
func New(name string, opts Options) (Picker, error) {
	if name == "" {
		name = Default
	}
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("load balancing policy %s: %w", name, err)
	}
	rnd := opts.Rand
	switch name {
	case RoundRobin:
		return &roundRobin{}, nil
	case LeastLoad:
		return &leastLoad{rand: rnd}, nil
	case InstanceAwareLeastLoad:
		return newInstanceAware(opts.TargetQPSPerAccelerator, rnd)
	case PowerOfTwo:
		return &powerOfTwo{rand: rnd}, nil
	case SessionAffinity:
		return &sessionAffinity{factor: opts.SessionLoadFactor, fallback: leastLoad{rand: rnd}}, nil
	case PrefixAffinity:
		return newPrefixAffinity(opts)
	case LLMAware:
		return newLLMAware(opts)
	case LeastTTFT:
		return newLeastTTFT(opts), nil
	}
	return nil, fmt.Errorf("unknown load balancing policy %q: want one of %s", name, strings.Join(Names(), ", "))
}

var (
	_ Picker   = (*roundRobin)(nil)
	_ Picker   = (*leastLoad)(nil)
	_ Picker   = (*instanceAware)(nil)
	_ Preparer = (*instanceAware)(nil)
	_ Picker   = (*powerOfTwo)(nil)
	_ Picker   = (*sessionAffinity)(nil)
	_ Picker   = (*prefixAffinity)(nil)
	_ Picker   = (*llmAware)(nil)
	_ Picker   = (*leastTTFT)(nil)
	_ Preparer = (*leastTTFT)(nil)
	_ Learner  = (*leastTTFT)(nil)
)

// roundRobin cycles through the snapshot with one shared counter. When the snapshot changes the
// cycle continues from the counter's position, which is as fair as any restart.
type roundRobin struct {
	next atomic.Uint64
}

func (p *roundRobin) Pick(_ *Request, replicas []*Replica) *Replica {
	n := uint64(len(replicas))
	if n == 0 {
		return nil
	}
	return replicas[(p.next.Add(1)-1)%n]
}

// leastLoad picks a replica with the fewest in-flight requests (SkyServe's least_load, which
// counts requests the load balancer itself has in flight). Ties are broken uniformly at random
// by reservoir sampling in one pass, as Caddy's LeastConnSelection does, so idle replicas share
// a burst instead of the first one taking it all; no allocation, and no random number is drawn
// when the minimum is unique.
type leastLoad struct {
	rand func() uint64
}

func (p *leastLoad) Pick(_ *Request, replicas []*Replica) *Replica {
	var best *Replica
	var bestLoad int64
	ties := uint64(0)
	for _, r := range replicas {
		load := r.InFlight.Load()
		switch {
		case best == nil || load < bestLoad:
			best, bestLoad, ties = r, load, 1
		case load == bestLoad:
			ties++
			if p.rand()%ties == 0 {
				best = r
			}
		}
	}
	return best
}

// instanceAware is SkyServe's instance_aware_least_load: load is in-flight requests divided by
// the target QPS of the replica's accelerator, so an H100 that sustains 4× an L4's QPS is given
// about 4× the concurrent requests. A replica with an accelerator missing from the map is
// treated as the weakest listed one, the conservative choice. Ties break at random.
type instanceAware struct {
	targets map[string]float64
	minimum float64
	rand    func() uint64
}

func newInstanceAware(targets map[string]float64, rnd func() uint64) (*instanceAware, error) {
	if len(targets) == 0 {
		return nil, errors.New("load balancing policy instance_aware_least_load needs target QPS per accelerator")
	}
	copied := make(map[string]float64, len(targets))
	minimum := math.Inf(1)
	var errs []error
	names := make([]string, 0, len(targets))
	for name := range targets {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		qps := targets[name]
		if !(qps > 0) || math.IsInf(qps, 0) {
			errs = append(errs, fmt.Errorf("target QPS for accelerator %q is %v: must be a positive number", name, qps))
			continue
		}
		// Keys match placements ignoring case, and SkyServe also allows "A100:1".
		base, _, _ := strings.Cut(name, ":")
		copied[strings.ToLower(base)] = qps
		minimum = min(minimum, qps)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &instanceAware{targets: copied, minimum: minimum, rand: rnd}, nil
}

// Prepare resolves each replica's target QPS off the request path.
func (p *instanceAware) Prepare(replicas []*Replica) {
	for _, r := range replicas {
		r.storeCapacity(p.target(r.Accelerator))
	}
}

func (p *instanceAware) target(accelerator string) float64 {
	if qps, ok := p.targets[strings.ToLower(accelerator)]; ok {
		return qps
	}
	return p.minimum
}

func (p *instanceAware) Pick(_ *Request, replicas []*Replica) *Replica {
	var best *Replica
	var bestLoad float64
	ties := uint64(0)
	for _, r := range replicas {
		capacity := r.loadCapacity()
		if capacity == 0 {
			// Not prepared (a snapshot built without Prepare): resolve once and cache. Racing
			// stores write the same value.
			capacity = p.target(r.Accelerator)
			r.storeCapacity(capacity)
		}
		load := float64(r.InFlight.Load()) / capacity
		switch {
		case best == nil || load < bestLoad:
			best, bestLoad, ties = r, load, 1
		case load == bestLoad:
			ties++
			if p.rand()%ties == 0 {
				best = r
			}
		}
	}
	return best
}
