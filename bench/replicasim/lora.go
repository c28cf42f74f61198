package replicasim

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// LoRA adapters, as vLLM serves them (--enable-lora): a request names an adapter as its model;
// at most MaxLoRAs adapters are active in GPU slots at once, MaxCPULoRAs stay loaded in CPU
// memory, and a request whose adapter is not active waits until a slot is free of other
// adapters' requests, then pays the adapter's activation (and its load from disk when it was not
// in CPU memory). That is what makes adapter-blind routing slow: every replica ends up swapping
// every adapter. The costs are assumptions, flag-set: vLLM logs no timing for them, and they
// grow with the adapter's rank and the model's size (see bench/README.md).

// loraModule is one registered adapter.
type loraModule struct {
	name, path string
	json       []byte // name as a JSON string, spliced into responses
	seed       uint64 // seeds its prefix-cache hashes: vLLM keys cached blocks by the LoRA too
	// Guarded by loraSet.mu:
	onGPU, inCPU bool
	used         uint64 // LRU stamp, GPU and CPU alike
	pins         int    // requests holding its GPU slot, from activation to their end
	running      int    // pinned requests holding a batch slot
	waiting      int    // requests waiting for its slot or, pinned, for a batch slot
	removed      bool   // unloaded while requests still held it
}

// loraWaiter is a request waiting for its adapter's GPU slot.
type loraWaiter struct {
	m       *loraModule
	granted chan struct{}
	cost    time.Duration // set with granted: what activating it costs
}

// loraSet is the replica's adapters and its GPU and CPU slots.
type loraSet struct {
	maxGPU, maxCPU         int
	loadTime, activateTime time.Duration
	runtime                bool // /v1/load_lora_adapter and /v1/unload_lora_adapter are served

	mu      sync.Mutex
	modules map[string]*loraModule
	gpu     int // modules with onGPU
	cpu     int // modules with inCPU
	stamp   uint64
	waiters []*loraWaiter // FIFO
	// queued mirrors len(waiters) for /metrics: vLLM counts a request waiting for its adapter
	// among vllm:num_requests_waiting, as any request waiting to be scheduled.
	queued atomic.Int64
	loads  int // adapter loads from disk since start, for tests and benches
	// loader serializes loads from disk, as vLLM's worker loads one adapter at a time.
	loader sync.Mutex
	// history is the last label sets of vllm:lora_requests_info with the time each was last
	// current: vLLM's gauge keeps every label set it ever set, so a reader must take the newest
	// by its value, not the last line.
	history []loraInfo
}

type loraInfo struct {
	running, waiting string
	at               float64
}

// loraHistory bounds the stale label sets /metrics repeats.
const loraHistory = 4

func newLoRASet(cfg Config) (*loraSet, error) {
	if !cfg.EnableLoRA && len(cfg.LoRAModules) == 0 {
		return nil, nil
	}
	maxCPU := cfg.MaxCPULoRAs
	if maxCPU < cfg.MaxLoRAs {
		maxCPU = cfg.MaxLoRAs
	}
	l := &loraSet{maxGPU: max(cfg.MaxLoRAs, 1), maxCPU: max(maxCPU, 1), loadTime: cfg.LoRALoadTime,
		activateTime: cfg.LoRAActivateTime, runtime: cfg.RuntimeLoRA, modules: map[string]*loraModule{}}
	for _, spec := range cfg.LoRAModules {
		name, path, err := parseLoRAModule(spec)
		if err != nil {
			return nil, err
		}
		if name == cfg.Model || l.modules[name] != nil {
			return nil, fmt.Errorf("--lora-modules %q: the name %q is taken", spec, name)
		}
		l.modules[name] = newLoRAModule(name, path)
	}
	return l, nil
}

// parseLoRAModule reads vLLM's name=path form (its JSON form is not needed here).
func parseLoRAModule(spec string) (name, path string, err error) {
	name, path, ok := strings.Cut(spec, "=")
	if !ok || name == "" || path == "" {
		return "", "", fmt.Errorf("--lora-modules %q: want name=path", spec)
	}
	return name, path, nil
}

func newLoRAModule(name, path string) *loraModule {
	j, _ := json.Marshal(name) // a string always marshals
	return &loraModule{name: name, path: path, json: j, seed: xxhash.Sum64String("lora:" + name)}
}

// lookup returns the adapter a request's model names, or nil.
func (l *loraSet) lookup(name string) *loraModule {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.modules[name]
}

