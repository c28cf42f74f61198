package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp/fasthttputil"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/zap"
)

// discardExporter takes spans and keeps none: the SDK's work without an exporter's.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// BenchmarkTracing is BenchmarkProxyNonStream's traffic (one replica) with tracing off and on,
// reporting the whole process's CPU per request (client, proxy, replica and exporter) beside
// allocations:
//
//	off          ServiceConfig.Tracing nil
//	unsampled    on, sampling no new trace: propagation only (the replica still gets a traceparent)
//	sync         on, every trace sampled, each span handed to a discarding exporter as it ends
//	batch        on, every trace sampled, the batch span processor in front of that exporter
//	otlp         on, every trace sampled, the batch processor and the OTLP/HTTP exporter
//	             posting protobuf to a collector on loopback that reads and drops it
//
// The batch variants block on a full queue (the default drops spans the exporter cannot keep
// up with) and are flushed before the clock stops, so that every span's export is counted.
func BenchmarkTracing(b *testing.B) {
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	b.Cleanup(collector.Close)
	variants := []struct {
		name     string
		provider func(b *testing.B) *sdktrace.TracerProvider
	}{
		{"off", nil},
		{"unsampled", func(*testing.B) *sdktrace.TracerProvider {
			return sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()), sdktrace.WithSyncer(discardExporter{}))
		}},
		{"sync", func(*testing.B) *sdktrace.TracerProvider {
			return sdktrace.NewTracerProvider(sdktrace.WithSyncer(discardExporter{}))
		}},
		{"batch", func(*testing.B) *sdktrace.TracerProvider {
			return sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}, sdktrace.WithBlocking()))
		}},
		{"otlp", func(b *testing.B) *sdktrace.TracerProvider {
			exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(collector.URL+"/v1/traces"))
			if err != nil {
				b.Fatal(err)
			}
			return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBlocking()))
		}},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			cfg := ServiceConfig{Name: "bench", Logger: zap.NewNop()}
			var tp *sdktrace.TracerProvider
			if v.provider != nil {
				tp = v.provider(b)
				b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				cfg.Tracing = NewTracing(tp)
			}
			svc, err := NewService(cfg)
			if err != nil {
				b.Fatal(err)
			}
			upstream := startMemUpstream(b)
			svc.dial = func(string) (net.Conn, error) { return upstream.Dial() }
			svc.SetBackends([]Backend{{ID: 1, Addr: "10.0.0.1:8000", Version: 1}})
			ln := fasthttputil.NewInmemoryListener()
			go func() { _ = svc.Serve(ln) }()
			b.Cleanup(func() { _ = svc.Shutdown(context.Background()) })

			start := rusageCPU(b)
			benchRequests(b, memClient(ln))
			if tp != nil { // the exporter's work counts: every span goes out before the clock stops
				if err := tp.ForceFlush(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(rusageCPU(b)-start)/float64(b.N), "cpu-ns/op")
		})
	}
}

// rusageCPU is the process's CPU time so far, user and system.
func rusageCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
