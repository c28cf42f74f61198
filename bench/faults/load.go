package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/ferryserve/ferry/bench/servicekit"
)

// The traffic: closed-loop workers, half sending non-streamed chat completions and half
// streamed ones, each request classified by how it ended. What matters here is not latency
// but failure modes: a non-streamed request that failed, a stream that failed before it
// started, a stream cut by a fault that ended with an SSE error event in OpenAI's shape (what
// the proxy must send), and one cut without it (a defect: an SDK sees a truncated stream).

// outcome is how a request ended.
type outcome uint8

const (
	outcomeOK outcome = iota
	// outcomeFailed: an error status or a broken connection before the response started.
	outcomeFailed
	// outcomeShed: the proxy refused the request as overload (503 or 429 with Retry-After, in
	// OpenAI's error shape), which only the connection-exhaustion scenario excuses.
	outcomeShed
	// outcomeCutWithEvent: a stream that started and then ended with an OpenAI error event.
	outcomeCutWithEvent
	// outcomeCutNoEvent: a stream that started and then ended without [DONE] and without an
	// error event, or with one not in OpenAI's shape.
	outcomeCutNoEvent
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"ok", "failed", "shed", "cut_with_error_event", "cut_without_error_event"}

func (o outcome) String() string { return outcomeNames[o] }

func (o outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// record is one request as the load saw it.
type record struct {
	Start   time.Time
	Latency time.Duration
	Stream  bool
	Outcome outcome
	Err     string
}

// errStreamCut is a stream that ended before [DONE] without an error event.
var errStreamCut = errors.New("stream ended before [DONE] without an error event")

// apiErrorBody is OpenAI's error shape.
type apiErrorBody struct {
	Error *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    any    `json:"code"`
	} `json:"error"`
}

// openAIError reports whether b is an OpenAI-shaped error, and its type and code.
func openAIError(b []byte) (typ, code string, ok bool) {
	var e apiErrorBody
	if json.Unmarshal(b, &e) != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		return "", "", false
	}
	return e.Error.Type, fmt.Sprint(e.Error.Code), true
}

// classifyStatus is the outcome of a non-200 answer: shed when it is an OpenAI-shaped overload
// refusal with Retry-After, failed otherwise.
func classifyStatus(status int, retryAfter, body []byte) (outcome, string) {
	typ, code, ok := openAIError(body)
	msg := fmt.Sprintf("status %d", status)
	if ok {
		msg += fmt.Sprintf(" %s/%s", typ, code)
	} else {
		msg += fmt.Sprintf(" (not an OpenAI error: %q)", snippet(body))
	}
	if ok && len(retryAfter) > 0 && (status == fasthttp.StatusServiceUnavailable || status == fasthttp.StatusTooManyRequests) {
		return outcomeShed, msg
	}
	return outcomeFailed, msg
}

// readStream reads an event stream to its end: ok at [DONE], cut with an event when an
// OpenAI-shaped error arrives, cut without one when the stream ends otherwise.
func readStream(br *bufio.Reader) (outcome, error) {
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
			case bytes.Equal(payload, []byte("[DONE]")):
				return outcomeOK, nil
			case bytes.Contains(payload, []byte(`"error"`)):
				if typ, code, ok := openAIError(payload); ok {
					return outcomeCutWithEvent, fmt.Errorf("stream error event %s/%s", typ, code)
				}
				if bytes.HasPrefix(payload, []byte(`{"error"`)) {
					return outcomeCutNoEvent, fmt.Errorf("error event not in OpenAI's shape: %q", snippet(payload))
				}
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return outcomeCutNoEvent, errStreamCut
			}
			return outcomeCutNoEvent, fmt.Errorf("%w: %v", errStreamCut, err)
		}
	}
}

func snippet(b []byte) string {
	if len(b) > 160 {
		b = b[:160]
	}
	return string(bytes.TrimSpace(b))
}

// client sends chat completions to the service and classifies how each ended.
type client struct{ *servicekit.ChatClient }

// prompt is what every request asks, naming no model.
const prompt = "Are you still there?"

func newClient(addr string, maxConns int, timeout time.Duration, plainTokens, streamTokens int) (*client, error) {
	c, err := servicekit.NewChatClient(addr, maxConns, timeout, prompt, plainTokens, streamTokens)
	if err != nil {
		return nil, err
	}
	return &client{c}, nil
}

func (c *client) closeIdle() { c.CloseIdle() }

// doPlain sends one non-streamed completion.
func (c *client) doPlain() (outcome, error) {
	o := outcomeFailed
	err := c.Plain(func(resp *fasthttp.Response) error {
		if resp.StatusCode() != fasthttp.StatusOK {
			var msg string
			o, msg = classifyStatus(resp.StatusCode(), resp.Header.Peek("Retry-After"), resp.Body())
			return errors.New(msg)
		}
		var body struct {
			Choices []json.RawMessage `json:"choices"`
		}
		if err := json.Unmarshal(resp.Body(), &body); err != nil || len(body.Choices) == 0 {
			return fmt.Errorf("200 without a completion: %q", snippet(resp.Body()))
		}
		o = outcomeOK
		return nil
	})
	return o, err
}

