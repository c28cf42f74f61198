package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/ferryserve/ferry/bench/loadgen"
)

// The traffic: closed-loop workers, half sending non-streamed chat completions and half
// streamed ones, each request recorded with the model that answered it. The replicas of
// version N serve the model "upd-vN", so the model tells which version served a request.
// Requests name no model: the versions' model names differ, and replica-sim (like vLLM)
// refuses a model it does not serve, while it accepts a request that names none.

const chatPath = "/v1/chat/completions"

// record is one request as the load saw it.
type record struct {
	// Start is when the request was sent.
	Start time.Time
	// Latency runs to the end of the response body (the end of the stream).
	Latency time.Duration
	Stream  bool
	// Model is the model that answered; for a failed request, whatever was read before the
	// failure (possibly empty).
	Model string
	// Err says why the request failed; empty when it succeeded.
	Err string
}

// errStreamError is a stream that carried an OpenAI error object, as the proxy sends when a
// replica breaks a stream mid-way.
var errStreamError = errors.New("stream carried an error event")

// errMixedModels is a stream whose chunks name different models: two versions in one answer.
var errMixedModels = errors.New("stream chunks name different models")

// errNoModel is a response without a model name, so the version that served it is unknown.
var errNoModel = errors.New("response names no model")

// chunk is what the driver reads of a chat completion or one of its stream chunks.
type chunk struct {
	Model string          `json:"model"`
	Error json.RawMessage `json:"error"`
}

// modelOfJSON returns the model of a non-streamed chat completion, or why the body is not a
// successful one.
func modelOfJSON(body []byte) (string, error) {
	var c chunk
	if err := json.Unmarshal(body, &c); err != nil {
		return "", fmt.Errorf("response is not JSON: %w: %q", err, snippet(body))
	}
	if len(c.Error) > 0 && !bytes.Equal(c.Error, []byte("null")) {
		return c.Model, fmt.Errorf("response carried an error: %s", snippet(c.Error))
	}
	if c.Model == "" {
		return "", errNoModel
	}
	return c.Model, nil
}

// readStream reads an OpenAI event stream to its end and returns the model its chunks name.
// It fails when a chunk carries an error, when chunks disagree on the model, when no chunk
// names one, and when the stream ends without data: [DONE] (loadgen.ErrIncompleteStream).
func readStream(br *bufio.Reader) (string, error) {
	model, done := "", false
	var pending []byte // a data line longer than the reader's buffer, joined
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			pending = append(pending, line...)
			continue
		}
		if pending != nil {
			line = append(pending, line...)
			pending = nil
		}
		if payload, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			payload = bytes.TrimSpace(payload)
			switch {
			case done:
				return model, fmt.Errorf("data after [DONE]: %q", snippet(payload))
			case bytes.Equal(payload, []byte("[DONE]")):
				done = true
			default:
				var c chunk
				if jerr := json.Unmarshal(payload, &c); jerr != nil {
					return model, fmt.Errorf("chunk is not JSON: %w: %q", jerr, snippet(payload))
				}
				if len(c.Error) > 0 && !bytes.Equal(c.Error, []byte("null")) {
					return model, fmt.Errorf("%w: %s", errStreamError, snippet(c.Error))
				}
				if c.Model != "" && model != "" && c.Model != model {
					return model, fmt.Errorf("%w: %s and %s", errMixedModels, model, c.Model)
				}
				if model == "" {
					model = c.Model
				}
			}
		}
		if errors.Is(err, io.EOF) {
			if !done {
				return model, loadgen.ErrIncompleteStream
			}
			if model == "" {
				return "", errNoModel
			}
			return model, nil
		}
		if err != nil {
			return model, err
		}
	}
}

func snippet(b []byte) string {
	if len(b) > 200 {
		b = b[:200]
	}
	return string(bytes.TrimSpace(b))
}

