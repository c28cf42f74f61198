package policy

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// least_ttft's constants.
const (
	// DefaultTTFTLoadFactor bounds least_ttft's load: a replica that would hold more than
	// max(f × m, m + 2) requests, m the mean after placing this one, is not a candidate, so no
	// replica runs more than 25 % above the mean however many prompts share its cache. The
	// m + 2 term matters only when the service is nearly idle, where f × m is below a request
	// and a cache hit is worth a request or two ahead (prefix_affinity's affinityBound).
	DefaultTTFTLoadFactor = 1.25
	// defaultPrefillSecondsPerToken and defaultHoldSeconds stand in for what least_ttft has not
	// learned yet: 50 µs per token is a 7-8B model's prefill on one GPU, and a second is a
	// typical chat answer. They only weigh a queue against a prefill until real figures arrive.
	defaultPrefillSecondsPerToken = 50e-6
	defaultHoldSeconds            = 1.0
	// maxPrefillSecondsPerToken, maxBaseSeconds and the hold's bounds cap what learning may
	// conclude. TTFT is measured at the proxy, so a proxy starved of CPU (a busy host) or a
	// burst of queueing the estimate missed inflates it; unbounded, one bad minute could make
	// the line say a cache hit saves seconds, or a slot is held for minutes. 2 ms per token is
	// slower than any GPU's prefill; a second of fixed cost or ten minutes per answer are far
	// beyond what an engine with free slots shows.
	maxPrefillSecondsPerToken = 2e-3
	maxBaseSeconds            = 1.0
	minHoldSeconds            = 1e-3
	maxHoldSeconds            = 600.0
	// minReplicaSamples is how many observed TTFTs a replica needs before its own prefill line
	// replaces the pooled one; minPooledSamples the same for the pooled line.
	minReplicaSamples = 64
	minPooledSamples  = 16
	// fitDecay weighs the TTFT regression towards recent requests: each sample counts 0.99 of
	// the one after it, an effective window of about 100 requests.
	fitDecay = 0.99
	// holdWeight is the weight of a new sample in the mean time a request holds a batch slot.
	holdWeight = 1.0 / 32
	// costTolerance makes estimates within 5 % (or 1 ms) ties, broken by cached tokens and
	// then load: per-replica lines are noisy, and without it a replica whose line came out a
	// little lower would take every request that no replica has cached.
	costTolerance      = 0.05
	costToleranceFloor = 1e-3
	// defaultAdapterLoadSeconds stands in for the learned cost of a request whose adapter is
	// not active on its replica: loading a LoRA of a 7-8B model from local disk takes about a
	// tenth of a second (more for high ranks or remote storage); Learn measures it.
	defaultAdapterLoadSeconds = 0.1
	maxAdapterLoadSeconds     = 30.0
	// correctionTokens is how many prompt tokens a replica must have been sent, and have
	// looked up, between two corrections of its index's size from its hit counters.
	correctionTokens = 1 << 16
	// minCacheScale is the least share of the announced cache the index keeps after
	// corrections: a replica whose hit counters say it holds far less than announced (other
	// proxies share it, or running sequences crowd its cache) still keeps some picture.
	minCacheScale = 1.0 / 8
)