// acquire pins m's GPU slot for one request, waiting while every slot is held by other
// adapters' requests, and sleeps out what activating it costs. It returns the time it waited for
// a slot and the activation, or ctx's error (nothing is pinned then).
func (l *loraSet) acquire(ctx context.Context, m *loraModule, stopping <-chan struct{}) (time.Duration, error) {
	start := time.Now()
	l.mu.Lock()
	m.waiting++
	cost, ok := l.placeLocked(m)
	var w *loraWaiter
	if !ok {
		w = &loraWaiter{m: m, granted: make(chan struct{})}
		l.waiters = append(l.waiters, w)
		l.queued.Store(int64(len(l.waiters)))
	}
	l.mu.Unlock()
	if w != nil {
		select {
		case <-w.granted:
			cost = w.cost
		case <-ctx.Done():
			l.mu.Lock()
			if i := slices.Index(l.waiters, w); i >= 0 {
				l.waiters = slices.Delete(l.waiters, i, i+1)
				l.queued.Store(int64(len(l.waiters)))
				m.waiting--
				l.mu.Unlock()
				return 0, ctx.Err()
			}
			l.mu.Unlock()
			l.release(m, false) // granted in the same instant
			return 0, ctx.Err()
		}
	}
	if cost > l.activateTime {
		// A load from disk: one at a time, as the engine's worker does them.
		l.loader.Lock()
		err := sleepCtx(ctx, cost, stopping)
		l.loader.Unlock()
		if err != nil {
			l.release(m, false)
			return 0, err
		}
	} else if err := sleepCtx(ctx, cost, stopping); err != nil {
		l.release(m, false)
		return 0, err
	}
	return time.Since(start), nil
}

// placeLocked pins m if it is active, or activates it in a free slot or in place of the least
// recently used adapter that no request holds; ok is false when every slot is held.
func (l *loraSet) placeLocked(m *loraModule) (cost time.Duration, ok bool) {
	l.stamp++
	if m.onGPU {
		m.pins++
		m.used = l.stamp
		return 0, true
	}
	if l.gpu >= l.maxGPU {
		victim := l.lruLocked(func(o *loraModule) bool { return o.onGPU && o.pins == 0 })
		if victim == nil {
			return 0, false
		}
		victim.onGPU = false
		l.gpu--
		l.dropLocked(victim)
	}
	cost = l.activateTime
	if !m.inCPU {
		cost += l.loadTime
		l.toCPULocked(m)
	}
	m.onGPU = true
	l.gpu++
	m.pins++
	m.used = l.stamp
	return cost, true
}

// toCPULocked counts a load of m from disk into CPU memory, evicting the least recently used
// module there that no GPU slot holds when CPU memory is full.
func (l *loraSet) toCPULocked(m *loraModule) {
	l.loads++
	if l.cpu >= l.maxCPU {
		if victim := l.lruLocked(func(o *loraModule) bool { return o.inCPU && !o.onGPU }); victim != nil {
			victim.inCPU = false
			l.cpu--
		}
	}
	m.inCPU = true
	l.cpu++
}

// lruLocked returns the least recently used module that ok accepts.
func (l *loraSet) lruLocked(ok func(*loraModule) bool) *loraModule {
	var best *loraModule
	for _, m := range l.modules {
		if ok(m) && (best == nil || m.used < best.used) {
			best = m
		}
	}
	return best
}

// dropLocked forgets a module that was unloaded once nothing holds it any more.
func (l *loraSet) dropLocked(m *loraModule) {
	if m.removed && m.pins == 0 && m.onGPU {
		m.onGPU = false
		l.gpu--
	}
	if m.removed && m.pins == 0 && m.inCPU {
		m.inCPU = false
		l.cpu--
	}
}

// started records that a pinned request left the adapter's queue for a batch slot.
func (l *loraSet) started(m *loraModule) {
	l.mu.Lock()
	m.waiting--
	m.running++
	l.mu.Unlock()
}

// release unpins m for a request that ended (running: it had a batch slot), and hands free
// slots to waiters in arrival order.
func (l *loraSet) release(m *loraModule, running bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m.pins--
	if running {
		m.running--
	} else {
		m.waiting--
	}
	l.dropLocked(m)
	for i := 0; i < len(l.waiters); {
		w := l.waiters[i]
		cost, ok := l.placeLocked(w.m)
		if !ok {
			i++
			continue
		}
		w.cost = cost
		close(w.granted)
		l.waiters = slices.Delete(l.waiters, i, i+1)
	}
	l.queued.Store(int64(len(l.waiters)))
}

// info is the current vllm:lora_requests_info: the adapters of running requests and those of
// waiting ones, comma-separated in vLLM's way.
func (l *loraSet) info() loraInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	var running, waiting []string
	for _, m := range l.modules {
		if m.running > 0 {
			running = append(running, m.name)
		}
		if m.waiting > 0 {
			waiting = append(waiting, m.name)
		}
	}
	sort.Strings(running)
	sort.Strings(waiting)
	return loraInfo{running: strings.Join(running, ","), waiting: strings.Join(waiting, ",")}
}

// Loads is how many times an adapter was loaded from disk since the replica started.
func (s *Server) Loads() int {
	if s.lora == nil {
		return 0
	}
	s.lora.mu.Lock()
	defer s.lora.mu.Unlock()
	return s.lora.loads
}

