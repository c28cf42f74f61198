package replicasim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// maxModelLen is the context window the simulator pretends to have. Like vLLM it rejects a
// request whose prompt plus max_tokens exceed it, which also keeps one request from asking for
// gigabytes of filler text.
const maxModelLen = 131072

// endpoint says which OpenAI API a request came through; it decides the request fields, the
// id prefix and the response shapes.
type endpoint uint8

const (
	chatEndpoint       endpoint = iota // /v1/chat/completions
	completionEndpoint                 // /v1/completions
)

// completionRequest holds the fields of either API that change the simulation; the rest
// (temperature, n, stop, tools, …) are accepted and ignored, as a sampler-free replica may.
type completionRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	// KVTransferParams is vLLM's field for prefill/decode disaggregation (pd.go).
	KVTransferParams *kvTransferParams `json:"kv_transfer_params"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// contentPart is one element of an array-valued message content; only text parts count.
type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// apiError is an OpenAI error response; its status and body are written by writeAPIError.
type apiError struct {
	status  int
	typ     string
	code    string // empty → JSON null
	message string
}

func (e *apiError) Error() string { return e.message }

// decodeJSON decodes a request body into v, or says what is wrong with it as a 400.
func decodeJSON(body []byte, v any) *apiError {
	if err := json.Unmarshal(body, v); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			return badRequest("invalid type for field %q: %v", typeErr.Field, err)
		}
		return badRequest("request body is not valid JSON: %v", err)
	}
	return nil
}

func badRequest(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", message: fmt.Sprintf(format, args...)}
}

// parseRequest decodes body, checks it against the endpoint's required fields, and appends the
// rendered prompt (the text whose length estimates tokens and whose blocks are hashed) to
// prompt. Every failure is an *apiError ready to send.
func parseRequest(ep endpoint, body []byte, prompt []byte) (completionRequest, []byte, *apiError) {
	var req completionRequest
	if aerr := decodeJSON(body, &req); aerr != nil {
		return req, prompt, aerr
	}
	var perr *apiError
	switch ep {
	case chatEndpoint:
		prompt, perr = renderChat(prompt, req.Messages)
	case completionEndpoint:
		prompt, perr = renderPrompt(prompt, req.Prompt)
	}
	if perr != nil {
		return req, prompt, perr
	}
	if req.MaxTokens != nil && *req.MaxTokens < 1 {
		return req, prompt, badRequest("max_tokens must be at least 1, got %d", *req.MaxTokens)
	}
	if req.MaxCompletionTokens != nil && *req.MaxCompletionTokens < 1 {
		return req, prompt, badRequest("max_completion_tokens must be at least 1, got %d", *req.MaxCompletionTokens)
	}
	return req, prompt, nil
}

// outputTokens is how many tokens to generate: max_completion_tokens wins over the older
// max_tokens, as in vLLM, and the replica's default applies when neither is set.
func (r *completionRequest) outputTokens(def int) int {
	switch {
	case r.MaxCompletionTokens != nil:
		return *r.MaxCompletionTokens
	case r.MaxTokens != nil:
		return *r.MaxTokens
	}
	return def
}

func (r *completionRequest) includeUsage() bool {
	return r.StreamOptions != nil && r.StreamOptions.IncludeUsage
}

// renderChat appends "role: content\n" for every message, a stand-in for a chat template that
// keeps a shared system prompt a shared prefix.
func renderChat(dst []byte, msgs []chatMessage) ([]byte, *apiError) {
	if len(msgs) == 0 {
		return dst, badRequest("messages is required and must be a non-empty array")
	}
	for i := range msgs {
		m := &msgs[i]
		if m.Role == "" {
			return dst, badRequest("messages[%d].role is required", i)
		}
		dst = append(dst, m.Role...)
		dst = append(dst, ": "...)
		var err *apiError
		if dst, err = appendContent(dst, m.Content, i); err != nil {
			return dst, err
		}
		dst = append(dst, '\n')
	}
	return dst, nil
}

// appendContent appends a message's text: a string, an array of parts (text parts only), or
// null/absent (an assistant turn that only called tools).
func appendContent(dst []byte, raw json.RawMessage, i int) ([]byte, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return dst, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return dst, badRequest("messages[%d].content: %v", i, err)
		}
		return append(dst, s...), nil
	case '[':
		var parts []contentPart
		if err := json.Unmarshal(raw, &parts); err != nil {
			return dst, badRequest("messages[%d].content must be a string or an array of content parts: %v", i, err)
		}
		for _, p := range parts {
			if p.Type == "text" {
				dst = append(dst, p.Text...)
			}
		}
		return dst, nil
	}
	return dst, badRequest("messages[%d].content must be a string or an array of content parts", i)
}

// renderPrompt appends a completions prompt: a string, or an array of strings taken as one
// prompt (the simulator returns a single choice).
func renderPrompt(dst []byte, raw json.RawMessage) ([]byte, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return dst, badRequest("prompt is required")
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return dst, badRequest("prompt: %v", err)
		}
		return append(dst, s...), nil
	case '[':
		var parts []string
		if err := json.Unmarshal(raw, &parts); err != nil {
			return dst, badRequest("prompt must be a string or an array of strings (token arrays are not supported): %v", err)
		}
		if len(parts) == 0 {
			return dst, badRequest("prompt must not be an empty array")
		}
		for _, p := range parts {
			dst = append(dst, p...)
		}
		return dst, nil
	}
	return dst, badRequest("prompt must be a string or an array of strings")
}

// estimateTokens is the simulator's tokenizer: one token per four bytes, rounded up.
func estimateTokens(prompt []byte) int {
	return (len(prompt) + charsPerToken - 1) / charsPerToken
}

// errorBody is the OpenAI error envelope: {"error":{"message","type","param","code"}}.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func writeAPIError(w http.ResponseWriter, e *apiError) {
	var body errorBody
	body.Error.Message = e.message
	body.Error.Type = e.typ
	if e.code != "" {
		body.Error.Code = &e.code
	}
	b, _ := json.Marshal(body) // cannot fail: strings and nil pointers only
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(e.status)
	_, _ = w.Write(append(b, '\n'))
}

// vocabulary is the filler the simulator "generates": plain ASCII words, so responses need no
// JSON escaping and every token is exactly one word with a leading space.
var vocabulary = [64]string{
	" the", " of", " and", " to", " in", " a", " is", " that", " for", " it",
	" as", " was", " with", " be", " by", " on", " not", " he", " this", " are",
	" or", " his", " from", " at", " which", " but", " have", " an", " had", " they",
	" you", " were", " their", " one", " all", " we", " can", " her", " has", " there",
	" been", " if", " more", " when", " will", " would", " who", " so", " no", " ferry",
	" river", " boat", " crossing", " harbor", " tide", " rope", " deck", " wave", " shore", " cargo",
	" lantern", " bridge", " current", " dock",
}

// appendID appends 32 hex digits, the shape of vLLM's random request ids.
func appendID(dst []byte, a, b uint64) []byte {
	const hexDigits = "0123456789abcdef"
	for _, v := range [2]uint64{a, b} {
		for shift := 60; shift >= 0; shift -= 4 {
			dst = append(dst, hexDigits[(v>>uint(shift))&0xf])
		}
	}
	return dst
}
