package kubernetes

import (
	"context"
	"errors"
	"sync"

	"github.com/go-logr/logr"
	"go.uber.org/zap"
	"k8s.io/klog/v2"
)

// client-go logs through klog, to stderr by default, in its own format. routeKlog sends klog
// through the first provider's zap logger instead, errors as warnings (client-go retries them)
// and the rest at debug. An error that is our own cancelled context is no warning: every
// launch ends the watch on its pod that way, and at 1,000 pods "Failed to watch ... context
// canceled" was 1,820 warnings of a run's log (bench/kubescale).
var klogOnce sync.Once

func routeKlog(log *zap.Logger) {
	klogOnce.Do(func() {
		klog.SetLogger(logr.New(&zapSink{log: log.Named("client-go").WithOptions(zap.AddCallerSkip(2))}))
	})
}

// zapSink is a logr.LogSink over zap.
type zapSink struct {
	log  *zap.Logger
	name string
}

func (s *zapSink) Init(logr.RuntimeInfo) {}

// Enabled keeps klog's verbose levels (V(2) and up) out: they are chatty at debug too.
func (s *zapSink) Enabled(level int) bool { return level <= 1 && s.log.Core().Enabled(zap.DebugLevel) }

func (s *zapSink) Info(_ int, msg string, kv ...any) {
	s.log.Debug(msg, zapFields(kv)...)
}

func (s *zapSink) Error(err error, msg string, kv ...any) {
	if errors.Is(err, context.Canceled) {
		s.log.Debug(msg, append(zapFields(kv), zap.Error(err))...)
		return
	}
	s.log.Warn(msg, append(zapFields(kv), zap.Error(err))...)
}

func (s *zapSink) WithValues(kv ...any) logr.LogSink {
	return &zapSink{log: s.log.With(zapFields(kv)...), name: s.name}
}

func (s *zapSink) WithName(name string) logr.LogSink {
	return &zapSink{log: s.log.Named(name), name: name}
}

func zapFields(kv []any) []zap.Field {
	out := make([]zap.Field, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		k, ok := kv[i].(string)
		if !ok {
			continue
		}
		out = append(out, zap.Any(k, kv[i+1]))
	}
	return out
}
