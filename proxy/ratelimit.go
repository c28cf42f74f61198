package proxy

import (
	"hash/maphash"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// RateLimit is a token bucket per client: Burst requests at once, refilled at RequestsPerSecond.
// A client is an API key when the service requires one, else a client address (an IPv6 client
// by its /64, which is what one host or one customer usually holds). The zero value, or a
// non-positive RequestsPerSecond, limits nothing.
type RateLimit struct {
	RequestsPerSecond float64
	// Burst is the bucket's size; zero means RequestsPerSecond rounded up, at least 1.
	Burst int
}

func (r RateLimit) enabled() bool { return r.RequestsPerSecond > 0 }

// Bounds of the per-address buckets: memory stays bounded however many addresses a flood
// comes from.
const (
	// rateShards spreads addresses over independently locked tables, so concurrent requests
	// from different clients rarely wait on each other.
	rateShards = 32
	// rateShardCap bounds each table: 32 × 2048 = 65,536 addresses tracked at once, about
	// 3 MiB at most.
	rateShardCap = 2048
	// rateEvictSample is how many entries a full table looks at to pick one to forget when no
	// entry is idle.
	rateEvictSample = 8
)

// rateLimiter decides with GCRA (the generic cell rate algorithm), which is a token bucket kept
// as one number per client: tat, the theoretical arrival time at which the client's bucket is
// full again. A request at now is admitted when tat − now ≤ (burst − 1) × interval, and moves
// tat to max(tat, now) + interval. A bucket whose tat has passed is full, so forgetting it loses
// nothing: that is what makes eviction safe.
//
// Times are nanoseconds on the limiter's own monotonic clock (since epoch), and tat 0 is a full
// bucket. Keys of an authenticated service are its API keys, a fixed set, so each has an
// atomic slot and the check is lock-free; addresses are unbounded, so they live in sharded maps
// under short locks, with eviction.
type rateLimiter struct {
	interval  int64 // nanoseconds per token
	tolerance int64 // (burst − 1) × interval: how far ahead of now tat may run
	burst     int64
	epoch     time.Time

	keys   []atomic.Int64 // tat per API key, indexed as apiKeys.hashes; nil without auth
	seed   maphash.Seed
	shards [rateShards]rateShard
}

type rateShard struct {
	mu   sync.Mutex
	tats map[[16]byte]int64
	// sweepAt is when a full table may next be swept whole (limiter clock).
	sweepAt int64
	_       [32]byte // keeps neighbouring shards' locks off one cache line
}

// rateSweepEvery spaces the whole-table sweeps of a full table: under a flood from many
// addresses a sweep per new address would cost a table scan per request.
const rateSweepEvery = int64(time.Second)

// newRateLimiter returns nil when r limits nothing. keys is the number of API keys, 0 when the
// service has no auth (then addresses are the clients).
func newRateLimiter(r RateLimit, keys int) *rateLimiter {
	if !r.enabled() {
		return nil
	}
	burst := r.Burst
	if burst <= 0 {
		burst = newRateLimiterBurst(r)
	}
	// At least 1 ns, at most about 31 years per token: the arithmetic below never overflows.
	interval := int64(math.Min(math.Max(float64(time.Second)/r.RequestsPerSecond, 1), 1e18))
	l := &rateLimiter{
		interval:  interval,
		tolerance: int64(math.Min(float64(burst-1)*float64(interval), 4e18)),
		burst:     int64(burst),
		epoch:     time.Now(),
		seed:      maphash.MakeSeed(),
	}
	if keys > 0 {
		l.keys = make([]atomic.Int64, keys)
	}
	return l
}

// newRateLimiterBurst is the default burst: one second's worth, at least 1.
func newRateLimiterBurst(r RateLimit) int {
	return max(1, int(math.Min(math.Ceil(r.RequestsPerSecond), math.MaxInt32)))
}

// now is the limiter's clock.
func (l *rateLimiter) now() int64 { return int64(time.Since(l.epoch)) }

// admitKey decides for API key number key at now; when it refuses, wait is how long until the
// key's next request would be admitted. tat is the key's bucket after the decision (state).
func (l *rateLimiter) admitKey(key int, now int64) (tat int64, wait time.Duration, ok bool) {
	slot := &l.keys[key]
	for {
		old := slot.Load()
		next, wait, ok := l.step(old, now)
		if !ok {
			return old, wait, false
		}
		if slot.CompareAndSwap(old, next) {
			return next, 0, true
		}
	}
}

// admitAddr decides for a client address at now, as admitKey does for a key.
func (l *rateLimiter) admitAddr(ip net.IP, now int64) (tat int64, wait time.Duration, ok bool) {
	key := addrKey(ip)
	sh := &l.shards[maphash.Bytes(l.seed, key[:])%rateShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.tats == nil {
		sh.tats = make(map[[16]byte]int64, 64)
	}
	old, known := sh.tats[key]
	next, wait, ok := l.step(old, now)
	if !ok {
		return old, wait, false
	}
	if !known && len(sh.tats) >= rateShardCap {
		sh.evict(now)
	}
	sh.tats[key] = next
	return next, 0, true
}

// step is GCRA: the bucket's next tat when a request at now is admitted, or how long until one
// would be.
func (l *rateLimiter) step(tat, now int64) (next int64, wait time.Duration, ok bool) {
	t := max(tat, now)
	if ahead := t - now - l.tolerance; ahead > 0 {
		return tat, time.Duration(ahead), false
	}
	return t + l.interval, 0, true
}

// evict makes room in a full table: by forgetting every full bucket (tat passed, so nothing is
// lost), at most once per rateSweepEvery, else the fullest of a few sampled buckets, which
// loses nothing either when that one is idle and otherwise hands its client a fresh bucket.
// Only a flood from more addresses than the tables hold gets there.
func (sh *rateShard) evict(now int64) {
	if now >= sh.sweepAt {
		sh.sweepAt = now + rateSweepEvery
		for k, tat := range sh.tats {
			if tat <= now {
				delete(sh.tats, k)
			}
		}
		if len(sh.tats) < rateShardCap {
			return
		}
	}
	var victim [16]byte
	lowest, seen := int64(math.MaxInt64), 0
	for k, tat := range sh.tats { // map order is random: a random sample
		if tat < lowest {
			victim, lowest = k, tat
		}
		if seen++; seen == rateEvictSample {
			break
		}
	}
	delete(sh.tats, victim)
}

// addrKey is a client address as a map key: IPv4 (and IPv4-mapped IPv6) whole, IPv6 by its /64.
func addrKey(ip net.IP) [16]byte {
	var k [16]byte
	if v4 := ip.To4(); v4 != nil {
		copy(k[12:], v4)
		k[10], k[11] = 0xff, 0xff
		return k
	}
	copy(k[:8], ip) // a nil or short IP leaves zeros: one shared bucket for unknown addresses
	return k
}

// admitRate applies the service's rate limit to a request whose API key is number key (-1 without
// auth), and notes the client's bucket after the decision in rate. On refusal it answers 429
// with Retry-After and reports false.
func (s *Service) admitRate(ctx *fasthttp.RequestCtx, key int, rate *rateState) bool {
	l := s.limiter
	var tat int64
	var wait time.Duration
	var ok bool
	now := l.now()
	if key >= 0 && l.keys != nil {
		tat, wait, ok = l.admitKey(key, now)
	} else {
		tat, wait, ok = l.admitAddr(ctx.RemoteIP(), now)
	}
	*rate = l.state(tat, now)
	if ok {
		return true
	}
	writeError(ctx, fasthttp.StatusTooManyRequests, s.errs.rateLimited)
	setRetryAfter(ctx, wait)
	return false
}

// rateState is a client's request bucket as OpenAI's API reports its own, in the
// x-ratelimit-{limit,remaining,reset}-requests headers of every answer: the bucket's size,
// the requests it would admit at once now, and the time until it is full again. set is false
// when the service limits nothing.
type rateState struct {
	set              bool
	limit, remaining int64
	reset            time.Duration
	// The managed key's token window, for the -tokens headers (tenancy.go).
	tokens                 bool
	tokLimit, tokRemaining int64
	tokReset               time.Duration
}

// state reads a bucket whose tat is tat at now.
func (l *rateLimiter) state(tat, now int64) rateState {
	ahead := max(tat-now, 0)
	remaining := (l.tolerance + l.interval - ahead) / l.interval
	return rateState{set: true, limit: l.burst, remaining: min(max(remaining, 0), l.burst), reset: time.Duration(ahead)}
}

var (
	headerRateLimitRequests     = []byte("X-Ratelimit-Limit-Requests")
	headerRateRemainingRequests = []byte("X-Ratelimit-Remaining-Requests")
	headerRateResetRequests     = []byte("X-Ratelimit-Reset-Requests")
)

// write sets the headers on an answer, after everything else has written its headers (a
// replica's answer replaces them, an error resets them). The reset is in OpenAI's spelling,
// Go's duration to the millisecond ("1s", "6m0s", "250ms").
func (r rateState) write(h *fasthttp.ResponseHeader) {
	r.writeTokens(h)
	if !r.set {
		return
	}
	var buf [24]byte
	h.SetCanonical(headerRateLimitRequests, strconv.AppendInt(buf[:0], r.limit, 10))
	h.SetCanonical(headerRateRemainingRequests, strconv.AppendInt(buf[:0], r.remaining, 10))
	h.SetCanonical(headerRateResetRequests, appendReset(buf[:0], r.reset))
}

// setRetryAfter tells a refused client to wait, in whole seconds rounded up: a client that
// honours it is admitted on its next try.
func setRetryAfter(ctx *fasthttp.RequestCtx, wait time.Duration) {
	secs := max(1, int64((wait+time.Second-1)/time.Second))
	var buf [20]byte
	ctx.Response.Header.SetBytesKV(headerRetryAfter, strconv.AppendInt(buf[:0], secs, 10))
}
