package servicekit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/ferryserve/ferry/bench/loadgen"
)

// ChatPath is the OpenAI chat completions path the load requests.
const ChatPath = "/v1/chat/completions"

// ChatClient sends chat completions to one loopback address. loadgen.Client discards response
// bodies, and the drivers read them, so it keeps two fasthttp.HostClients set up as loadgen's
// are: no retries (a request the proxy failed must count as failed), one timeout bounding each
// whole response, streams handed over as they arrive.
type ChatClient struct {
	addr          string
	plain, stream *fasthttp.HostClient
	plainBody     []byte
	streamBody    []byte
	// apiKey, when set, goes with every request as "Authorization: Bearer".
	apiKey string
}

// SetAPIKey makes every later request carry key as "Authorization: Bearer KEY".
func (c *ChatClient) SetAPIKey(key string) { c.apiKey = key }

// NewChatClient is a client for addr, which must be a loopback address, whose non-streamed
// and streamed requests ask prompt with plainTokens and streamTokens max_tokens.
func NewChatClient(addr string, maxConns int, timeout time.Duration, prompt string, plainTokens, streamTokens int) (*ChatClient, error) {
	if err := loadgen.CheckLoopback(addr); err != nil {
		return nil, err
	}
	mk := func(stream bool) *fasthttp.HostClient {
		return &fasthttp.HostClient{
			Addr:                      addr,
			MaxConns:                  maxConns,
			ReadTimeout:               timeout,
			WriteTimeout:              timeout,
			MaxIdemponentCallAttempts: 1,
			RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
			StreamResponseBody:        stream,
			NoDefaultUserAgentHeader:  true,
			MaxIdleConnDuration:       time.Minute,
		}
	}
	return &ChatClient{
		addr: addr, plain: mk(false), stream: mk(true),
		plainBody:  ChatBody(prompt, plainTokens, false),
		streamBody: ChatBody(prompt, streamTokens, true),
	}, nil
}

// ChatBody is a chat completion request without a model, which replica-sim (like vLLM)
// accepts; a streamed one asks for usage.
func ChatBody(prompt string, maxTokens int, stream bool) []byte {
	req := map[string]any{
		"messages":   []map[string]string{{"role": "user", "content": prompt}},
		"max_tokens": maxTokens,
	}
	if stream {
		req["stream"] = true
		req["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(req) // cannot fail: plain maps of strings and numbers
	return b
}

// CloseIdle closes the client's idle connections.
func (c *ChatClient) CloseIdle() {
	c.plain.CloseIdleConnections()
	c.stream.CloseIdleConnections()
}

func (c *ChatClient) newRequest(body []byte) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(ChatPath)
	req.Header.SetHost(c.addr)
	req.Header.SetContentType("application/json")
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	req.SetBodyRaw(body)
	return req
}

// Plain sends one non-streamed completion and hands the response to read, which must not keep
// it. A transport error is returned without calling read.
func (c *ChatClient) Plain(read func(resp *fasthttp.Response) error) error {
	req := c.newRequest(c.plainBody)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	if err := c.plain.Do(req, resp); err != nil {
		return err
	}
	return read(resp)
}

// Stream sends one streamed completion. A transport error is returned as is; a status other
// than 200 goes to refused with up to 4 KiB of the body; a 200 that is not an event stream is
// loadgen.ErrNotEventStream; an event stream goes to read, to read to its end.
func (c *ChatClient) Stream(refused func(resp *fasthttp.Response, body []byte) error, read func(*bufio.Reader) error) error {
	req := c.newRequest(c.streamBody)
	req.Header.Set("Accept", "text/event-stream")
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	if err := c.stream.Do(req, resp); err != nil {
		return err
	}
	defer func() { _ = resp.CloseBodyStream() }()
	var src io.Reader = resp.BodyStream()
	if src == nil { // fasthttp read a small body whole
		src = bytes.NewReader(resp.Body())
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(src, 4<<10))
		return refused(resp, b)
	}
	if !bytes.HasPrefix(resp.Header.ContentType(), []byte("text/event-stream")) {
		return fmt.Errorf("%w: %q", loadgen.ErrNotEventStream, resp.Header.ContentType())
	}
	return read(bufio.NewReaderSize(src, 8<<10))
}

// Load is a running closed-loop load: loadgen.Run's workers, each appending to its own slice
// of records.
type Load[R any] struct {
	cancel  context.CancelFunc
	done    chan struct{}
	records [][]R
	err     error
}

// StartLoad starts workers workers, each calling do in a loop and keeping what it returns: the
// first half (rounded up) with stream false, the rest with stream true. A request's error
// counts in loadgen's result as well. It runs until Stop, or bound at the latest.
func StartLoad[R any](workers int, bound time.Duration, do func(stream bool) (R, error)) *Load[R] {
	ctx, cancel := context.WithCancel(context.Background())
	l := &Load[R]{cancel: cancel, done: make(chan struct{}), records: make([][]R, workers)}
	plainWorkers := (workers + 1) / 2
	op := func(_ context.Context, w int) (loadgen.Sample, error) {
		rec, err := do(w >= plainWorkers)
		l.records[w] = append(l.records[w], rec)
		return loadgen.Sample{}, err
	}
	go func() {
		defer close(l.done)
		_, l.err = loadgen.Run(ctx, loadgen.Config{Concurrency: workers, Duration: bound}, op)
	}()
	return l
}

// Stop ends the load, lets requests in flight finish, and returns every record. Calling it
// again returns the same records.
func (l *Load[R]) Stop() ([]R, error) {
	l.cancel()
	<-l.done
	var all []R
	for _, rs := range l.records {
		all = append(all, rs...)
	}
	return all, l.err
}
