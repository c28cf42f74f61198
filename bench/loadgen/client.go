package loadgen

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// ErrNotLoopback is returned for a target outside 127.0.0.0/8 and ::1: the drivers generate
// load only against processes they started on this machine.
var ErrNotLoopback = errors.New("loadgen: target is not a loopback address")

// StatusError is a response whose status was not 200.
type StatusError struct {
	Status int
	Body   string // the first bytes, to say why
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("HTTP %d: %s", e.Status, e.Body)
}

// ErrNotEventStream is a streamed request answered with something other than
// text/event-stream, as a proxy that buffers or rewrites the response might.
var ErrNotEventStream = errors.New("loadgen: response is not text/event-stream")

// ErrIncompleteStream is an event stream that ended without its data: [DONE] event.
var ErrIncompleteStream = errors.New("loadgen: stream ended before data: [DONE]")

// CheckLoopback returns ErrNotLoopback unless addr (host:port) names a loopback IP.
func CheckLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("loadgen: target %q: %w", addr, err)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.IsLoopback() {
		return fmt.Errorf("%w: %q", ErrNotLoopback, addr)
	}
	return nil
}

// Client sends requests to one loopback HTTP server over a pool of keep-alive connections.
// It is safe for concurrent use.
type Client struct {
	addr    string
	plain   *fasthttp.HostClient // buffers whole responses
	stream  *fasthttp.HostClient // hands the body over as it arrives
	readers sync.Pool            // *bufio.Reader for event streams
}

// NewClient returns a client for addr that keeps up to maxConns connections open and gives up
// on a request that has not been answered completely within timeout.
func NewClient(addr string, maxConns int, timeout time.Duration) (*Client, error) {
	if err := CheckLoopback(addr); err != nil {
		return nil, err
	}
	mk := func(stream bool) *fasthttp.HostClient {
		return &fasthttp.HostClient{
			Addr:                      addr,
			MaxConns:                  maxConns,
			ReadTimeout:               timeout, // fasthttp sets it once per response: a bound on the whole stream
			WriteTimeout:              timeout,
			MaxIdemponentCallAttempts: 1,
			RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
			StreamResponseBody:        stream,
			NoDefaultUserAgentHeader:  true,
			MaxIdleConnDuration:       time.Minute,
		}
	}
	c := &Client{addr: addr, plain: mk(false), stream: mk(true)}
	c.readers.New = func() any { return bufio.NewReaderSize(nil, 16<<10) }
	return c, nil
}

// Addr is the server's host:port.
func (c *Client) Addr() string { return c.addr }

// CloseIdleConnections closes the pooled connections, so that a finished run holds no sockets.
func (c *Client) CloseIdleConnections() {
	c.plain.CloseIdleConnections()
	c.stream.CloseIdleConnections()
}

// Header is one request header.
type Header struct{ Key, Value string }

func (c *Client) newRequest(method, path string, body []byte, headers []Header) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.Header.SetMethod(method)
	req.SetRequestURI(path)
	req.Header.SetHost(c.addr)
	if body != nil {
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(body)
	}
	for _, h := range headers {
		req.Header.Set(h.Key, h.Value)
	}
	return req
}

// Do sends one request and reads the whole response. A status other than 200 is a *StatusError.
// It returns the response body's length.
func (c *Client) Do(method, path string, body []byte, headers []Header) (int, error) {
	req := c.newRequest(method, path, body, headers)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	if err := c.plain.Do(req, resp); err != nil {
		return 0, err
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return 0, &StatusError{Status: resp.StatusCode(), Body: snippet(resp.Body())}
	}
	return len(resp.Body()), nil
}

// StreamResult describes one event stream read to its end.
type StreamResult struct {
	// TTFB is the time from sending the request to having read the first data event.
	TTFB time.Duration
	// Total is the time from sending the request to the end of the body.
	Total time.Duration
	// Events counts data events, [DONE] included.
	Events int
	// Last is a copy of the last data payload before [DONE] (for OpenAI streams with
	// include_usage, the usage chunk), cut at the reader's buffer size.
	Last []byte
}

// Stream sends a POST and reads the text/event-stream response to its end. It fails unless the
// status is 200, the content type is an event stream, and the stream ends with data: [DONE].
func (c *Client) Stream(path string, body []byte, headers []Header) (StreamResult, error) {
	req := c.newRequest(fasthttp.MethodPost, path, body, headers)
	req.Header.Set("Accept", "text/event-stream")
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)

	start := time.Now()
	if err := c.stream.Do(req, resp); err != nil {
		return StreamResult{}, err
	}
	defer func() { _ = resp.CloseBodyStream() }()
	var src io.Reader = resp.BodyStream()
	if src == nil { // fasthttp read a small body whole
		src = bytes.NewReader(resp.Body())
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(src, 512))
		return StreamResult{}, &StatusError{Status: resp.StatusCode(), Body: snippet(b)}
	}
	if !bytes.HasPrefix(resp.Header.ContentType(), []byte("text/event-stream")) {
		return StreamResult{}, fmt.Errorf("%w: %q", ErrNotEventStream, resp.Header.ContentType())
	}
	br := c.readers.Get().(*bufio.Reader)
	br.Reset(src)
	defer func() {
		br.Reset(nil)
		c.readers.Put(br)
	}()
	res, err := ReadEvents(br, start)
	res.Total = time.Since(start)
	return res, err
}

// ReadEvents reads server-sent events from br until [DONE] and the end of the body, timing the
// first data event from start. Only data lines are interpreted; comments, event names and ids
// are skipped, as an OpenAI client does.
func ReadEvents(br *bufio.Reader, start time.Time) (StreamResult, error) {
	var res StreamResult
	done := false
	for {
		line, err := br.ReadSlice('\n')
		if payload, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			payload = bytes.TrimSpace(payload)
			res.Events++
			if res.Events == 1 {
				res.TTFB = time.Since(start)
			}
			if bytes.Equal(payload, []byte("[DONE]")) {
				done = true
			} else {
				res.Last = append(res.Last[:0], payload...)
			}
		}
		// A line longer than the buffer was counted by its start; skip the rest of it.
		for errors.Is(err, bufio.ErrBufferFull) {
			_, err = br.ReadSlice('\n')
		}
		if errors.Is(err, io.EOF) {
			if !done {
				return res, ErrIncompleteStream
			}
			return res, nil
		}
		if err != nil {
			return res, err
		}
	}
}

func snippet(b []byte) string {
	if len(b) > 200 {
		b = b[:200]
	}
	return string(bytes.TrimSpace(b))
}
