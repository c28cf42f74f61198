package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Workloads --workload selects.
const (
	// workloadAzure replays a window of the Azure conversation trace (workload.go).
	workloadAzure = "azure"
	// workloadMultiTurn synthesizes chat sessions whose prompts share long prefixes: the shape
	// of a multi-turn conversation trace, which the Azure trace is not (it has no prompt text).
	workloadMultiTurn = "multiturn"
)

// multiTurnConfig shapes the multi-turn workload: conversations that open on one of a few
// shared system prompts (or a private one), then alternate a user message and the answer, the
// whole history resent every turn, with the user's think time between turns. Lengths are
// heavy tailed (log-normal), as in chat traces: most messages are short, a few paste a
// document.
type multiTurnConfig struct {
	Seed  uint64
	Model string
	// Conversations is how many conversations start; MeanTurns their mean length in turns
	// (geometric, at least one turn).
	Conversations int
	MeanTurns     float64
	// Sharing is the share of conversations that open on one of the shared system prompts,
	// chosen by a Zipf-like popularity (the i-th with weight 1/(i+1)); the others open on a
	// private system prompt of a length drawn from the same list, which nothing else shares.
	Sharing            float64
	SystemPromptTokens []int
	// Rate is the offered load in requests per second: conversations start as a Poisson
	// process at Rate / MeanTurns, Conversations of them over the replayed window of
	// Conversations × MeanTurns / Rate seconds. The process starts two mean conversation
	// lifetimes before the window and its requests are cut at both ends, as a window of a
	// trace is: the load is steady from the first request on, and some conversations are
	// already under way (their early turns were never sent) or unfinished.
	Rate float64
	// Burst is the ratio of the conversation start rate during a burst to Rate: starts follow
	// a Markov-modulated Poisson process that spends burstShare of the time in bursts (of
	// burstMean on average) and the rest calm, at whatever rate keeps the mean at Rate. 1 is
	// a plain Poisson process; at most 1/burstShare.
	Burst float64
	// ThinkTime is the mean time between an answer's request and the conversation's next one
	// (exponential).
	ThinkTime time.Duration
	// UserTokens and AnswerTokens are the medians of the log-normal lengths of a user message
	// and an answer (max_tokens, and the answer's length in the history); Sigma their shape.
	UserTokens, AnswerTokens int
	Sigma                    float64
	// MaxPromptTokens ends a conversation whose next prompt would be longer.
	MaxPromptTokens int
}

func (c multiTurnConfig) validate() error {
	var errs []error
	bad := func(flag string, v any, rule string) { errs = append(errs, fmt.Errorf("--%s=%v: %s", flag, v, rule)) }
	if c.Conversations < 1 || c.Conversations > 20000 {
		bad("conversations", c.Conversations, "must be between 1 and 20000")
	}
	if !(c.MeanTurns >= 1 && c.MeanTurns <= 100) {
		bad("turns", c.MeanTurns, "must be between 1 and 100")
	}
	if !(c.Sharing >= 0 && c.Sharing <= 1) {
		bad("sharing", c.Sharing, "must be between 0 and 1")
	}
	if len(c.SystemPromptTokens) == 0 {
		bad("system-prompts", `""`, "name at least one length")
	}
	for _, n := range c.SystemPromptTokens {
		if n < 16 || n > c.MaxPromptTokens/2 {
			bad("system-prompts", n, fmt.Sprintf("lengths must be between 16 and half of --max-prompt-tokens (%d)", c.MaxPromptTokens/2))
		}
	}
	if !(c.Rate > 0 && c.Rate <= 2000) {
		bad("rate", c.Rate, "must be positive and at most 2000")
	}
	if !(c.Burst >= 1 && c.Burst <= 1/burstShare) {
		bad("burst", c.Burst, fmt.Sprintf("must be between 1 and %g", 1/burstShare))
	}
	if c.ThinkTime < 0 || c.ThinkTime > time.Hour {
		bad("think-time", c.ThinkTime, "must be between 0 and 1h")
	}
	if c.UserTokens < 2 || c.AnswerTokens < 1 {
		bad("user-tokens", c.UserTokens, "must be at least 2, and --answer-tokens at least 1")
	}
	if !(c.Sigma >= 0 && c.Sigma <= 3) {
		bad("length-sigma", c.Sigma, "must be between 0 and 3")
	}
	if c.MaxPromptTokens < 256 || c.MaxPromptTokens > 100_000 {
		bad("max-prompt-tokens", c.MaxPromptTokens, "must be between 256 and 100000")
	}
	if c.Model == "" {
		errs = append(errs, errors.New("model: must not be empty"))
	}
	return errors.Join(errs...)
}