// leastTTFT estimates each replica's time to first token for the request and picks the least:
//
//	ttft(r) = wait(r) + base(r) + rate(r) × uncached(r)
//
// where:
//   - uncached(r) is the prompt's estimated tokens less those replica r holds in its KV cache,
//     per a per-replica prefix index (replicaCache) updated on every pick and sized like the
//     replica's cache: num_gpu_blocks × block_size from vllm:cache_config_info, or the
//     configured size, scaled by what the replica's own hit counters say (correct);
//   - base(r) and rate(r) are a line fitted to the observed TTFT of requests against their
//     uncached tokens (Learn): a replica's own after minReplicaSamples, the pool's before;
//   - wait(r) is the time until a batch slot: with b the batch size learned from the replica's
//     metrics (the largest running count seen while requests waited), a request that would
//     be the k-th beyond b waits about k × hold / b, hold being the learned time a request
//     holds a slot; k counts this proxy's requests in flight beyond b, or the engine's own
//     waiting requests when a fresh scrape shows more. Below b it is 0.
//
// Only replicas within the load bound (DefaultTTFTLoadFactor) are candidates; the least loaded
// always is. When no candidate holds any of the prompt, the estimate cannot tell replicas apart
// by cache and the pick is least_load's. Estimates within costTolerance are ties, broken by a
// free batch slot (a queue's wait is an estimate whose errors land in the tail), then more
// cached tokens (a hit saves the engine's compute for others even when the learned rate says
// it saves this request little), then fewer requests in flight, then at random.
//
// Cost per pick: one hashing pass over the prompt, O(log blocks) lookups per replica, and
// one LRU update of the chosen replica's index; no allocation. For a cached 4k-token prompt
// about 1.0 µs on 4 replicas and 1.2 on 8, half of it hashing; 4.0 and 4.6 µs when no block
// is cached (BenchmarkLeastTTFTPick, medians on a shared 2-core host).
// Memory: replicaCache's, per replica.
type leastTTFT struct {
	rand        func() uint64
	factor      float64
	cacheTokens int64 // a replica's cache size when it announces none
	// now and staleAfter judge whether a replica's scraped queue is fresh enough to count.
	now        func() time.Time
	staleAfter int64

	states atomic.Pointer[map[*Replica]*ttftReplica]

	mu     sync.Mutex // serializes changes to states; guards pooled
	pooled ttftFit
	// The pooled line and hold, published for lock-free reads.
	pooledBase, pooledRate, pooledHold atomic.Uint64 // float64 bits
	pooledSamples                      atomic.Int64
	// maxLoRAs is a replica's adapter slots when its engine does not say; adapterLoad the
	// learned cost of activating an adapter (float64 bits; 0 until learned), adapterLoads how
	// many loads it has learned from.
	maxLoRAs     int
	adapterLoad  atomic.Uint64
	adapterLoads atomic.Int64
}

func newLeastTTFT(opts Options) *leastTTFT {
	p := &leastTTFT{rand: opts.Rand, factor: opts.TTFTLoadFactor, cacheTokens: opts.PrefixCacheTokens,
		now: opts.Now, staleAfter: int64(opts.MetricsStaleAfter), maxLoRAs: opts.MaxLoRAs}
	m := map[*Replica]*ttftReplica{}
	p.states.Store(&m)
	return p
}

// Needs reports that the picker reads the prompt and model when the body has them, and the
// replicas' metrics (batch size, cache size, hit counters), and that it weighs queues itself.
func (*leastTTFT) Needs() Needs { return NeedsPrompt | PromptOptional | NeedsMetrics | WeighsQueues }

// Prepare gives every replica of a new snapshot its state, keeping the states (index and
// learned figures) of replicas that stay and dropping those of replicas that left.
func (p *leastTTFT) Prepare(replicas []*Replica) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := *p.states.Load()
	next := make(map[*Replica]*ttftReplica, len(replicas))
	for _, r := range replicas {
		st, ok := old[r]
		if !ok {
			st = p.newState()
		}
		next[r] = st
	}
	p.states.Store(&next)
}

