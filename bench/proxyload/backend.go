package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/spf13/pflag"
	"github.com/valyala/fasthttp"

	"github.com/ferryserve/ferry/bench/loadgen"
)

// The backend is deliberately cheaper than any real model server: a fixed reply, no parsing
// beyond a substring check, so that the proxy in front of it is what the numbers measure.
var (
	// completionReply is a non-streamed chat completion of the usual shape, about 330 bytes.
	completionReply = []byte(`{"id":"chatcmpl-bench0000000000000000000000","object":"chat.completion","created":1700000000,` +
		`"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you with your question today?"},` +
		`"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":9,"total_tokens":21}}` + "\n")
	// streamChunk is one SSE chunk of a streamed chat completion, one token of content.
	streamChunk = []byte(`data: {"id":"chatcmpl-bench0000000000000000000000","object":"chat.completion.chunk","created":1700000000,` +
		`"model":"bench","choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	streamDone  = []byte("data: [DONE]\n\n")
	streamToken = []byte(`"stream":true`)

	// completionRequest and streamRequest are the bodies the load generator sends.
	completionRequest = []byte(`{"model":"bench","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}`)
	streamRequest     = []byte(`{"model":"bench","messages":[{"role":"user","content":"Say hello."}],"max_tokens":32,"stream":true}`)
)

// maxChunks bounds a stream, whatever the query string asks.
const maxChunks = 10_000

// backendConfig shapes the backend's streams; ?chunks=N&gap_ms=D overrides them per request.
type backendConfig struct {
	listen   []string
	chunks   int
	chunkGap time.Duration
}

// runBackend is the `backend` subcommand: serve on every --listen address until SIGTERM (the
// default action ends the process, which is all a backend needs). Several addresses stand for
// several replicas at the cost of one process.
func runBackend(args []string) error {
	fs := pflag.NewFlagSet("backend", pflag.ContinueOnError)
	cfg := backendConfig{}
	fs.StringArrayVar(&cfg.listen, "listen", nil, "loopback host:port to serve on (repeatable)")
	fs.IntVar(&cfg.chunks, "chunks", 32, "SSE chunks per stream before data: [DONE]")
	fs.DurationVar(&cfg.chunkGap, "chunk-gap", 5*time.Millisecond, "pause between SSE chunks")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(cfg.listen) == 0 {
		return errors.New("--listen: at least one address is required")
	}
	var lns []net.Listener
	for _, addr := range cfg.listen {
		if err := loadgen.CheckLoopback(addr); err != nil {
			return err
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		lns = append(lns, ln)
	}
	srv := newBackendServer(cfg)
	errs := make(chan error, len(lns))
	for _, ln := range lns {
		go func() { errs <- srv.Serve(ln) }()
	}
	return <-errs
}

func newBackendServer(cfg backendConfig) *fasthttp.Server {
	return &fasthttp.Server{
		Handler:               func(ctx *fasthttp.RequestCtx) { serveBackend(ctx, cfg) },
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		NoDefaultDate:         true,
		ReadTimeout:           2 * time.Minute,
		IdleTimeout:           2 * time.Minute,
		Concurrency:           64 << 10,
	}
}

func serveBackend(ctx *fasthttp.RequestCtx, cfg backendConfig) {
	switch {
	case ctx.IsGet() && string(ctx.Path()) == "/health":
		ctx.SetBodyString("ok")
	case ctx.IsPost():
		if !bytes.Contains(ctx.PostBody(), streamToken) {
			ctx.SetContentType("application/json")
			ctx.SetBody(completionReply)
			return
		}
		chunks, gap, err := streamShape(ctx.QueryArgs(), cfg)
		if err != nil {
			ctx.Error(err.Error(), fasthttp.StatusBadRequest)
			return
		}
		ctx.SetContentType("text/event-stream")
		ctx.Response.Header.Set("Cache-Control", "no-cache")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for i := range chunks {
				if i > 0 && gap > 0 {
					time.Sleep(gap)
				}
				_, _ = w.Write(streamChunk)
				if w.Flush() != nil {
					return // client went away
				}
			}
			_, _ = w.Write(streamDone)
			_ = w.Flush()
		})
	default:
		ctx.Error("not found", fasthttp.StatusNotFound)
	}
}

// streamShape reads ?chunks=N&gap_ms=D, falling back to cfg.
func streamShape(args *fasthttp.Args, cfg backendConfig) (int, time.Duration, error) {
	chunks, gap := cfg.chunks, cfg.chunkGap
	if v := args.Peek("chunks"); len(v) > 0 {
		n, err := strconv.Atoi(string(v))
		if err != nil || n < 1 || n > maxChunks {
			return 0, 0, fmt.Errorf("chunks=%q: want 1..%d", v, maxChunks)
		}
		chunks = n
	}
	if v := args.Peek("gap_ms"); len(v) > 0 {
		ms, err := strconv.ParseFloat(string(v), 64)
		if err != nil || ms < 0 || ms > 10_000 {
			return 0, 0, fmt.Errorf("gap_ms=%q: want 0..10000", v)
		}
		gap = time.Duration(ms * float64(time.Millisecond))
	}
	return chunks, gap, nil
}

// streamPath is the request path asking the backend for a stream of the given shape.
func streamPath(chunks int, gap time.Duration) string {
	return "/v1/chat/completions?chunks=" + strconv.Itoa(chunks) + "&gap_ms=" +
		strconv.FormatFloat(float64(gap)/float64(time.Millisecond), 'f', -1, 64)
}

// errShortReply is a non-streamed reply of the wrong length: something in the path altered it.
var errShortReply = errors.New("reply length differs from the backend's")

// nonStreamOp is one non-streamed completion through c.
func nonStreamOp(c *loadgen.Client) loadgen.Op {
	return func(context.Context, int) (loadgen.Sample, error) {
		n, err := c.Do(fasthttp.MethodPost, "/v1/chat/completions", completionRequest, nil)
		if err == nil && n != len(completionReply) {
			err = fmt.Errorf("%w: %d bytes, want %d", errShortReply, n, len(completionReply))
		}
		return loadgen.Sample{}, err
	}
}

// errEventCount is a stream with the wrong number of events.
var errEventCount = errors.New("stream event count differs from the backend's")

// streamOp is one streamed completion through c, checked for its event count.
func streamOp(c *loadgen.Client, chunks int, gap time.Duration) loadgen.Op {
	path := streamPath(chunks, gap)
	return func(context.Context, int) (loadgen.Sample, error) {
		res, err := c.Stream(path, streamRequest, nil)
		if err == nil && res.Events != chunks+1 {
			err = fmt.Errorf("%w: %d events, want %d", errEventCount, res.Events, chunks+1)
		}
		return loadgen.Sample{TTFB: res.TTFB}, err
	}
}