// Bursts of the multi-turn workload's arrivals: a share of the time, and a burst's mean length.
const (
	burstShare = 0.2
	burstMean  = 5 * time.Second
)

// burstyArrivals is a two-state Markov-modulated Poisson process: bursts at burst × mean rate
// and calm periods between them, both of exponential length, burstShare of the time in bursts.
// The mean rate stays mean. Real chat traffic comes in such bursts (a class ending, a batch job
// starting); a plain Poisson process at the same mean hides what a burst does to queues.
type burstyArrivals struct {
	rng                 *rand.Rand
	burstRate, calmRate float64 // arrivals per second
	burstLen, calmLen   float64 // mean seconds
	now, stateEnd       float64 // seconds
	inBurst, modulated  bool
}

func newBurstyArrivals(rng *rand.Rand, mean, burst float64, start time.Duration) *burstyArrivals {
	a := &burstyArrivals{rng: rng, burstRate: burst * mean, calmRate: mean * (1 - burstShare*burst) / (1 - burstShare),
		burstLen: burstMean.Seconds(), now: start.Seconds(), modulated: burst > 1}
	a.calmLen = a.burstLen * (1 - burstShare) / burstShare
	if !a.modulated { // draws nothing more: a seed gives the same Poisson workload as before bursts
		a.calmRate = mean
		return a
	}
	a.stateEnd = a.now + a.rng.ExpFloat64()*a.calmLen
	return a
}

// next returns the time of the next arrival: an exponential amount of work at rate 1, spent
// across the states' rates until it runs out.
func (a *burstyArrivals) next() time.Duration {
	work := a.rng.ExpFloat64()
	for {
		rate := a.calmRate
		if a.inBurst {
			rate = a.burstRate
		}
		if !a.modulated || (rate > 0 && a.now+work/rate <= a.stateEnd) {
			a.now += work / rate
			return time.Duration(a.now * float64(time.Second))
		}
		work -= (a.stateEnd - a.now) * rate
		a.now = a.stateEnd
		a.inBurst = !a.inBurst
		mean := a.calmLen
		if a.inBurst {
			mean = a.burstLen
		}
		a.stateEnd = a.now + a.rng.ExpFloat64()*mean
	}
}

