package replicasim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// shutdownGrace bounds how long Serve waits for in-flight requests after its context ends.
// In-flight sequences stop sleeping once shutdown begins, so this is only reached by clients
// that do not read their responses.
const shutdownGrace = 5 * time.Second

// Server is one simulated replica. It is safe for concurrent use; build it with NewServer.
type Server struct {
	cfg       Config
	modelJSON []byte       // the served model name as a JSON string, spliced into responses
	modelSeed uint64       // seeds the prefix-cache hash chain, as vLLM seeds it per model
	readyAt   atomic.Int64 // unix nanoseconds when the simulated model has loaded
	faults    atomic.Pointer[activeFaults]
	exit      func(int)

	sched    *scheduler
	cache    *prefixCache
	metrics  *metrics
	kvEvents *kvPublisher // nil unless Config.KVEvents is set
	lora     *loraSet     // nil unless LoRA adapters are enabled
	// kvBlocksUsed is the number of KV blocks held by running sequences (prompt plus generated
	// tokens, 16 per block); over KVCacheBlocks it is vllm:kv_cache_usage_perc.
	kvBlocksUsed atomic.Int64
	// genBlocksUsed is the part of kvBlocksUsed that holds generated tokens: blocks the prefix
	// cache cannot use while their sequences run.
	genBlocksUsed atomic.Int64
	// completed counts finished completions, for ExitAfter.
	completed atomic.Int64
	// prefilling is the uncached prompt tokens being prefilled now (PrefillInterference).
	prefilling atomic.Int64
	// engineIDJSON names this replica's engine in its prefill answers' kv_transfer_params.
	engineIDJSON []byte

	rngMu sync.Mutex
	rng   *rand.Rand

	stopOnce sync.Once
	stopping chan struct{} // closed when shutdown begins: sequences stop sleeping
	stopped  atomic.Bool

	scratch sync.Pool // *scratch
}

// NewServer builds a replica from cfg. It does not fail: fields that Validate would reject are
// replaced by their defaults, so a test can fill in only what it cares about. The startup delay
// counts from here.
func NewServer(cfg Config) *Server {
	def := DefaultConfig()
	if cfg.Engine != EngineTGI {
		cfg.Engine = EngineVLLM
	}
	if cfg.Signals != SignalsBasic {
		cfg.Signals = SignalsFull
	}
	if cfg.Model == "" {
		cfg.Model = def.Model
	}
	if cfg.MaxNumSeqs < 1 {
		cfg.MaxNumSeqs = def.MaxNumSeqs
	}
	cfg.MaxWaiting = max(cfg.MaxWaiting, 0)
	if cfg.MaxTokens < 1 {
		cfg.MaxTokens = def.MaxTokens
	}
	if cfg.KVCacheBlocks < 1 {
		cfg.KVCacheBlocks = def.KVCacheBlocks
	}
	for _, d := range []*time.Duration{&cfg.TTFT, &cfg.PrefillPerToken, &cfg.ITL, &cfg.ITLPerSeq, &cfg.StartupDelay} {
		*d = max(*d, 0)
	}
	if cfg.KVEventsEncoding != KVEventsArray {
		cfg.KVEventsEncoding = KVEventsMap
	}
	f := cfg.faults().clamped()
	cfg.ErrorRate, cfg.HangRate, cfg.SlowRate, cfg.SlowDelay, cfg.FlapPeriod = f.ErrorRate, f.HangRate, f.SlowRate, f.SlowDelay, f.FlapPeriod

	modelJSON, _ := json.Marshal(cfg.Model) // a string always marshals
	s := &Server{
		cfg:       cfg,
		modelJSON: modelJSON,
		modelSeed: xxhash.Sum64String(cfg.Model),
		exit:      cfg.ExitFunc,
		sched:     newScheduler(cfg.MaxNumSeqs, cfg.MaxWaiting),
		rng:       rand.New(rand.NewPCG(uint64(cfg.Seed), 0x6665727279)), // "ferry"
		stopping:  make(chan struct{}),
	}
	s.engineIDJSON, _ = json.Marshal(fmt.Sprintf("replicasim-%d-%d", cfg.Seed, time.Now().UnixNano()))
	readyAt := time.Now().Add(cfg.StartupDelay)
	s.readyAt.Store(readyAt.UnixNano())
	s.setFaults(f, readyAt) // flapping counts from the end of the startup delay
	if s.exit == nil {
		s.exit = os.Exit
	}
	s.metrics = newMetrics(cfg.Engine, cfg.Signals, cfg.Model, cfg.KVCacheBlocks,
		func() float64 { return float64(s.sched.runningGauge.Load()) },
		func() float64 { return float64(s.sched.waitingGauge.Load() + s.loraQueued()) },
		s.kvCacheUsage,
	)
	var events func(*kvBatch)
	if cfg.KVEvents != "" {
		s.kvEvents = newKVPublisher(cfg.KVEvents, cfg.KVEventsEncoding, s.metrics)
		events = s.kvEvents.publish
	}
	s.cache = newPrefixCache(cfg.KVCacheBlocks, events)
	if lora, err := newLoRASet(cfg); err == nil && lora != nil {
		s.lora = lora
		if cfg.Engine == EngineVLLM {
			s.metrics.registry.MustRegister(newLoRACollector(lora, cfg.Model))
		}
		s.metrics.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "replicasim_lora_loads_total", Help: "LoRA adapters loaded from disk (the simulator's own count)."},
			func() float64 { return float64(s.Loads()) }))
	}
	return s
}

