package proxy

import "fmt"

// Per-service limits beyond the server's own (header and body size, read timeout; server.go):
// requests in flight (Handler), each client's request rate (ratelimit.go) and streams in flight
// (here). Each refuses with 429 in OpenAI's error shape, so SDKs back off and retry.

// admitStream counts a streaming request against MaxConcurrentStreams and reports whether it
// may go on. The slot is held until the exchange is released, when the stream has ended.
// Requests that do not stream, and every request while the limit is off, pass untouched.
func (s *Service) admitStream(ex *exchange) bool {
	limit := s.cfg.MaxConcurrentStreams
	if limit <= 0 || !ex.stream {
		return true
	}
	if s.streams.Add(1) > int64(limit) {
		s.streams.Add(-1)
		return false
	}
	ex.streamSlot = true
	return true
}

// releaseStream gives back the slot admitStream took, if any.
func (s *Service) releaseStream(ex *exchange) {
	if ex.streamSlot {
		s.streams.Add(-1)
		ex.streamSlot = false
	}
	ex.stream = false
}

// withLimitBodies adds the answers of the rate and stream limits. They name the limit, so that
// a client can tell its own rate from the service's capacity, and the way around the stream
// limit (ask without streaming).
func (e errorBodies) withLimitBodies(service string, rate RateLimit, perKey bool, maxStreams int) errorBodies {
	if rate.enabled() {
		burst := rate.Burst
		if burst <= 0 {
			burst = newRateLimiterBurst(rate)
		}
		per := "client address"
		if perKey {
			per = "API key"
		}
		e.rateLimited = openAIError(fmt.Sprintf("rate limit exceeded for service %q: %g requests per second per %s, bursts of up to %d; retry after the seconds in Retry-After",
			service, rate.RequestsPerSecond, per, burst), "rate_limit_error", "rate_limit_exceeded")
	}
	if maxStreams > 0 {
		e.tooManyStreams = openAIError(fmt.Sprintf("service %q is at its limit of %d concurrent streams; retry shortly, or send the request without \"stream\": true",
			service, maxStreams), "rate_limit_error", "too_many_streams")
	}
	return e
}
