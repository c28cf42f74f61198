package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ferryserve/ferry/bench/azuretrace"
)

// charsPerToken is the simulator's tokenizer (bench/replicasim: one token per four bytes of the
// rendered prompt), so a prompt of 4·n bytes is n tokens to the replicas and to prefix routers.
const charsPerToken = 4

// The replicas render chat messages as "role: content\n" (bench/replicasim renderChat); these
// are the bytes each message adds beyond its content.
const (
	systemOverhead    = len("system: \n")
	userOverhead      = len("user: \n")
	assistantOverhead = len("assistant: \n")
)

// workloadConfig shapes how trace requests become prompts that share prefixes.
type workloadConfig struct {
	// Seed makes the workload reproducible: the same seed and trace window give byte-identical
	// request bodies.
	Seed uint64
	// SystemPromptTokens are the shared system prompts' lengths. A new conversation takes the
	// longest one that leaves MinUserTokens for its first message, or none when none fits.
	SystemPromptTokens []int
	// FollowUp is the probability that a request continues an open conversation (when one can
	// hold it) rather than starting a new one.
	FollowUp float64
	// MinTurnGap is the least trace time between two turns of one conversation, the user's
	// reading and typing time; MaxIdle is how long an unanswered conversation stays open.
	MinTurnGap time.Duration
	MaxIdle    time.Duration
	// MinUserTokens is the smallest new user message.
	MinUserTokens int
	// Speedup divides the trace's arrival times.
	Speedup float64
	// Model is the model name in every request.
	Model string
}

func (c workloadConfig) validate() error {
	var errs []error
	if len(c.SystemPromptTokens) == 0 {
		errs = append(errs, errors.New("system prompts: at least one length is required"))
	}
	for _, n := range c.SystemPromptTokens {
		if n < 16 || n > azuretrace.MaxContextTokens {
			errs = append(errs, fmt.Errorf("system prompt of %d tokens: want 16..%d", n, azuretrace.MaxContextTokens))
		}
	}
	if !(c.FollowUp >= 0 && c.FollowUp <= 1) {
		errs = append(errs, fmt.Errorf("follow-up probability %v: want 0..1", c.FollowUp))
	}
	if c.MinTurnGap < 0 || c.MaxIdle < c.MinTurnGap {
		errs = append(errs, fmt.Errorf("turn gap %v and max idle %v: want 0 ≤ gap ≤ idle", c.MinTurnGap, c.MaxIdle))
	}
	if c.MinUserTokens < 2 {
		errs = append(errs, fmt.Errorf("min user tokens %d: want at least 2", c.MinUserTokens))
	}
	if !(c.Speedup > 0) {
		errs = append(errs, fmt.Errorf("speedup %v: must be positive", c.Speedup))
	}
	if c.Model == "" {
		errs = append(errs, errors.New("model: must not be empty"))
	}
	return errors.Join(errs...)
}

// request is one replayed chat completion.
type request struct {
	// At is when to send it, relative to the start of the replay.
	At time.Duration
	// Conversation identifies its conversation (also sent as X-Session-Id); Turn counts from 1.
	Conversation int
	Turn         int
	// System is the index of its system prompt, -1 for none.
	System int
	// PromptTokens is the prompt's length as the replicas count it (the trace's ContextTokens,
	// give or take rounding); ReusableTokens is the part an earlier request already sent as
	// its prompt (a seen system prompt, or the previous turn's prompt), the most any prefix
	// cache could serve. OutTokens is max_tokens.
	PromptTokens   int
	ReusableTokens int
	OutTokens      int
	// Body is the JSON request.
	Body []byte
	// Adapter is the LoRA adapter it names as its model; empty for the base model.
	Adapter string
}