// state returns r's state, creating it for a replica Prepare has not seen.
func (p *leastTTFT) state(r *Replica) *ttftReplica {
	if st, ok := (*p.states.Load())[r]; ok {
		return st
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	old := *p.states.Load()
	if st, ok := old[r]; ok {
		return st
	}
	next := make(map[*Replica]*ttftReplica, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	st := p.newState()
	next[r] = st
	p.states.Store(&next)
	return st
}

func (p *leastTTFT) newState() *ttftReplica {
	st := &ttftReplica{cache: newReplicaCache(cacheLimit(p.cacheTokens, 1)), scale: 1}
	return st
}

// cacheLimit is the index size, in blocks, for a cache of tokens scaled by scale.
func cacheLimit(tokens int64, scale float64) int {
	blocks := float64(tokens) * scale / cacheBlockTokens
	return int(min(max(blocks, minCacheBlocks), maxCacheBlocks))
}

func (p *leastTTFT) Pick(req *Request, replicas []*Replica) *Replica {
	if len(replicas) == 0 {
		return nil
	}
	var prompt pickPrompt
	prompt.read(req)
	var total int64
	for _, r := range replicas {
		total += r.InFlight.Load()
	}
	mean := float64(total+1) / float64(len(replicas))
	bound := max(p.factor*mean, mean+2)
	now := req.at(p.now).UnixNano()
	pooledBase, pooledRate, pooledHold := p.pooledLine()

	var (
		best                            *Replica
		bestState                       *ttftReplica
		bestCost                        float64
		bestLoad, bestCached, bestAhead int64
		ties, shared                    = uint64(0), req.Adapter != 0
		bestLoads                       bool // the best replica must load the request's adapter
		// least and leastFree are the least loaded replica, and the least loaded with room to
		// start the request at once: the pick when no replica holds any of the prompt.
		least, leastFree leastPick
	)
	for _, r := range replicas {
		st := p.state(r)
		st.refresh(r, p.cacheTokens)
		load := r.InFlight.Load()
		ahead := st.ahead(r, load, prompt.tokens, now, p.staleAfter)
		least.offer(r, st, load, ahead, p.rand)
		if ahead == 0 {
			leastFree.offer(r, st, load, ahead, p.rand)
		}
		if float64(load+1) > bound {
			continue
		}
		cached := prompt.cached(r, st, now)
		shared = shared || cached > 0
		base, rate, hold := st.line(pooledBase, pooledRate, pooledHold)
		cost := base + rate*float64(prompt.tokens-cached)
		if ahead > 0 {
			cost += float64(ahead) * hold / float64(st.slots(r))
		}
		adapterCost, loads := p.adapterCost(req.Adapter, r, now, hold)
		cost += adapterCost
		tolerance := max(costTolerance*min(cost, bestCost), costToleranceFloor)
		tie := best != nil && cost <= bestCost+tolerance && cost >= bestCost-tolerance
		// Among ties a replica with a free slot goes first: a queue's wait is an estimate
		// whose errors all land in the tail, and a queued request cannot move.
		free, bestFree := ahead == 0, bestAhead == 0
		switch {
		case best == nil || cost < bestCost-tolerance ||
			(tie && (free && !bestFree || free == bestFree && (cached > bestCached || (cached == bestCached && load < bestLoad)))):
			best, bestState, bestCost, bestLoad, bestCached, bestAhead, ties = r, st, cost, load, cached, ahead, 1
			bestLoads = loads
		case tie && free == bestFree && cached == bestCached && load == bestLoad:
			ties++
			if p.rand()%ties == 0 {
				best, bestState, bestCost, bestCached, bestAhead = r, st, cost, cached, ahead
				bestLoads = loads
			}
		}
	}
	if !shared {
		// No estimate tells the replicas apart by cache: least load, among those with room if
		// any has it (a request that finds a full KV cache waits for a sequence to end there,
		// however light that replica's load looks).
		pick := least
		if leastFree.r != nil {
			pick = leastFree
		}
		best, bestState, bestCached, bestAhead = pick.r, pick.st, 0, pick.ahead
	}
	req.Estimate = prompt.sent(best, bestState, bestCached, now)
	req.Estimate.Queued = bestAhead > 0
	req.Estimate.AdapterLoad = bestLoads
	return best
}

// adapterCost is what the request's adapter adds to its TTFT on r: nothing where the adapter
// is likely active; its load where it is not, and another where loading it evicts an adapter
// (whose next request then loads it again); and, where every adapter slot is held by other
// adapters' requests, also the wait until one of them drains, about one slot hold, and one more
// for each adapter the engine has waiting already. A request whose adapter the engine has
// waiting waits with it, without a load of its own. loads is whether the adapter would be
// loaded.
func (p *leastTTFT) adapterCost(adapter int32, r *Replica, now int64, hold float64) (cost float64, loads bool) {
	if adapter == 0 {
		return 0, false
	}
	v := r.adapterView(adapter-1, now, p.staleAfter, p.maxLoRAs)
	switch {
	case v.resident:
		return 0, false
	case v.pending: // loading or waiting for a slot already: this request rides along
		return hold, false
	}
	load := defaultAdapterLoadSeconds
	if p.adapterLoads.Load() > 0 {
		load = math.Float64frombits(p.adapterLoad.Load())
	}
	cost = load
	if v.held >= v.maxLoRAs {
		// It takes the slot of an adapter that will have to be loaded again when its next
		// request comes: a free slot elsewhere saves that load.
		cost += load
	}
	if v.active >= v.maxLoRAs {
		// A slot frees when every request of one active adapter has ended, and the adapters
		// already waiting take the first ones.
		cost += hold * float64(1+v.queued)
	}
	return cost, true
}

// learnAdapterLoad folds in what a request that loaded its adapter took beyond its line.
func (p *leastTTFT) learnAdapterLoad(extra float64) {
	extra = min(max(extra, 0), maxAdapterLoadSeconds)
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.adapterLoads.Load()
	p.adapterLoad.Store(math.Float64bits(ewma(math.Float64frombits(p.adapterLoad.Load()), extra, int(n))))
	p.adapterLoads.Store(n + 1)
}

// pickPrompt is what one pick knows of the prompt: its byte blocks for the index this proxy
// keeps, its token ids for the engines' own reports, and its length in tokens (counted when the
// ids are there, estimated from bytes when not). It lives on the picking goroutine's stack.
type pickPrompt struct {
	blocks promptBlocks
	exact  tokenMatch
	tokens int64
}

func (pp *pickPrompt) read(req *Request) {
	if len(req.Prompt) > 0 {
		pp.blocks.hash(req.Model, req.Prompt)
	}
	pp.tokens = int64(pp.blocks.tokens)
	pp.exact.req = req
	if len(req.Tokens) > 0 {
		pp.tokens = int64(len(req.Tokens))
	}
}

// cached is how many of the prompt's tokens replica r holds: what its engine reports, where it
// does and the request has token ids, else what r's byte index says.
func (pp *pickPrompt) cached(r *Replica, st *ttftReplica, now int64) int64 {
	cached, precise := pp.exact.cached(r, now)
	if !precise && pp.blocks.n > 0 {
		cached = min(int64(st.cache.depth(pp.blocks.hashes[:pp.blocks.n]))*cacheBlockTokens, pp.tokens)
	}
	return cached
}

// sent notes that the prompt goes to best, holding cached of its tokens, and returns the
// estimate Learn gets back: the blocks enter best's byte index, and its engine's index as
// claims; the byte index's expected hits count towards its correction only when they were its
// guess.
func (pp *pickPrompt) sent(best *Replica, st *ttftReplica, cached, now int64) Estimate {
	if pp.blocks.n > 0 {
		st.cache.record(pp.blocks.hashes[:pp.blocks.n])
	}
	precise := pp.exact.claim(best, now)
	st.sinceScrape.Add(pp.tokens)
	if !precise {
		st.sentTokens.Add(pp.tokens)
		st.expectedHits.Add(cached)
	}
	return Estimate{Tokens: pp.tokens, Cached: cached, Precise: precise}
}

// tokenMatch matches a request's token ids against the engines' own reports of their caches
// (KVBlocks), cutting them into an engine's blocks when the first replica with a live index
// asks, and again only if another's block size differs.
type tokenMatch struct {
	req       *Request
	blockSize int
}

// cached returns how many of the prompt's tokens r's engine holds, and whether it could tell:
// false when the request has no token ids or r's engine has reported nothing.
func (m *tokenMatch) cached(r *Replica, now int64) (int64, bool) {
	kv := r.KV()
	if kv == nil || len(m.req.Tokens) == 0 || !kv.Live() {
		return 0, false
	}
	kv.mu.RLock()
	defer kv.mu.RUnlock()
	if !m.cut(kv.blockSize) {
		return 0, false
	}
	return int64(kv.depthLocked(m.req.chain, now) * m.blockSize), true
}

// claim notes the request's blocks on the chosen replica's index (KVBlocks.claim) and reports
// whether its estimate was the engine's.
func (m *tokenMatch) claim(r *Replica, now int64) bool {
	kv := r.KV()
	if kv == nil || len(m.req.Tokens) == 0 || !kv.Live() || !m.cut(kv.BlockSize()) {
		return false
	}
	kv.claim(m.req.chain, now)
	return true
}

func (m *tokenMatch) cut(blockSize int) bool {
	if blockSize <= 0 {
		return false
	}
	if blockSize != m.blockSize {
		m.req.chain = tokenChain(m.req.chain[:0], m.req.Tokens, blockSize)
		m.blockSize = blockSize
	}
	return true
}

// pooledLine returns the line and hold learned over every replica, or the defaults.
func (p *leastTTFT) pooledLine() (base, rate, hold float64) {
	base, rate, hold = 0, defaultPrefillSecondsPerToken, defaultHoldSeconds
	if p.pooledSamples.Load() >= minPooledSamples {
		base = math.Float64frombits(p.pooledBase.Load())
		rate = math.Float64frombits(p.pooledRate.Load())
		hold = math.Float64frombits(p.pooledHold.Load())
	}
	return base, rate, hold
}

// Learn fits the prefill line and the slot hold time to a request's outcome, against what Pick
// noted (est). Where the answer reports the engine's cached tokens, they replace the index's
// guess in the line's x, and they check the index's size (ttftReplica.report). A request that
// Pick expected to queue tells nothing about prefill and is left out of the line.
func (p *leastTTFT) Learn(r *Replica, est Estimate, out Outcome) {
	if est.Tokens <= 0 {
		return
	}
	st := p.state(r)
	uncached := float64(est.Tokens - est.Cached)
	if share, ok := out.cachedShare(); ok {
		uncached = float64(est.Tokens) * (1 - share)
		if !est.Precise { // the engine's events, not the byte index, made this estimate
			st.report(est, share, p.cacheTokens)
		}
	}
	if out.TTFT <= 0 || out.Total < out.TTFT || est.Queued {
		return
	}
	x, y, hold := uncached, out.TTFT.Seconds(), out.Total.Seconds()
	if est.AdapterLoad {
		// The load is in its TTFT, not the prefill's: it teaches the load's cost instead.
		base, rate, _ := st.line(p.pooledLine())
		p.learnAdapterLoad(y - base - rate*x)
		return
	}
	st.learn(x, y, hold)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pooled.add(x, y)
	if base, rate, ok := p.pooled.line(); ok {
		p.pooledBase.Store(math.Float64bits(base))
		p.pooledRate.Store(math.Float64bits(rate))
	}
	p.pooled.hold = ewma(p.pooled.hold, hold, p.pooled.n)
	p.pooledHold.Store(math.Float64bits(p.pooled.hold))
	p.pooledSamples.Store(int64(p.pooled.n))
}

// ttftReplica is what least_ttft knows of one replica: its prefix index, what it learned of
// its prefill and batch, and the bookkeeping that corrects the index from its hit counters.
type ttftReplica struct {
	cache *replicaCache

	// sentTokens and expectedHits accumulate, per pick, the prompt tokens sent to the replica
	// and those the index expected it to have cached; correct compares them with its counters.
	sentTokens, expectedHits atomic.Int64
	// sinceScrape is the prompt tokens sent to the replica since the scrape last folded in:
	// KV cache its reported use does not show yet (ahead).
	sinceScrape atomic.Int64
	// batch is the replica's batch size as learned from its metrics; 0 until seen full.
	batch atomic.Int64
	// seenAt is the UpdatedAt of the last scrape folded in.
	seenAt atomic.Int64
	// The replica's own line and hold, published for lock-free reads once fitted.
	base, rate, hold atomic.Uint64 // float64 bits
	samples          atomic.Int64

	mu  sync.Mutex // guards what follows
	fit ttftFit
	// announced is the cache size the replica last announced; scale the correction applied.
	announced int64
	scale     float64
	// The counters at the last scrape, and the window since the last correction: tokens the
	// engine looked up and found, and tokens sent and expected cached.
	counted                   bool
	lastQueries, lastHits     float64
	engineQueries, engineHits float64
	sentWindow, expectWindow  float64
	// reported is set once an answer from the replica reported its cached tokens; from then
	// on those reports, not the counters, correct the index. The window since the last
	// correction: prompt tokens sent, expected cached, and reported cached.
	reported                               bool
	reportSent, reportExpected, reportHits float64
}

// leastPick is the least loaded of the replicas offered, ties broken at random.
type leastPick struct {
	r     *Replica
	st    *ttftReplica
	load  int64
	ahead int64
	ties  uint64
}

func (l *leastPick) offer(r *Replica, st *ttftReplica, load, ahead int64, rand func() uint64) {
	switch {
	case l.r == nil || load < l.load:
		*l = leastPick{r: r, st: st, load: load, ahead: ahead, ties: 1}
	case load == l.load:
		l.ties++
		if rand()%l.ties == 0 {
			l.r, l.st, l.ahead = r, st, ahead
		}
	}
}

// ahead returns how many requests would be ahead of one more, of need prompt tokens, in the
// replica's queue: those this proxy has in flight beyond the learned batch size; or, at a
// scrape fresher than staleAfter, if more, the requests the engine itself reported waiting
// (other proxies' among them), since it queues only once its batch or its KV cache is full;
// or, with none waiting, one when the KV cache's free tokens (its reported use of its announced
// size, less the prompts sent there since that scrape) cannot hold the prompt: the request
// then waits for a sequence to end. 0 when nothing says the replica is full.
func (st *ttftReplica) ahead(r *Replica, load, need, now, staleAfter int64) int64 {
	var ahead int64
	if batch := st.batch.Load(); batch > 0 {
		ahead = max(load+1-batch, 0)
	}
	if at := r.scrapedAt.Load(); at == 0 || now-at > staleAfter {
		return ahead
	}
	if waiting := r.waiting.Load(); waiting > 0 {
		return max(ahead, waiting+1)
	}
	if size := r.cacheTokens.Load(); size > 0 && ahead == 0 {
		used := math.Float64frombits(r.kvUsage.Load())*float64(size) + float64(st.sinceScrape.Load())
		if used+float64(need) > float64(size) {
			return 1
		}
	}
	return ahead
}

// slots is what a queue's wait divides among: the learned batch size, or, before it is
// learned, the batch the replica last reported running (a KV cache full before the batch is).
func (st *ttftReplica) slots(r *Replica) int64 {
	return max(st.batch.Load(), r.running.Load(), 1)
}

// line returns the replica's prefill line and hold time: its own once it has enough samples,
// else the pooled ones given.
func (st *ttftReplica) line(pooledBase, pooledRate, pooledHold float64) (base, rate, hold float64) {
	if st.samples.Load() < minReplicaSamples {
		return pooledBase, pooledRate, pooledHold
	}
	return math.Float64frombits(st.base.Load()), math.Float64frombits(st.rate.Load()), math.Float64frombits(st.hold.Load())
}

func (st *ttftReplica) learn(x, y, hold float64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.fit.add(x, y)
	st.fit.hold = ewma(st.fit.hold, hold, st.fit.n)
	base, rate, ok := st.fit.line()
	if !ok {
		return
	}
	st.base.Store(math.Float64bits(base))
	st.rate.Store(math.Float64bits(rate))
	st.hold.Store(math.Float64bits(st.fit.hold))
	st.samples.Store(int64(st.fit.n))
}

// refresh folds a new scrape of r into the state: the batch size, the announced cache size,
// and the hit counters that correct the index's size. It costs one atomic load when there is
// nothing new.
func (st *ttftReplica) refresh(r *Replica, configuredTokens int64) {
	updated := r.scrapedAt.Load()
	if updated == 0 || updated == st.seenAt.Load() {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if updated == st.seenAt.Load() {
		return
	}
	st.seenAt.Store(updated)
	st.sinceScrape.Store(0)
	m := r.LoadMetrics()
	// An engine never runs more than its batch, and requests wait only when it is full (or its
	// KV cache is): the largest running count seen beside waiting requests is the batch size.
	if m.Waiting > 0 && m.Running > st.batch.Load() {
		st.batch.Store(m.Running)
	}
	limitChanged := false
	if m.CacheTokens > 0 && m.CacheTokens != st.announced {
		st.announced, limitChanged = m.CacheTokens, true
	}
	if m.PrefixQueries > 0 {
		if st.counted && m.PrefixQueries >= st.lastQueries && m.PrefixHits >= st.lastHits {
			st.engineQueries += m.PrefixQueries - st.lastQueries
			st.engineHits += m.PrefixHits - st.lastHits
		}
		st.counted, st.lastQueries, st.lastHits = true, m.PrefixQueries, m.PrefixHits
		st.sentWindow += float64(st.sentTokens.Swap(0))
		st.expectWindow += float64(st.expectedHits.Swap(0))
		if st.engineQueries >= correctionTokens && st.sentWindow >= correctionTokens {
			if !st.reported {
				limitChanged = st.correct(st.engineHits/st.engineQueries, st.expectWindow/st.sentWindow) || limitChanged
			}
			st.engineQueries, st.engineHits, st.sentWindow, st.expectWindow = 0, 0, 0, 0
		}
	}
	if limitChanged {
		st.resize(configuredTokens)
	}
}

// report folds one answer's reported cached share into the window that corrects the index's
// size, and corrects it once the window holds correctionTokens. Per-request reports are better
// than the engine's counters: they count only this proxy's requests, against exactly what the
// index expected of each, and engines that export no counters report them.
func (st *ttftReplica) report(est Estimate, share float64, configuredTokens int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.reported = true
	st.reportSent += float64(est.Tokens)
	st.reportExpected += float64(est.Cached)
	st.reportHits += float64(est.Tokens) * share
	if st.reportSent < correctionTokens {
		return
	}
	changed := st.correct(st.reportHits/st.reportSent, st.reportExpected/st.reportSent)
	st.reportSent, st.reportExpected, st.reportHits = 0, 0, 0
	if changed {
		st.resize(configuredTokens)
	}
}

// resize sets the index's limit to the announced cache size, or configuredTokens when the
// replica announces none, times the correction's scale. Called with st.mu held.
func (st *ttftReplica) resize(configuredTokens int64) {
	tokens := st.announced
	if tokens == 0 {
		tokens = configuredTokens
	}
	st.cache.setLimit(cacheLimit(tokens, st.scale))
}

// correct compares engine, the share of prompt tokens the replica found cached, with expected,
// the share the index expected over the same window, and rescales the index: an index that
// expects much more than the engine finds is larger than what the engine keeps (its cache is
// crowded by running sequences, or by other proxies' requests), so it shrinks by 15 %; one
// that expects no more than the engine finds grows back by 10 %, up to the announced size.
// Between the two it is left alone, so noise does not make it drift. It reports whether the
// scale changed. Called with st.mu held.
func (st *ttftReplica) correct(engine, expected float64) bool {
	scale := st.scale
	switch {
	case engine < 0.8*expected:
		scale = max(scale*0.85, minCacheScale)
	case engine >= 0.95*expected:
		scale = min(scale*1.1, 1)
	}
	changed := scale != st.scale
	st.scale = scale
	return changed
}

// ttftFit is an exponentially weighted least-squares line of TTFT (seconds) against uncached
// prompt tokens, and the mean time a request holds a batch slot.
type ttftFit struct {
	w, x, y, xx, xy float64
	n               int
	hold            float64
}

func (f *ttftFit) add(x, y float64) {
	f.w = f.w*fitDecay + 1
	f.x = f.x*fitDecay + x
	f.y = f.y*fitDecay + y
	f.xx = f.xx*fitDecay + x*x
	f.xy = f.xy*fitDecay + x*y
	f.n++
}

// line returns the fitted base and rate. ok is false until the prompts seen differ in length by
// more than a block on average (no slope can be told before); both are within their bounds
// (maxBaseSeconds, maxPrefillSecondsPerToken) and never negative.
func (f *ttftFit) line() (base, rate float64, ok bool) {
	if f.n < 2 {
		return 0, 0, false
	}
	mx, my := f.x/f.w, f.y/f.w
	vx := f.xx/f.w - mx*mx
	if vx < cacheBlockTokens*cacheBlockTokens {
		return 0, 0, false
	}
	rate = min(max((f.xy/f.w-mx*my)/vx, 0), maxPrefillSecondsPerToken)
	return min(max(my-rate*mx, 0), maxBaseSeconds), rate, true
}

// ewma folds v into mean, the n-th sample (n counts v): a plain mean for the first samples,
// then holdWeight per sample.
func ewma(mean, v float64, n int) float64 {
	v = min(max(v, minHoldSeconds), maxHoldSeconds)
	return mean + (v-mean)*max(holdWeight, 1/float64(max(n, 1)))
}