// client sends chat completions to one loopback address. loadgen.Client discards response
// bodies, and this driver needs the model in them, so it keeps two fasthttp.HostClients set
// up as loadgen's are: no retries (a request the proxy failed must count as failed), one
// timeout bounding each whole response, streams handed over as they arrive.
type client struct {
	addr          string
	plain, stream *fasthttp.HostClient
	plainBody     []byte
	streamBody    []byte
}

func newClient(addr string, maxConns int, timeout time.Duration, plainTokens, streamTokens int) (*client, error) {
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
	return &client{
		addr: addr, plain: mk(false), stream: mk(true),
		plainBody:  chatBody(plainTokens, false),
		streamBody: chatBody(streamTokens, true),
	}, nil
}

// chatBody is the request both kinds of worker send, without a model (see above).
func chatBody(maxTokens int, stream bool) []byte {
	req := map[string]any{
		"messages":   []map[string]string{{"role": "user", "content": "Which version are you?"}},
		"max_tokens": maxTokens,
	}
	if stream {
		req["stream"] = true
		req["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(req) // cannot fail: plain maps of strings and numbers
	return b
}

func (c *client) closeIdle() {
	c.plain.CloseIdleConnections()
	c.stream.CloseIdleConnections()
}

func (c *client) newRequest(body []byte) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(chatPath)
	req.Header.SetHost(c.addr)
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
	return req
}

// doPlain sends one non-streamed completion and returns the model that answered.
func (c *client) doPlain() (string, error) {
	req := c.newRequest(c.plainBody)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	if err := c.plain.Do(req, resp); err != nil {
		return "", err
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return "", &loadgen.StatusError{Status: resp.StatusCode(), Body: snippet(resp.Body())}
	}
	return modelOfJSON(resp.Body())
}

// doStream sends one streamed completion, reads it to its end and returns its model.
func (c *client) doStream() (string, error) {
	req := c.newRequest(c.streamBody)
	req.Header.Set("Accept", "text/event-stream")
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	if err := c.stream.Do(req, resp); err != nil {
		return "", err
	}
	defer func() { _ = resp.CloseBodyStream() }()
	var src io.Reader = resp.BodyStream()
	if src == nil { // fasthttp read a small body whole
		src = bytes.NewReader(resp.Body())
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(src, 512))
		return "", &loadgen.StatusError{Status: resp.StatusCode(), Body: snippet(b)}
	}
	if !bytes.HasPrefix(resp.Header.ContentType(), []byte("text/event-stream")) {
		return "", fmt.Errorf("%w: %q", loadgen.ErrNotEventStream, resp.Header.ContentType())
	}
	return readStream(bufio.NewReaderSize(src, 8<<10))
}

// load is a running closed-loop load: loadgen.Run's workers, each appending to its own slice
// of records.
type load struct {
	cancel  context.CancelFunc
	done    chan struct{}
	records [][]record
	result  *loadgen.Result
	err     error
}

// startLoad starts workers workers against c: the first half (rounded up) send non-streamed
// requests, the rest streams. It runs until stop, or bound at the latest.
func startLoad(c *client, workers int, bound time.Duration) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{cancel: cancel, done: make(chan struct{}), records: make([][]record, workers)}
	plainWorkers := (workers + 1) / 2
	op := func(_ context.Context, w int) (loadgen.Sample, error) {
		stream := w >= plainWorkers
		start := time.Now()
		var model string
		var err error
		if stream {
			model, err = c.doStream()
		} else {
			model, err = c.doPlain()
		}
		rec := record{Start: start, Latency: time.Since(start), Stream: stream, Model: model}
		if err != nil {
			rec.Err = err.Error()
		}
		l.records[w] = append(l.records[w], rec)
		return loadgen.Sample{}, err
	}
	go func() {
		defer close(l.done)
		l.result, l.err = loadgen.Run(ctx, loadgen.Config{Concurrency: workers, Duration: bound}, op)
	}()
	return l
}

// stop ends the load, lets requests in flight finish, and returns every record.
func (l *load) stop() ([]record, error) {
	l.cancel()
	<-l.done
	var all []record
	for _, rs := range l.records {
		all = append(all, rs...)
	}
	return all, l.err
}
