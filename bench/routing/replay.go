package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ferryserve/ferry/bench/loadgen"
)

// outcome is what happened to one replayed request.
type outcome struct {
	// Lag is how late the request was sent against its schedule: a large lag means the load
	// generator, not the system under test, was the bottleneck.
	Lag              time.Duration
	TTFT             time.Duration
	E2E              time.Duration
	PromptTokens     int
	CachedTokens     int
	CompletionTokens int
	Err              error
}

// errShortOutput is a stream whose usage reports fewer tokens than were asked for.
var errShortOutput = errors.New("completion shorter than max_tokens")

// usageChunk is the last chunk of a stream with include_usage.
type usageChunk struct {
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// streamer sends one streamed request; *loadgen.Client is the real one.
type streamer interface {
	Stream(path string, body []byte, headers []loadgen.Header) (loadgen.StreamResult, error)
}

// replay sends every request at its scheduled time (open loop: a slow answer does not delay
// the next arrival) and returns the outcomes in request order. At most maxInFlight requests
// are outstanding; beyond that the schedule slips, which shows up as lag. It returns early,
// with the requests not yet sent marked failed, when ctx ends.
func replay(ctx context.Context, client streamer, reqs []request, maxInFlight int) []outcome {
	out := make([]outcome, len(reqs))
	sem := make(chan struct{}, maxInFlight)
	var wg sync.WaitGroup
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for i := range reqs {
		r := &reqs[i]
		if wait := time.Until(start.Add(r.At)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			for j := i; j < len(reqs); j++ {
				out[j].Err = ctx.Err()
			}
			break
		}
		lag := time.Since(start.Add(r.At))
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i] = sendOne(client, r)
			out[i].Lag = lag
		}()
	}
	wg.Wait()
	return out
}

func sendOne(client streamer, r *request) outcome {
	res, err := client.Stream("/v1/chat/completions", r.Body, []loadgen.Header{{Key: "X-Session-Id", Value: r.SessionID()}})
	o := outcome{TTFT: res.TTFB, E2E: res.Total}
	if err != nil {
		o.Err = err
		return o
	}
	var u usageChunk
	if err := json.Unmarshal(res.Last, &u); err != nil || u.Usage == nil {
		o.Err = fmt.Errorf("stream has no usage chunk: %q", res.Last)
		return o
	}
	o.PromptTokens, o.CompletionTokens = u.Usage.PromptTokens, u.Usage.CompletionTokens
	if d := u.Usage.PromptTokensDetails; d != nil {
		o.CachedTokens = d.CachedTokens
	}
	if o.CompletionTokens < r.OutTokens {
		o.Err = fmt.Errorf("%w: %d of %d tokens", errShortOutput, o.CompletionTokens, r.OutTokens)
	}
	return o
}
