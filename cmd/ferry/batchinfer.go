package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryserve/ferry/tenants"
)

func init() { register(newBatchInferCmd) }

// batchItem is one prompt of a batch: a JSONL line {"id", "prompt"} or {"id", "messages"}, or a
// plain text line (its line number is its id).
type batchItem struct {
	ID       string            `json:"id"`
	Prompt   string            `json:"prompt,omitempty"`
	Messages []json.RawMessage `json:"messages,omitempty"`
}

// batchResult is one line of the output.
type batchResult struct {
	ID         string          `json:"id"`
	Completion string          `json:"completion,omitempty"`
	Usage      json.RawMessage `json:"usage,omitempty"`
	Error      string          `json:"error,omitempty"`
}

type batchFlags struct {
	endpoint, input, output, model, keyEnv, priority string
	concurrency, maxTokens                           int
	timeout                                          time.Duration
}

func newBatchInferCmd() *cobra.Command {
	var f batchFlags
	cmd := &cobra.Command{
		Use:   "batch-infer",
		Short: "Send a file of prompts through an OpenAI-compatible endpoint (a Ferry service), resumably",
		Long: `batch-infer reads prompts (JSONL lines with "id" and "prompt" or "messages", or plain text,
one prompt per line), sends each to the endpoint's /v1/chat/completions with --concurrency
requests in flight, and appends one JSON line per prompt to --output. Prompts already answered
in --output are skipped, so a batch job that is preempted and recovered carries on where it
stopped when --output is in its checkpoint directory.

Its requests ask for the batch priority class (x-ferry-priority: batch): when every replica of
a Ferry service is saturated they wait behind interactive and standard requests and are shed
first, with 503 and a Retry-After that batch-infer honours. --priority changes it, within what
the endpoint's API key allows.`,
		Example: `  # in a job's run:
  ferry batch-infer --endpoint "$ENDPOINT" --input prompts.jsonl --output "$FERRY_CHECKPOINT_DIR/results.jsonl"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return batchInfer(cmd.Context(), f, cmd.OutOrStdout()) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.endpoint, "endpoint", "", "the service endpoint, e.g. http://127.0.0.1:30001 (required)")
	fl.StringVar(&f.input, "input", "", "file of prompts (required)")
	fl.StringVar(&f.output, "output", "", "JSONL file results are appended to (required)")
	fl.StringVar(&f.model, "model", "", "model name (default: the endpoint's first, from /v1/models)")
	fl.StringVar(&f.keyEnv, "api-key-env", "", "environment variable holding the endpoint's API key, if it needs one")
	fl.IntVar(&f.concurrency, "concurrency", 8, "requests in flight")
	fl.IntVar(&f.maxTokens, "max-tokens", 128, "max_tokens of each completion")
	fl.DurationVar(&f.timeout, "request-timeout", 5*time.Minute, "bound on one request")
	fl.StringVar(&f.priority, "priority", "batch", "priority class the requests ask for (x-ferry-priority): interactive, standard or batch")
	return cmd
}

func batchInfer(ctx context.Context, f batchFlags, progress io.Writer) error {
	if f.endpoint == "" || f.input == "" || f.output == "" {
		return fmt.Errorf("--endpoint, --input and --output are required")
	}
	target, err := newBatchTarget(f)
	if err != nil {
		return err
	}
	items, err := readBatch(f.input)
	if err != nil {
		return err
	}
	done, err := answered(f.output)
	if err != nil {
		return err
	}
	out, err := os.OpenFile(f.output, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	base := target.base
	if target.model == "" {
		if target.model, err = firstModel(ctx, target.client, base, target.key); err != nil {
			return err
		}
	}
	var todo []batchItem
	for _, it := range items {
		if !done[it.ID] {
			todo = append(todo, it)
		}
	}
	fmt.Fprintf(progress, "batch-infer: %d prompts, %d already answered, %d to send to %s (model %s)\n",
		len(items), len(items)-len(todo), len(todo), base, target.model)
	var mu sync.Mutex
	failed, sent := 0, 0
	work := make(chan batchItem)
	var wg sync.WaitGroup
	for range max(f.concurrency, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range work {
				res := target.complete(ctx, it)
				line, _ := json.Marshal(res)
				mu.Lock()
				_, _ = out.Write(append(line, '\n'))
				sent++
				if res.Error != "" {
					failed++
				}
				if sent%50 == 0 || sent == len(todo) {
					fmt.Fprintf(progress, "batch-infer: %d/%d answered (%d errors)\n", sent, len(todo), failed)
				}
				mu.Unlock()
			}
		}()
	}
	for _, it := range todo {
		select {
		case work <- it:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d prompts failed (their lines say why); run again to retry them", failed, len(todo))
	}
	return nil
}

// readBatch reads the prompts; ids default to the line number.
func readBatch(path string) ([]batchItem, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []batchItem
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		it := batchItem{ID: strconv.Itoa(n), Prompt: line}
		if strings.HasPrefix(line, "{") {
			it = batchItem{}
			if err := json.Unmarshal([]byte(line), &it); err != nil {
				return nil, fmt.Errorf("%s:%d: %v", path, n, err)
			}
			if it.ID == "" {
				it.ID = strconv.Itoa(n)
			}
			if it.Prompt == "" && len(it.Messages) == 0 {
				return nil, fmt.Errorf("%s:%d: a line needs \"prompt\" or \"messages\"", path, n)
			}
		}
		out = append(out, it)
	}
	return out, sc.Err()
}

// answered are the ids already in the output without an error.
func answered(path string) (map[string]bool, error) {
	done := map[string]bool{}
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return done, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var r batchResult
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Error == "" {
			done[r.ID] = true
		}
	}
	return done, sc.Err()
}

func firstModel(ctx context.Context, c *http.Client, base, key string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return "", err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("ask %s for its models: %w", base, err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil || len(list.Data) == 0 {
		return "", fmt.Errorf("%s/v1/models named no model (HTTP %d); pass --model", base, resp.StatusCode)
	}
	return list.Data[0].ID, nil
}

// batchTarget is where and how batch-infer sends its prompts.
type batchTarget struct {
	client                     *http.Client
	base, key, model, priority string
	maxTokens                  int
}

// newBatchTarget reads the flags that say where and how to send.
func newBatchTarget(f batchFlags) (batchTarget, error) {
	priority, err := tenants.ParsePriority(f.priority)
	if err != nil {
		return batchTarget{}, fmt.Errorf("--priority: %w", err)
	}
	key := ""
	if f.keyEnv != "" {
		key = os.Getenv(f.keyEnv)
	}
	return batchTarget{client: &http.Client{Timeout: f.timeout}, base: strings.TrimRight(f.endpoint, "/"), key: key,
		model: f.model, maxTokens: f.maxTokens, priority: priority.String()}, nil
}

// maxBatchRetryAfter bounds the wait a Retry-After may ask of one retry.
const maxBatchRetryAfter = time.Minute

// complete sends one prompt; transient answers (429, 503) are retried a few times, after the
// answer's Retry-After when it gives one.
func (t batchTarget) complete(ctx context.Context, it batchItem) batchResult {
	msgs := it.Messages
	if len(msgs) == 0 {
		m, _ := json.Marshal(map[string]string{"role": "user", "content": it.Prompt})
		msgs = []json.RawMessage{m}
	}
	body, _ := json.Marshal(map[string]any{"model": t.model, "messages": msgs, "max_tokens": t.maxTokens})
	var last string
	var wait time.Duration
	for attempt := range 5 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return batchResult{ID: it.ID, Error: ctx.Err().Error()}
			case <-time.After(max(wait, time.Duration(attempt)*time.Second)):
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.base+"/v1/chat/completions", bytes.NewReader(body))
		if err != nil {
			return batchResult{ID: it.ID, Error: err.Error()}
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Ferry-Priority", t.priority)
		if t.key != "" {
			req.Header.Set("Authorization", "Bearer "+t.key)
		}
		resp, err := t.client.Do(req)
		if err != nil {
			last = err.Error()
			continue
		}
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
			last = fmt.Sprintf("HTTP %d", resp.StatusCode)
			wait = retryAfter(resp.Header.Get("Retry-After"))
			continue
		}
		if resp.StatusCode != http.StatusOK {
			return batchResult{ID: it.ID, Error: fmt.Sprintf("HTTP %d: %.200s", resp.StatusCode, data)}
		}
		var cr struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
			Usage json.RawMessage `json:"usage"`
		}
		if err := json.Unmarshal(data, &cr); err != nil || len(cr.Choices) == 0 {
			return batchResult{ID: it.ID, Error: "unreadable completion"}
		}
		return batchResult{ID: it.ID, Completion: cr.Choices[0].Message.Content, Usage: cr.Usage}
	}
	return batchResult{ID: it.ID, Error: "gave up after 5 tries: " + last}
}

// retryAfter reads a Retry-After in seconds, at most maxBatchRetryAfter; 0 when there is none.
func retryAfter(v string) time.Duration {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n <= 0 {
		return 0
	}
	return min(time.Duration(n)*time.Second, maxBatchRetryAfter)
}
