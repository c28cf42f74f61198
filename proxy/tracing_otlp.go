package proxy

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// OTLP's standard environment variables, which StartOTLP honours when no endpoint is given.
const (
	EnvOTLPEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvOTLPTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
)

// OTLPConfig says where a process's spans go.
type OTLPConfig struct {
	// Endpoint is the collector's OTLP/HTTP URL: a base such as http://collector:4318, to which
	// /v1/traces is added, or a URL with a path, used as it is. Empty: the environment's
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT (with the exporter's
	// other OTEL_EXPORTER_OTLP_* settings); with neither, tracing is off.
	Endpoint string
	// SampleRatio is the share of new traces recorded, in (0, 1]; zero means 1. A request that
	// comes with a sampled or unsampled traceparent follows its parent's decision.
	SampleRatio float64
	// ServiceName is the resource's service.name unless OTEL_SERVICE_NAME sets it.
	ServiceName string
}

// Enabled reports whether c names a collector, by itself or through the environment.
func (c OTLPConfig) Enabled() bool {
	return c.Endpoint != "" || os.Getenv(EnvOTLPTracesEndpoint) != "" || os.Getenv(EnvOTLPEndpoint) != ""
}

// Validate checks the endpoint and the ratio.
func (c OTLPConfig) Validate() error {
	if c.SampleRatio < 0 || c.SampleRatio > 1 || c.SampleRatio != c.SampleRatio {
		return fmt.Errorf("trace sample ratio %g: want a number in (0, 1]", c.SampleRatio)
	}
	if c.Endpoint == "" {
		return nil
	}
	u, err := url.Parse(c.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("OTLP endpoint %q: want http(s)://HOST:PORT[/PATH]", c.Endpoint)
	}
	return nil
}

// StartOTLP starts exporting spans over OTLP/HTTP in batches, and returns the Tracing to give
// the services and gateways; nil, nil when c names no collector (tracing off). Shutdown
// flushes it.
func StartOTLP(ctx context.Context, c OTLPConfig) (*Tracing, error) {
	if !c.Enabled() {
		return nil, nil
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var opts []otlptracehttp.Option
	if c.Endpoint != "" {
		endpoint := c.Endpoint
		if u, _ := url.Parse(endpoint); u.Path == "" || u.Path == "/" {
			endpoint = strings.TrimSuffix(endpoint, "/") + "/v1/traces"
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(endpoint))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName(c.ServiceName)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("OTLP trace resource: %w", err)
	}
	ratio := c.SampleRatio
	if ratio == 0 {
		ratio = 1
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))))
	t := NewTracing(tp)
	t.shutdown = tp.Shutdown
	return t, nil
}
