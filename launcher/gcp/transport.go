package gcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"github.com/googleapis/gax-go/v2"
	"google.golang.org/api/option"
	"google.golang.org/api/option/internaloption"
	htransport "google.golang.org/api/transport/http"

	"github.com/ferryserve/ferry/launcher"
)

// Deadlines. Every request Ferry sends to Compute Engine is cut after Options.RequestTimeout
// by the HTTP client itself, because a caller's ctx is not enough: the REST clients' List
// calls build their HTTP requests without it (and without the clients' call options), so a
// hung endpoint would hold a List, and every loop that lists, for as long as the TCP
// connection lives. The SDK's own retries of 503/504 (on gets) are bounded by
// Options.MaxAttempts, so that a call fails within about MaxAttempts × RequestTimeout and the
// provisioner's breakers, not the SDK, decide when to try again.

// Defaults for Options.
const (
	// DefaultRequestTimeout bounds one HTTP request to the API (and reading its answer).
	DefaultRequestTimeout = 30 * time.Second
	// DefaultMaxAttempts bounds the attempts of a call the SDK retries (reads on 503 and 504).
	DefaultMaxAttempts = 3
)

// RequestTimeoutError is a request to the API that got no whole answer within
// Options.RequestTimeout. It is launcher.ErrUnavailable, and a deadline
// (context.DeadlineExceeded), which opens the provisioner's breaker at once.
type RequestTimeoutError struct {
	Method, URL string
	Timeout     time.Duration
}

func (e *RequestTimeoutError) Error() string {
	return fmt.Sprintf("%s %s: no answer within %v", e.Method, e.URL, e.Timeout)
}

// Is matches launcher.ErrUnavailable and context.DeadlineExceeded.
func (e *RequestTimeoutError) Is(target error) bool {
	return target == launcher.ErrUnavailable || target == context.DeadlineExceeded
}

// timeoutTransport cuts each request, and the reading of its body, after timeout.
type timeoutTransport struct {
	base    http.RoundTripper
	timeout time.Duration
}

var _ http.RoundTripper = (*timeoutTransport)(nil)

func (t *timeoutTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	cut := &RequestTimeoutError{Method: req.Method, URL: req.URL.Redacted(), Timeout: t.timeout}
	ctx, cancel := context.WithTimeoutCause(req.Context(), t.timeout, cut)
	resp, err := t.base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, ourCut(ctx, cut, err)
	}
	resp.Body = &timedBody{ReadCloser: resp.Body, ctx: ctx, cut: cut, cancel: cancel}
	return resp, nil
}

// ourCut returns cut in place of err when it was this transport's deadline that ended the
// request, not the caller's ctx.
func ourCut(ctx context.Context, cut *RequestTimeoutError, err error) error {
	if ctx.Err() != nil && errors.Is(context.Cause(ctx), cut) {
		return fmt.Errorf("%w (%w)", cut, err)
	}
	return err
}

// timedBody is an answer's body read under its request's deadline; Close releases it.
type timedBody struct {
	io.ReadCloser
	ctx    context.Context
	cut    *RequestTimeoutError
	cancel context.CancelFunc
}

func (b *timedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = ourCut(b.ctx, b.cut, err)
	}
	return n, err
}

func (b *timedBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// isRequestTimeout reports whether err is a request RequestTimeout cut.
func isRequestTimeout(err error) bool {
	var cut *RequestTimeoutError
	return errors.As(err, &cut)
}

// newHTTPClient is the HTTP client every REST client of the provider shares: the one the
// Compute clients would build from copts (credentials, endpoint, user agent; the defaults they
// use, but the deprecated plain default endpoint, which the template replaces), with each
// request cut after timeout.
func newHTTPClient(ctx context.Context, copts []option.ClientOption, timeout time.Duration) (*http.Client, error) {
	defaults := []option.ClientOption{
		internaloption.WithDefaultEndpointTemplate("https://compute.UNIVERSE_DOMAIN"),
		internaloption.WithDefaultMTLSEndpoint("https://compute.mtls.googleapis.com"),
		internaloption.WithDefaultUniverseDomain("googleapis.com"),
		internaloption.WithDefaultAudience("https://compute.googleapis.com/"),
		internaloption.WithDefaultScopes(compute.DefaultAuthScopes()...),
		internaloption.EnableNewAuthLibrary(),
	}
	hc, _, err := htransport.NewClient(ctx, append(defaults, copts...)...)
	if err != nil {
		return nil, err
	}
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	out := *hc // a client passed in ClientOptions is not changed
	out.Transport = &timeoutTransport{base: base, timeout: timeout}
	return &out, nil
}

// boundRetries caps the attempts of every call a REST client's default options retry: each
// field of callOptions (a *XxxCallOptions, one []gax.CallOption per method) that resolves to a
// retryer gets the same retryer, bounded. The SDK's retryers back off with jitter but retry 503
// until the call's 10-minute timeout.
func boundRetries(callOptions any, maxAttempts int) {
	v := reflect.ValueOf(callOptions)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return
	}
	v = v.Elem()
	optsType := reflect.TypeFor[[]gax.CallOption]()
	for i := range v.NumField() {
		field := v.Field(i)
		if field.Type() != optsType || !field.CanSet() {
			continue
		}
		opts := field.Interface().([]gax.CallOption)
		var settings gax.CallSettings
		for _, o := range opts {
			o.Resolve(&settings)
		}
		if settings.Retry == nil {
			continue
		}
		retry := settings.Retry
		bounded := append(opts[:len(opts):len(opts)], gax.WithRetry(func() gax.Retryer {
			return &boundedRetryer{inner: retry(), left: maxAttempts - 1}
		}))
		field.Set(reflect.ValueOf(bounded))
	}
}

// boundedRetryer lets inner decide and pause, left more times.
type boundedRetryer struct {
	inner gax.Retryer
	left  int
}

func (r *boundedRetryer) Retry(err error) (time.Duration, bool) {
	if r.left <= 0 || r.inner == nil {
		return 0, false
	}
	r.left--
	return r.inner.Retry(err)
}