// loraCollector exports vllm:lora_requests_info as vLLM does: a gauge whose value is the time
// it was set, labelled with the running and waiting adapters and max_lora; the label sets of
// earlier scrapes stay, with their older times.
type loraCollector struct {
	l     *loraSet
	model string
	desc  *prometheus.Desc
	now   func() time.Time
}

func newLoRACollector(l *loraSet, model string) *loraCollector {
	return &loraCollector{l: l, model: model, now: time.Now, desc: prometheus.NewDesc("vllm:lora_requests_info",
		"Running stats on lora requests.", []string{"running_lora_adapters", "waiting_lora_adapters", "max_lora"},
		prometheus.Labels{"model_name": model})}
}

func (c *loraCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *loraCollector) Collect(ch chan<- prometheus.Metric) {
	cur := c.l.info()
	cur.at = float64(c.now().UnixNano()) / 1e9
	c.l.mu.Lock()
	h := slices.DeleteFunc(c.l.history, func(i loraInfo) bool { return i.running == cur.running && i.waiting == cur.waiting })
	h = append(h, cur)
	if len(h) > loraHistory {
		h = h[len(h)-loraHistory:]
	}
	c.l.history = h
	out := slices.Clone(h)
	c.l.mu.Unlock()
	maxLoRA := fmt.Sprint(c.l.maxGPU)
	for _, i := range out {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, i.at, i.running, i.waiting, maxLoRA)
	}
}

// loraRequest is the body of vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter.
type loraRequest struct {
	Name string `json:"lora_name"`
	Path string `json:"lora_path"`
}

// loadAdapter serves POST /v1/load_lora_adapter: it registers the adapter and loads it into CPU
// memory, which takes the load time; vLLM's messages and statuses.
func (s *Server) loadAdapter(w http.ResponseWriter, r *http.Request) {
	req, ok := s.readLoRARequest(w, r)
	if !ok {
		return
	}
	if req.Name == "" || req.Path == "" {
		writeAPIError(w, &apiError{status: http.StatusBadRequest, typ: "InvalidUserInput",
			message: "Both 'lora_name' and 'lora_path' must be provided."})
		return
	}
	l := s.lora
	l.mu.Lock()
	if req.Name == s.cfg.Model || l.modules[req.Name] != nil {
		l.mu.Unlock()
		writeAPIError(w, &apiError{status: http.StatusBadRequest, typ: "InvalidUserInput",
			message: fmt.Sprintf("The lora adapter '%s' has already been loaded.", req.Name)})
		return
	}
	m := newLoRAModule(req.Name, req.Path)
	l.modules[req.Name] = m
	l.mu.Unlock()
	l.loader.Lock()
	err := sleepCtx(r.Context(), l.loadTime, s.stopping)
	l.loader.Unlock()
	if err != nil {
		return
	}
	l.mu.Lock()
	if !m.inCPU && !m.removed {
		l.toCPULocked(m)
	}
	l.mu.Unlock()
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.Name)
}

// unloadAdapter serves POST /v1/unload_lora_adapter. Requests already holding the adapter
// finish; new ones get 404.
func (s *Server) unloadAdapter(w http.ResponseWriter, r *http.Request) {
	req, ok := s.readLoRARequest(w, r)
	if !ok {
		return
	}
	l := s.lora
	l.mu.Lock()
	m := l.modules[req.Name]
	if m == nil {
		l.mu.Unlock()
		writeAPIError(w, &apiError{status: http.StatusNotFound, typ: "NotFoundError",
			message: fmt.Sprintf("The lora adapter '%s' cannot be found.", req.Name)})
		return
	}
	delete(l.modules, req.Name)
	m.removed = true
	if m.pins == 0 {
		if m.onGPU {
			l.gpu--
		}
		if m.inCPU {
			l.cpu--
		}
		m.onGPU, m.inCPU = false, false
	}
	l.mu.Unlock()
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", req.Name)
}

func (s *Server) readLoRARequest(w http.ResponseWriter, r *http.Request) (loraRequest, bool) {
	var req loraRequest
	body, aerr := readBody(nil, w, r)
	if aerr == nil {
		aerr = decodeJSON(body, &req)
	}
	if aerr != nil {
		writeAPIError(w, aerr)
		return req, false
	}
	return req, true
}

// adapterModels lists the registered adapters for /v1/models, as vLLM does: each with its
// path as root and the base model as parent.
func (l *loraSet) adapterModels() []loraModule {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]loraModule, 0, len(l.modules))
	for _, m := range l.modules {
		out = append(out, loraModule{name: m.name, path: m.path})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// sleepCtx waits d, or until ctx ends (its error), or returns at once on shutdown.
func sleepCtx(ctx context.Context, d time.Duration, stopping <-chan struct{}) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-stopping:
		return nil
	}
}
