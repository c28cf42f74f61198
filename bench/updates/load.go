package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/ferryserve/ferry/bench/loadgen"
	"github.com/ferryserve/ferry/bench/servicekit"
)

// The traffic: closed-loop workers, half sending non-streamed chat completions and half
// streamed ones, each request recorded with the model that answered it. The replicas of
// version N serve the model "upd-vN", so the model tells which version served a request.
// Requests name no model: the versions' model names differ, and replica-sim (like vLLM)
// refuses a model it does not serve, while it accepts a request that names none.

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

// client sends chat completions to the service and reads the model that answered from each.
type client struct{ *servicekit.ChatClient }

// newClient is a client for addr whose requests name no model (see above).
func newClient(addr string, maxConns int, timeout time.Duration, plainTokens, streamTokens int) (*client, error) {
	c, err := servicekit.NewChatClient(addr, maxConns, timeout, "Which version are you?", plainTokens, streamTokens)
	if err != nil {
		return nil, err
	}
	return &client{c}, nil
}

func (c *client) closeIdle() { c.CloseIdle() }

// doPlain sends one non-streamed completion and returns the model that answered.
func (c *client) doPlain() (model string, err error) {
	err = c.Plain(func(resp *fasthttp.Response) error {
		if resp.StatusCode() != fasthttp.StatusOK {
			return &loadgen.StatusError{Status: resp.StatusCode(), Body: snippet(resp.Body())}
		}
		model, err = modelOfJSON(resp.Body())
		return err
	})
	return model, err
}

// doStream sends one streamed completion, reads it to its end and returns its model.
func (c *client) doStream() (model string, err error) {
	err = c.Stream(func(resp *fasthttp.Response, body []byte) error {
		return &loadgen.StatusError{Status: resp.StatusCode(), Body: snippet(body)}
	}, func(br *bufio.Reader) error {
		model, err = readStream(br)
		return err
	})
	return model, err
}

// load is a running closed-loop load of records.
type load = servicekit.Load[record]

// startLoad starts workers workers against c: the first half (rounded up) send non-streamed
// requests, the rest streams. It runs until stop, or bound at the latest.
func startLoad(c *client, workers int, bound time.Duration) *load {
	return servicekit.StartLoad(workers, bound, func(stream bool) (record, error) {
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
		return rec, err
	})
}