// synthesizeMultiTurn builds the multi-turn workload, deterministic in cfg.Seed. Arrival times
// are fixed in advance (open loop): a turn is sent at its time whether or not the previous
// answer has come back, as a trace replay does.
func synthesizeMultiTurn(cfg multiTurnConfig) (*workload, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6d756c7469)) // "multi"
	shared := make([]string, len(cfg.SystemPromptTokens))
	weights := make([]float64, len(shared))
	var weightSum float64
	for i, n := range cfg.SystemPromptTokens {
		shared[i] = text(rng, n*charsPerToken-systemOverhead)
		weights[i] = 1 / float64(i+1)
		weightSum += weights[i]
	}
	lognormal := func(median int, limit int) int {
		v := float64(median) * math.Exp(cfg.Sigma*rng.NormFloat64())
		return int(min(max(v, 1), float64(limit)))
	}
	maxChars := cfg.MaxPromptTokens * charsPerToken

	w := &workload{}
	startRate := cfg.Rate / cfg.MeanTurns // conversations per second
	window := time.Duration(float64(cfg.Conversations) / startRate * float64(time.Second))
	warmUp := time.Duration(2 * cfg.MeanTurns * float64(cfg.ThinkTime))
	start := -warmUp
	starts := newBurstyArrivals(rng, startRate, cfg.Burst, start)
	conversations := map[int]bool{}
	for id := 1; ; id++ {
		start = starts.next()
		if start >= window {
			break
		}
		turns := 1
		for rng.Float64() > 1/cfg.MeanTurns { // geometric with mean MeanTurns
			turns++
		}
		system, content := -1, ""
		if rng.Float64() < cfg.Sharing {
			x := rng.Float64() * weightSum
			for system = 0; system < len(weights)-1 && x >= weights[system]; system++ {
				x -= weights[system]
			}
			content = shared[system]
		} else {
			content = text(rng, cfg.SystemPromptTokens[rng.IntN(len(cfg.SystemPromptTokens))]*charsPerToken-systemOverhead)
		}
		messages := []chatMessage{{Role: "system", Content: content}}
		chars := len(content) + systemOverhead
		at := start
		for turn := 1; turn <= turns; turn++ {
			userChars := lognormal(cfg.UserTokens, cfg.MaxPromptTokens/4) * charsPerToken
			if chars+userChars+userOverhead > maxChars {
				break
			}
			messages = append(messages, chatMessage{Role: "user", Content: text(rng, userChars)})
			chars += userChars + userOverhead
			out := lognormal(cfg.AnswerTokens, 1024)
			if at < 0 || at >= window { // outside the replayed window: never sent
				answerChars := max(out*charsPerToken-assistantOverhead, 1)
				messages = append(messages, chatMessage{Role: "assistant", Content: text(rng, answerChars)})
				chars += answerChars + assistantOverhead
				at += time.Duration(rng.ExpFloat64() * float64(cfg.ThinkTime))
				continue
			}
			conversations[id] = true
			body := chatRequest{Model: cfg.Model, Messages: messages, MaxTokens: out, Stream: true}
			body.StreamOptions.IncludeUsage = true
			raw, err := json.Marshal(body)
			if err != nil {
				return nil, err
			}
			promptTokens := (chars + charsPerToken - 1) / charsPerToken
			w.Requests = append(w.Requests, request{
				At: at, Conversation: id, Turn: turn, System: system,
				PromptTokens: promptTokens, OutTokens: out, Body: raw,
			})
			w.stats.PromptTokens += promptTokens
			w.stats.OutputTokens += out
			w.stats.MaxTurns = max(w.stats.MaxTurns, turn)
			answerChars := max(out*charsPerToken-assistantOverhead, 1)
			messages = append(messages, chatMessage{Role: "assistant", Content: text(rng, answerChars)})
			chars += answerChars + assistantOverhead
			at += time.Duration(rng.ExpFloat64() * float64(cfg.ThinkTime))
		}
	}
	slices.SortStableFunc(w.Requests, func(a, b request) int {
		switch {
		case a.At < b.At:
			return -1
		case a.At > b.At:
			return 1
		}
		return 0
	})
	// What a cache could serve, in the order requests are sent: the conversation's previous
	// prompt if it was sent, else its shared system prompt if another conversation sent it.
	systemSeen := make([]bool, len(shared))
	lastPrompt := map[int]int{}
	reusableTotal, systemPrompted := 0, 0
	for i := range w.Requests {
		r := &w.Requests[i]
		if prev, ok := lastPrompt[r.Conversation]; ok {
			r.ReusableTokens = prev
			w.stats.FollowUps++
		} else if s := r.System; s >= 0 && systemSeen[s] {
			r.ReusableTokens = (len(shared[s]) + systemOverhead) / charsPerToken
		}
		if r.System >= 0 {
			systemSeen[r.System] = true
			systemPrompted++
		}
		lastPrompt[r.Conversation] = r.PromptTokens
		reusableTotal += r.ReusableTokens
	}
	w.stats.Requests = len(w.Requests)
	w.stats.Conversations = len(conversations)
	if w.stats.PromptTokens > 0 {
		w.stats.ReusableShare = float64(reusableTotal) / float64(w.stats.PromptTokens)
	}
	if n := len(w.Requests); n > 0 {
		w.stats.DurationS = w.Requests[n-1].At.Seconds()
		w.stats.SystemPrompted = float64(systemPrompted) / float64(n)
	}
	return w, nil
}
