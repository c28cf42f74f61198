package proxy

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap/zapcore"
)

// The proxy's log samplers. zapcore.NewSamplerWithOptions keeps a fixed table of 4096 counters
// for each of 7 levels, 448 KiB, in every sampler; a controller makes two or three for each
// service's proxy, so a hundred services held over 130 MiB of counters that count a handful of
// messages. This sampler decides the same way (per level and message: the first `first` lines
// of each tick, then every `thereafter`-th) over a table of sampleSlots counters a level, 7 KiB.
// Messages that hash to one slot are counted together, which only samples them a little sooner;
// the proxy logs a few dozen distinct messages.

// sampleSlots is the number of counters per level, a power of two.
const sampleSlots = 64

// sampleCounter counts one slot's lines in the current tick.
type sampleCounter struct {
	resetAt atomic.Int64 // unix nanoseconds when the tick ends
	n       atomic.Uint64
}

// sampleCounters are every level's slots, shared by a sampler and the cores its With makes.
type sampleCounters [zapcore.FatalLevel - zapcore.DebugLevel + 1][sampleSlots]sampleCounter

// sampler is a zapcore.Core that drops lines as zapcore's sampler does, with a small table.
type sampler struct {
	zapcore.Core
	counts            *sampleCounters
	tick              time.Duration
	first, thereafter uint64
}

var _ zapcore.Core = (*sampler)(nil)

// newSampler wraps core: each tick, the first `first` lines of a level and message, then every
// `thereafter`-th (none when 0).
func newSampler(core zapcore.Core, tick time.Duration, first, thereafter int) zapcore.Core {
	return &sampler{Core: core, counts: &sampleCounters{}, tick: tick, first: uint64(first), thereafter: uint64(thereafter)}
}

// Level is the wrapped core's, so that zap.Logger.Level sees through the sampler.
func (s *sampler) Level() zapcore.Level { return zapcore.LevelOf(s.Core) }

func (s *sampler) With(fields []zapcore.Field) zapcore.Core {
	return &sampler{Core: s.Core.With(fields), counts: s.counts, tick: s.tick, first: s.first, thereafter: s.thereafter}
}

func (s *sampler) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if !s.Enabled(ent.Level) {
		return ce
	}
	if ent.Level >= zapcore.DebugLevel && ent.Level <= zapcore.FatalLevel {
		c := &s.counts[ent.Level-zapcore.DebugLevel][fnv32a(ent.Message)%sampleSlots]
		n := c.inc(ent.Time.UnixNano(), s.tick)
		if n > s.first && (s.thereafter == 0 || (n-s.first)%s.thereafter != 0) {
			return ce
		}
	}
	return s.Core.Check(ent, ce)
}

// inc counts a line at now (unix nanoseconds) and returns its number in the current tick,
// starting a new tick when the last one ended.
func (c *sampleCounter) inc(now int64, tick time.Duration) uint64 {
	resetAt := c.resetAt.Load()
	if resetAt > now {
		return c.n.Add(1)
	}
	c.n.Store(1)
	if !c.resetAt.CompareAndSwap(resetAt, now+tick.Nanoseconds()) {
		return c.n.Add(1) // another line started the tick
	}
	return 1
}

// fnv32a is FNV-1a of s, without converting it to bytes.
func fnv32a(s string) uint32 {
	hash := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		hash ^= uint32(s[i])
		hash *= 16777619
	}
	return hash
}
