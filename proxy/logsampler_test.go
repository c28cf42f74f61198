package proxy

import (
	"testing"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestSamplerSamplesAsZapDoes checks the compact sampler's decisions against zapcore's: per level
// and message, the first lines of a tick, then every thereafter-th, counted afresh each tick and
// across the loggers With makes; and that it keeps 7 KiB of counters, not zap's 448 KiB.
func TestSamplerSamplesAsZapDoes(t *testing.T) {
	const first, thereafter = 3, 4
	base := time.Unix(1_700_000_000, 0)
	core, logs := observer.New(zapcore.DebugLevel)
	ours := zap.New(newSampler(core, time.Second, first, thereafter))
	zapCore, zapLogs := observer.New(zapcore.DebugLevel)
	theirs := zap.New(zapcore.NewSamplerWithOptions(zapCore, time.Second, first, thereafter))
	// Entries go to the cores directly: zap.Logger.Check would stamp them with the clock.
	for _, sampled := range []zapcore.Core{ours.Core(), theirs.Core()} {
		with := sampled.With([]zapcore.Field{zap.String("service", "s")})
		for tick := range 2 {
			for i := range 20 {
				at := base.Add(time.Duration(tick)*time.Second + time.Duration(i)*time.Millisecond)
				for _, c := range []zapcore.Core{sampled, with} {
					for _, e := range []zapcore.Entry{{Level: zapcore.InfoLevel, Message: "a", Time: at}, {Level: zapcore.WarnLevel, Message: "a", Time: at}, {Level: zapcore.InfoLevel, Message: "b", Time: at}} {
						if ce := c.Check(e, nil); ce != nil {
							ce.Write()
						}
					}
				}
			}
		}
	}
	if got, want := logs.Len(), zapLogs.Len(); got != want || got == 0 {
		t.Fatalf("kept %d lines, zapcore's sampler %d", got, want)
	}
	for i, e := range logs.All() {
		z := zapLogs.All()[i]
		if e.Level != z.Level || e.Message != z.Message || !e.Time.Equal(z.Time) {
			t.Fatalf("line %d: %v %q at %v, zapcore's sampler %v %q at %v", i, e.Level, e.Message, e.Time, z.Level, z.Message, z.Time)
		}
	}
	if size := int(unsafe.Sizeof(sampleCounters{})); size > 8<<10 {
		t.Errorf("counters take %d bytes, want at most 8 KiB", size)
	}
	if ours.Level() != zapcore.DebugLevel {
		t.Errorf("Level() = %v, want the wrapped core's", ours.Level())
	}
}