func clamp01(v float64) float64 {
	if !(v > 0) { // also NaN
		return 0
	}
	return min(v, 1)
}

// loraQueued is how many requests wait for their adapter's slot.
func (s *Server) loraQueued() int64 {
	if s.lora == nil {
		return 0
	}
	return s.lora.queued.Load()
}

// kvCacheUsage is the share of KV blocks held by running sequences, capped at 1. Like vLLM,
// blocks that only hold reusable prefix-cache entries count as free.
func (s *Server) kvCacheUsage() float64 {
	return min(float64(s.kvBlocksUsed.Load())/float64(s.cfg.KVCacheBlocks), 1)
}

// Handler routes the replica's endpoints. It is exported so tests can mount it on httptest.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get("X-Request-Id"); id != "" {
		w.Header().Set("X-Request-Id", id)
	}
	switch r.URL.Path {
	case "/v1/chat/completions":
		if allow(w, r, http.MethodPost) {
			s.complete(w, r, chatEndpoint)
		}
	case "/v1/completions":
		if allow(w, r, http.MethodPost) {
			s.complete(w, r, completionEndpoint)
		}
	case "/health":
		if allow(w, r, http.MethodGet) {
			if !s.started() || s.flapDown(time.Now()) {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusOK)
		}
	case "/metrics":
		if allow(w, r, http.MethodGet) {
			s.metrics.handler.ServeHTTP(w, r)
		}
	case "/reset_prefix_cache":
		// vLLM's (with VLLM_SERVER_DEV_MODE=1): an empty 200. A consumer of KV events can
		// test AllBlocksCleared with it.
		if allow(w, r, http.MethodPost) {
			s.cache.reset()
			w.WriteHeader(http.StatusOK)
		}
	case "/tokenize":
		if allow(w, r, http.MethodPost) {
			s.tokenize(w, r)
		}
	case "/v1/models":
		if allow(w, r, http.MethodGet) {
			s.writeModels(w)
		}
	case "/v1/load_lora_adapter", "/v1/unload_lora_adapter":
		if s.lora == nil || !s.lora.runtime { // vLLM serves them only when allowed
			writeAPIError(w, &apiError{status: http.StatusNotFound, typ: "invalid_request_error",
				message: fmt.Sprintf("unknown path %s", r.URL.Path)})
			return
		}
		if allow(w, r, http.MethodPost) {
			if r.URL.Path == "/v1/load_lora_adapter" {
				s.loadAdapter(w, r)
			} else {
				s.unloadAdapter(w, r)
			}
		}
	case "/":
		if allow(w, r, http.MethodGet) {
			writeJSON(w, http.StatusOK, map[string]any{"name": "ferry replica-sim", "model": s.cfg.Model, "ready": s.started()})
		}
	default:
		writeAPIError(w, &apiError{status: http.StatusNotFound, typ: "invalid_request_error",
			message: fmt.Sprintf("unknown path %s", r.URL.Path)})
	}
}

