package replicasim

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// TestOfficialClient talks to the simulator through openai-go, the client Ferry's users and
// benchmarks use, so a response shape it cannot parse fails here rather than in a demo.
func TestOfficialClient(t *testing.T) {
	_, base := startServer(t, fastConfig())
	client := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model:     "ferry-sim",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("hello")},
		MaxTokens: openai.Int(5),
	}

	res, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	if len(res.Choices) != 1 || len(strings.Fields(res.Choices[0].Message.Content)) != 5 || res.Usage.CompletionTokens != 5 {
		t.Errorf("chat response = %+v", res)
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		if !acc.AddChunk(stream.Current()) {
			t.Fatalf("accumulator rejected chunk %s", stream.Current().RawJSON())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if len(acc.Choices) != 1 || len(strings.Fields(acc.Choices[0].Message.Content)) != 5 ||
		acc.Choices[0].FinishReason != "length" || acc.Usage.CompletionTokens != 5 || acc.Usage.PromptTokens != res.Usage.PromptTokens {
		t.Errorf("accumulated stream = %+v", acc.ChatCompletion)
	}

	comp, err := client.Completions.New(ctx, openai.CompletionNewParams{
		Model:     "ferry-sim",
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
		MaxTokens: openai.Int(3),
	})
	if err != nil {
		t.Fatalf("completion: %v", err)
	}
	if len(comp.Choices) != 1 || len(strings.Fields(comp.Choices[0].Text)) != 3 || comp.Usage.TotalTokens != comp.Usage.PromptTokens+3 {
		t.Errorf("completion = %+v", comp)
	}

	_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "no-such-model", Messages: params.Messages,
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Errorf("unknown model: err = %v, want a 404 model_not_found", err)
	}
}
