package policy

import (
	"time"
)

// Weights of llm_aware's score, those of llm-d's default endpoint-picker profile: prefix-cache
// affinity counts for more than either load signal, so a conversation stays where its KV cache
// is until the load bound or a real queue says otherwise.
const (
	llmAwarePrefixWeight = 3
	llmAwareBusyWeight   = 2
	llmAwareQueueWeight  = 2
	llmAwareKVWeight     = 2
)

// llmAware scores every replica on what the engines report about themselves and what the proxy
// knows, in the spirit of llm-d's endpoint picker, and picks the highest score:
//
//	score(r) = 3 × prefix(r) − 2 × busy(r) / max(1, maxᵣ busy(r))
//	                         − 2 × queue(r) / max(1, maxᵣ queue(r)) − 2 × kv(r)
//
// where, for a replica whose metrics were scraped within MetricsStaleAfter:
//
//	busy(r)   = max(inFlight(r), running(r) + waiting(r))
//	queue(r)  = waiting(r) + max(0, inFlight(r) − running(r) − waiting(r))
//	kv(r)     = KV-cache usage, 0 to 1
//
// busy is least load's signal: without it a replica with no queue yet but a nearly full batch
// looked as good as an empty one. queue is the sharper signal that a request will wait for a
// batch slot. On bench/routing's trace replay neither closes the gap to least_load's p99 TTFT
// (llm_aware 958–1,051 ms with the busy term, 1,042–1,162 without, least_load 786–891) while
// llm_aware's prefix-cache hit rate is higher (47 % against 40 %); see docs/measurements.md,
// "Routing quality".
//
// The second term of queue is the requests the proxy has sent since the replica's last scrape
// (in flight here, not yet counted there): between two scrapes a burst would otherwise all go to
// the replica that looked emptiest. For a replica with stale or no metrics — just started, or
// its endpoint is failing — busy(r) is its in-flight count and queue(r) and kv(r) are 0, so it
// is judged on in-flight alone: a replica that has not been scraped yet is most likely empty, and a wedged
// one shows up in its growing in-flight count.
//
//	prefix(r) = leading prompt blocks sent to r / prompt blocks, 0 to 1
//
// from the same index as prefix_affinity, and 0 for a replica over the same load bound
// (affinityBound), so a prompt shared by every request cannot pile onto its holders. Queue
// depth is normalized by the snapshot's maximum, as llm-d's queue scorer does, so the weights
// compare like with like; KV usage and prefix match are already fractions.
//
// Ties go to the replica with fewer requests in flight here, then at random.
type llmAware struct {
	index      *prefixIndex
	factor     float64
	staleAfter int64 // nanoseconds
	now        func() time.Time
	rand       func() uint64
}

func newLLMAware(opts Options) (*llmAware, error) {
	index, err := newPrefixIndex(opts.PrefixCacheBlocks)
	if err != nil {
		return nil, err
	}
	return &llmAware{
		index:      index,
		factor:     opts.PrefixLoadFactor,
		staleAfter: int64(opts.MetricsStaleAfter),
		now:        opts.Now,
		rand:       opts.Rand,
	}, nil
}

// Needs reports that the picker reads the prompt and model, and scraped replica metrics.
func (*llmAware) Needs() Needs { return NeedsPrompt | NeedsMetrics }

// signals returns a replica's busy count, queue and KV usage as the score uses them, and its
// in-flight count.
func (p *llmAware) signals(r *Replica, now int64) (busy, queue int64, kv float64, inFlight int64) {
	inFlight = r.InFlight.Load()
	m := r.LoadMetrics()
	if m.UpdatedAt == 0 || now-m.UpdatedAt > p.staleAfter {
		return inFlight, 0, 0, inFlight
	}
	// The scraper stores what the replica said; a buggy exporter's negative counts, NaN, or
	// usage above 1 must not turn into a bonus, an outsized penalty, or an unordered score.
	waiting, running := max(0, m.Waiting), max(0, m.Running)
	unseen := max(0, inFlight-running-waiting)
	kv = m.KVCacheUsage
	if !(kv > 0) {
		kv = 0
	}
	return max(inFlight, running+waiting), waiting + unseen, min(kv, 1), inFlight
}

func (p *llmAware) Pick(req *Request, replicas []*Replica) *Replica {
	if len(replicas) == 0 {
		return nil
	}
	now := req.at(p.now).UnixNano()
	var m prefixMatch
	p.index.lookup(&m, req.Model, req.Prompt)
	bound := affinityBound(replicas, p.factor)

	var maxBusy, maxQueue int64 = 1, 1
	for _, r := range replicas {
		b, q, _, _ := p.signals(r, now)
		maxBusy, maxQueue = max(maxBusy, b), max(maxQueue, q)
	}

	var best *Replica
	var bestScore float64
	var bestLoad int64
	ties := uint64(0)
	for _, r := range replicas {
		busy, queue, kv, load := p.signals(r, now)
		// A counter may have grown since the first pass; keep each term within its weight.
		score := -llmAwareBusyWeight*min(float64(busy)/float64(maxBusy), 1) -
			llmAwareQueueWeight*min(float64(queue)/float64(maxQueue), 1) - llmAwareKVWeight*kv
		if float64(load+1) <= bound {
			score += llmAwarePrefixWeight * m.fraction(r)
		}
		switch {
		case best == nil || score > bestScore || (score == bestScore && load < bestLoad):
			best, bestScore, bestLoad, ties = r, score, load, 1
		case score == bestScore && load == bestLoad:
			ties++
			if p.rand()%ties == 0 {
				best = r
			}
		}
	}
	p.index.record(&m, best)
	return best
}