// allow answers 405 unless r uses method (GET also admits HEAD, which net/http answers without
// a body); it reports whether to go on.
func allow(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method || (method == http.MethodGet && r.Method == http.MethodHead) {
		return true
	}
	w.Header().Set("Allow", method)
	writeAPIError(w, &apiError{status: http.StatusMethodNotAllowed, typ: "invalid_request_error",
		message: fmt.Sprintf("method %s not allowed on %s; use %s", r.Method, r.URL.Path, method)})
	return false
}

// started reports whether the simulated model has finished loading.
func (s *Server) started() bool { return time.Now().UnixNano() >= s.readyAt.Load() }

func (s *Server) writeModels(w http.ResponseWriter) {
	type model struct {
		ID      string  `json:"id"`
		Object  string  `json:"object"`
		Created int64   `json:"created"`
		OwnedBy string  `json:"owned_by"`
		Root    string  `json:"root"`
		Parent  *string `json:"parent"`
		MaxLen  int     `json:"max_model_len"`
	}
	created := time.Unix(0, s.readyAt.Load()).Unix()
	data := []model{{s.cfg.Model, "model", created, "ferry", s.cfg.Model, nil, maxModelLen}}
	if s.lora != nil {
		for _, m := range s.lora.adapterModels() {
			data = append(data, model{m.name, "model", created, "ferry", m.path, &s.cfg.Model, maxModelLen})
		}
	}
	writeJSON(w, http.StatusOK, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", data})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeAPIError(w, &apiError{status: http.StatusInternalServerError, typ: "internal_server_error", message: err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// draw returns the next random values for one request, under the lock so that a seed gives the
// same sequence of draws whatever the concurrency.
func (s *Server) draw() (fault float64, a, b uint64) {
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.rng.Float64(), s.rng.Uint64(), s.rng.Uint64()
}

// stop begins shutdown: sleeping sequences finish at once and hung requests are aborted.
func (s *Server) stop() {
	s.stopOnce.Do(func() {
		s.stopped.Store(true)
		close(s.stopping)
	})
}

// Serve answers requests on ln until ctx ends, then shuts down gracefully: it stops accepting,
// lets in-flight sequences finish without further simulated delay, and returns nil. It closes ln.
// With Config.KVEvents it publishes the prefix cache's changes meanwhile, and a publisher
// endpoint it cannot bind fails it at once.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.kvEvents != nil {
		// Started first so that it stops last, after the handlers that publish have returned.
		stopEvents, err := s.startKVEvents(ln.Addr())
		if err != nil {
			_ = ln.Close()
			return err
		}
		defer stopEvents()
	}
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	if s.cfg.FaultsFile != "" {
		w := &faultsWatcher{s: s, path: s.cfg.FaultsFile, base: s.cfg.faults(),
			report: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "replica-sim: "+format+"\n", args...) }}
		w.check(time.Now()) // before the first request
		watchCtx, stopWatch := context.WithCancel(ctx)
		defer stopWatch()
		go w.run(watchCtx, faultsFilePoll)
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case err := <-serveErr:
		s.stop()
		return err
	case <-ctx.Done():
	}
	s.stop()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Run listens on cfg.Host:cfg.Port and serves until ctx ends. It is what `ferry replica-sim`
// runs; it validates cfg first, so a mistyped flag fails loudly instead of being defaulted.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
	if err != nil {
		return fmt.Errorf("replica-sim: listen: %w", err)
	}
	if cfg.OnListen != nil {
		cfg.OnListen(ln.Addr())
	}
	return NewServer(cfg).Serve(ctx, ln)
}

// startKVEvents opens the event publisher's socket and runs it until the returned stop, which
// sends what is still queued. addr, where the replica listens, names the default topic.
func (s *Server) startKVEvents(addr net.Addr) (stop func(), err error) {
	topic := s.cfg.KVEventsTopic
	if topic == "" {
		hostPort := addr.String()
		if tcp, ok := addr.(*net.TCPAddr); ok && s.cfg.Host != "" {
			hostPort = net.JoinHostPort(s.cfg.Host, strconv.Itoa(tcp.Port))
		}
		topic = "kv@" + hostPort + "@" + s.cfg.Model
	}
	sock, err := s.kvEvents.open()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.kvEvents.run(ctx, sock, []byte(topic))
	}()
	return func() { cancel(); <-done }, nil
}
