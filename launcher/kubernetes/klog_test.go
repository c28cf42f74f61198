package kubernetes

import (
	"context"
	"errors"
	"net/url"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestKlogSinkLevels: client-go's errors are warnings, but not a watch ended by our own
// cancelled context (every launch ends the watch on its pod so), which is debug.
func TestKlogSinkLevels(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	sink := &zapSink{log: zap.New(core)}
	canceled := &url.Error{Op: "Get", URL: "https://127.0.0.1:6443/api/v1/namespaces/ferry/pods?watch=true", Err: context.Canceled}
	sink.Error(canceled, "Failed to watch", "type", "*v1.Pod")
	sink.Error(errors.New("connection refused"), "Failed to watch", "type", "*v1.Pod")
	entries := logs.All()
	if len(entries) != 2 {
		t.Fatalf("%d entries, want 2", len(entries))
	}
	if entries[0].Level != zapcore.DebugLevel {
		t.Errorf("a watch ended by our cancelled context logged at %s, want debug", entries[0].Level)
	}
	if entries[1].Level != zapcore.WarnLevel {
		t.Errorf("a failing watch logged at %s, want warn", entries[1].Level)
	}
}