// doStream sends one streamed completion and reads it to its end.
func (c *client) doStream() (outcome, error) {
	o := outcomeFailed
	err := c.Stream(func(resp *fasthttp.Response, body []byte) error {
		var msg string
		o, msg = classifyStatus(resp.StatusCode(), resp.Header.Peek("Retry-After"), body)
		return errors.New(msg)
	}, func(br *bufio.Reader) error {
		var err error
		o, err = readStream(br)
		return err
	})
	return o, err
}

// load is a running closed-loop load of records.
type load = servicekit.Load[record]

// startLoad starts workers workers against c: the first half (rounded up) send non-streamed
// requests, the rest streams. It runs until stop, or bound at the latest.
func startLoad(c *client, workers int, bound time.Duration) *load {
	return servicekit.StartLoad(workers, bound, func(stream bool) (record, error) {
		start := time.Now()
		var o outcome
		var err error
		if stream {
			o, err = c.doStream()
		} else {
			o, err = c.doPlain()
		}
		rec := record{Start: start, Latency: time.Since(start), Stream: stream, Outcome: o}
		if err != nil {
			rec.Err = err.Error()
		}
		return rec, err
	})
}

// floodResult counts how the streams of a flood ended.
type floodResult struct {
	Streams int `json:"streams"`
	// Admitted got 200 and an event stream; Shed an OpenAI-shaped overload refusal; Failed
	// anything else before the stream started (the reasons, first few, in Errors).
	Admitted int            `json:"admitted"`
	Shed     int            `json:"shed"`
	Failed   int            `json:"failed"`
	Errors   map[string]int `json:"errors,omitempty"`
	// PeakOpen is the most flood streams open at once.
	PeakOpen int64 `json:"peak_open"`
}

// flood opens n streams to addr over ramp, keeps the admitted ones open until hold has passed
// since the last was opened, then closes them all from the client side, the way a crowd of
// impatient clients gives up.
func flood(ctx context.Context, addr string, n int, ramp, hold, timeout time.Duration, body []byte) floodResult {
	hc := &fasthttp.HostClient{
		Addr:                      addr,
		MaxConns:                  n,
		ReadTimeout:               timeout,
		WriteTimeout:              timeout,
		MaxIdemponentCallAttempts: 1,
		RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
		StreamResponseBody:        true,
		NoDefaultUserAgentHeader:  true,
	}
	defer hc.CloseIdleConnections()
	release := make(chan struct{})
	var (
		mu       sync.Mutex
		res      = floodResult{Streams: n, Errors: map[string]int{}}
		open     atomic.Int64
		peakOpen atomic.Int64
		wg       sync.WaitGroup
	)
	count := func(o outcome, why string) {
		mu.Lock()
		defer mu.Unlock()
		switch o {
		case outcomeOK:
			res.Admitted++
		case outcomeShed:
			res.Shed++
		default:
			res.Failed++
			if len(res.Errors) < 8 || res.Errors[why] > 0 {
				res.Errors[why]++
			}
		}
	}
	gap := ramp / time.Duration(max(n, 1))
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := fasthttp.AcquireRequest()
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.Header.SetMethod(fasthttp.MethodPost)
			req.SetRequestURI(servicekit.ChatPath)
			req.Header.SetHost(addr)
			req.Header.SetContentType("application/json")
			req.SetBodyRaw(body)
			if err := hc.Do(req, resp); err != nil {
				count(outcomeFailed, err.Error())
				return
			}
			defer func() { _ = resp.CloseBodyStream() }() // before the body ends: the connection closes
			if resp.StatusCode() != fasthttp.StatusOK {
				var src io.Reader = resp.BodyStream()
				if src == nil {
					src = bytes.NewReader(resp.Body())
				}
				b, _ := io.ReadAll(io.LimitReader(src, 4<<10))
				o, msg := classifyStatus(resp.StatusCode(), resp.Header.Peek("Retry-After"), b)
				count(o, msg)
				return
			}
			count(outcomeOK, "")
			storeMax(&peakOpen, open.Add(1))
			defer open.Add(-1)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}()
		if i < n-1 && gap > 0 {
			time.Sleep(gap)
		}
	}
	select {
	case <-time.After(hold):
	case <-ctx.Done():
	}
	close(release)
	wg.Wait()
	res.PeakOpen = peakOpen.Load()
	return res
}

func storeMax(v *atomic.Int64, x int64) {
	for {
		cur := v.Load()
		if x <= cur || v.CompareAndSwap(cur, x) {
			return
		}
	}
}
