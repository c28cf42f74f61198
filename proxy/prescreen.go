package proxy

import (
	"bytes"
	"time"

	"github.com/valyala/fasthttp"
)

// A request is judged as soon as its headers are read (fasthttp's Server.HeaderReceived),
// before the server reads its body, which fasthttp allocates at its announced length. A request
// that will be refused anyway has its body cut: no valid API key (answered 401), or a body
// that would exceed the process's budget of bodies being read (503 with Retry-After, budget.go).
// A body over the service's limit needs nothing here: fasthttp answers 413 before reading it.
// A request framed both by Transfer-Encoding and by Content-Length is served, then its connection
// closed.
//
// Missing keys are refused at every size. A presented key is checked here only for a large body
// (over smallBodySize, or chunked), where the key index is handed to the handler so the key is
// hashed once; a small body is read first and its key checked by screen.

var nameContentLength = []byte("Content-Length")

// closeIfFramedTwice closes the connection after a request whose headers carry both
// Transfer-Encoding and Content-Length, as RFC 9112 §6.1 requires: fasthttp reads it by its
// Transfer-Encoding, while whoever sent it on may have read it by its length, and the rest of the
// connection would then mean different requests to them and to us (request smuggling). The
// parsed header keeps only one of the two, so the raw header lines are read.
func closeIfFramedTwice(h *fasthttp.RequestHeader) {
	var te, cl bool
	for raw := h.RawHeaders(); len(raw) > 0; {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		// fasthttp has refused a name followed by anything but its colon.
		switch {
		case len(line) > len(nameContentLength) && line[len(nameContentLength)] == ':':
			cl = cl || bytes.EqualFold(line[:len(nameContentLength)], nameContentLength)
		case len(line) > len(nameTransferEncoding) && line[len(nameTransferEncoding)] == ':':
			te = te || bytes.EqualFold(line[:len(nameTransferEncoding)], nameTransferEncoding)
		}
	}
	if te && cl {
		h.SetConnectionClose()
	}
}

// cutBody makes the server skip a refused request's body and close the connection after the
// answer: the body is never read, and left on the connection its bytes would be taken for the
// next request.
func cutBody(h *fasthttp.RequestHeader) {
	h.SetContentLength(0) // also drops Transfer-Encoding: chunked
	h.DelBytes(headerExpect)
	h.SetConnectionClose()
}

// announcedBody is the length of the body a request's headers announce: ok is false for none,
// and size is -1 for a chunked body. large says whether the body is counted in the budget.
func announcedBody(h *fasthttp.RequestHeader) (size int64, large, ok bool) {
	switch n := h.ContentLength(); {
	case n == -1:
		return -1, true, true
	case n > 0:
		return int64(n), n > smallBodySize, true
	default: // 0, or -2: no body (a request's body ends by length or chunking, never by close)
		return 0, false, false
	}
}

// headerReceived is the service server's HeaderReceived: see the comment at the top.
func (s *Service) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	size, large, ok := announcedBody(h)
	if !ok {
		return fasthttp.RequestConfig{}
	}
	closeIfFramedTwice(h)
	var key int32
	if s.keys != nil {
		c := presented(h)
		if len(c.key) == 0 {
			cutBody(h) // screen answers 401
			return fasthttp.RequestConfig{}
		}
		if large {
			i, ok := s.keys.match(&c)
			if !ok && !s.tenancy.allows(&c) {
				cutBody(h)
				return fasthttp.RequestConfig{}
			}
			if ok {
				key = int32(i) + 1
			}
		}
	}
	s.front.reserveBody(h, size, large, int64(s.cfg.MaxRequestBodySize), key, s.cfg.RequestReadTimeout)
	return fasthttp.RequestConfig{}
}

// reserveBody counts a large body of an admitted request in the budget, or cuts it and leaves a
// refusal when the budget is spent. Chunked bodies count as the largest allowed; bodies over
// maxBody are left to the server, which refuses them before reading.
func (f *frontend) reserveBody(h *fasthttp.RequestHeader, size int64, large bool, maxBody int64, key int32, readTimeout time.Duration) {
	if !large || size > maxBody {
		return
	}
	if size < 0 {
		size = maxBody
	}
	now := time.Now()
	expires := expiry(now, readTimeout)
	if !f.guard.bodies.reserve(h, size, key, now.UnixNano(), expires) {
		f.guard.bodies.refuse(h, refuseBodies, expires)
		cutBody(h)
	}
}

// headerReceived is the gateway server's HeaderReceived. The service is not known before the
// body is read, so only a request that no service would take is refused for its key: when every
// service requires one and the request carries none, or (large bodies) none of any service's.
func (g *Gateway) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	size, large, ok := announcedBody(h)
	if !ok {
		return fasthttp.RequestConfig{}
	}
	closeIfFramedTwice(h)
	if t := g.table.Load(); t.allKeyed {
		if c := presented(h); len(c.key) == 0 || large && !t.keys.allows(&c) {
			cutBody(h) // Handler answers 401
			return fasthttp.RequestConfig{}
		}
	}
	g.front.reserveBody(h, size, large, int64(g.cfg.MaxRequestBodySize), 0, defaultRequestReadTimeout)
	return fasthttp.RequestConfig{}
}