// SessionID is the X-Session-Id header value, the key of session affinity.
func (r *request) SessionID() string { return "conv-" + strconv.Itoa(r.Conversation) }

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatRequest struct {
	Model         string        `json:"model"`
	Messages      []chatMessage `json:"messages"`
	MaxTokens     int           `json:"max_tokens"`
	Stream        bool          `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// conversation is an open chat: its messages so far, including the last answer.
type conversation struct {
	id         int
	system     int
	messages   []chatMessage
	chars      int // rendered length of messages
	lastPrompt int // rendered length of the last prompt sent
	lastAt     time.Duration
	turns      int
}

// words is the filler vocabulary: lowercase ASCII, so that JSON needs no escaping and a
// content string's byte length is exactly what the replica counts.
var words = strings.Fields(`river boat ferry harbor tide rope deck wave shore cargo lantern bridge current
dock sail anchor crew mast hull keel port starboard bow stern galley chart compass channel buoy pier
wharf lock canal estuary delta island reef cove bay gulf strait sound inlet lagoon marsh bank ford
quay jetty beacon signal whistle bell engine fuel ticket passenger schedule crossing route landing`)

// text returns exactly n bytes of space-separated words drawn from rng.
func text(rng *rand.Rand, n int) string {
	if n <= 0 {
		return ""
	}
	var b strings.Builder
	b.Grow(n + 16)
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()[:n]
}

// workload is the synthesized replay with facts about its prefix sharing.
type workload struct {
	Requests []request
	stats    workloadStats
}

// workloadStats describe how much of the workload a prefix cache could serve.
type workloadStats struct {
	Requests       int     `json:"requests"`
	Conversations  int     `json:"conversations"`
	FollowUps      int     `json:"follow_ups"`
	MaxTurns       int     `json:"max_turns"`
	PromptTokens   int     `json:"prompt_tokens"`
	OutputTokens   int     `json:"output_tokens"`
	ReusableShare  float64 `json:"reusable_share"`
	DurationS      float64 `json:"duration_s"`
	SystemPrompted float64 `json:"system_prompted_share"`
}

// synthesize turns trace records (times relative to the window's start) into chat requests
// whose prompts have the trace's token counts and share prefixes the way chat traffic does: a
// few system prompts shared by many conversations, and multi-turn conversations in which turn
// k's prompt is turn k-1's prompt, its answer, and a new user message. It is deterministic in
// cfg.Seed and recs.
func synthesize(recs []traceRecord, cfg workloadConfig) (*workload, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15))
	systems := make([]string, len(cfg.SystemPromptTokens))
	for i, n := range cfg.SystemPromptTokens {
		systems[i] = text(rng, n*charsPerToken-systemOverhead)
	}
	// Longest first, so a new conversation finds its system prompt with one scan.
	bySize := make([]int, len(systems))
	for i := range bySize {
		bySize[i] = i
	}
	slices.SortStableFunc(bySize, func(a, b int) int { return cfg.SystemPromptTokens[b] - cfg.SystemPromptTokens[a] })
	systemSeen := make([]bool, len(systems))

	w := &workload{Requests: make([]request, 0, len(recs))}
	var open []*conversation
	nextID := 1
	minUserChars := cfg.MinUserTokens * charsPerToken
	reusableTotal := 0
	systemPrompted := 0
	for _, rec := range recs {
		// Close conversations idle for too long; the slice stays in opening order.
		open = slices.DeleteFunc(open, func(c *conversation) bool { return rec.At-c.lastAt > cfg.MaxIdle })
		target := rec.ContextTokens * charsPerToken

		var conv *conversation
		if rng.Float64() < cfg.FollowUp {
			var fits []*conversation
			for _, c := range open {
				if c.chars+minUserChars <= target && rec.At-c.lastAt >= cfg.MinTurnGap {
					fits = append(fits, c)
				}
			}
			if len(fits) > 0 {
				conv = fits[rng.IntN(len(fits))]
			}
		}
		reusable := 0
		if conv != nil {
			reusable = conv.lastPrompt
			w.stats.FollowUps++
		} else {
			conv = &conversation{id: nextID, system: -1}
			nextID++
			for _, s := range bySize {
				if cfg.SystemPromptTokens[s]*charsPerToken+minUserChars <= target {
					conv.system = s
					break
				}
			}
			if s := conv.system; s >= 0 {
				conv.messages = append(conv.messages, chatMessage{Role: "system", Content: systems[s]})
				conv.chars = len(systems[s]) + systemOverhead
				if systemSeen[s] {
					reusable = conv.chars
				}
				systemSeen[s] = true
			}
			open = append(open, conv)
		}
		if conv.system >= 0 {
			systemPrompted++
		}

		userChars := max(target-conv.chars-userOverhead, 1)
		conv.messages = append(conv.messages, chatMessage{Role: "user", Content: text(rng, userChars)})
		conv.chars += userChars + userOverhead
		conv.lastPrompt = conv.chars
		conv.turns++
		body := chatRequest{Model: cfg.Model, Messages: conv.messages, MaxTokens: rec.GeneratedTokens, Stream: true}
		body.StreamOptions.IncludeUsage = true
		raw, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		promptTokens := (conv.chars + charsPerToken - 1) / charsPerToken
		w.Requests = append(w.Requests, request{
			At:             time.Duration(float64(rec.At) / cfg.Speedup),
			Conversation:   conv.id,
			Turn:           conv.turns,
			System:         conv.system,
			PromptTokens:   promptTokens,
			ReusableTokens: reusable / charsPerToken,
			OutTokens:      rec.GeneratedTokens,
			Body:           raw,
		})
		reusableTotal += reusable / charsPerToken
		w.stats.PromptTokens += promptTokens
		w.stats.OutputTokens += rec.GeneratedTokens
		w.stats.MaxTurns = max(w.stats.MaxTurns, conv.turns)

		// The answer joins the history; the replica's own text is not used, as a client that
		// kept the history would send back what it received, which is as long as this.
		answerChars := max(rec.GeneratedTokens*charsPerToken-assistantOverhead, 1)
		conv.messages = append(conv.messages, chatMessage{Role: "assistant", Content: text(rng, answerChars)})
		conv.chars += answerChars + assistantOverhead
		conv.lastAt = rec.At
	}
	w.stats.Requests = len(w.Requests)
	w.stats.Conversations = nextID - 1
	if w.stats.PromptTokens > 0 {
		w.stats.ReusableShare = float64(reusableTotal) / float64(w.stats.PromptTokens)
	}
	if n := len(w.Requests); n > 0 {
		w.stats.DurationS = w.Requests[n-1].At.Seconds()
		w.stats.SystemPrompted = float64(systemPrompted) / float64(n)
	}
	return w, nil
}
