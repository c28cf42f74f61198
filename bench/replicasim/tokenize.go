package replicasim

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// The simulator's tokenizer is a stand-in for a model's: token i of a rendered prompt is the
// little-endian uint32 of its bytes [4i, 4i+4), a short last token zero-padded. It agrees with
// what the rest of the simulator already assumes (four bytes a token, estimateTokens, and 16
// tokens = 64 bytes a block, blockHashes), so the token ids /tokenize returns and those the KV
// events carry describe exactly the blocks the prefix cache holds. It is not meant to resemble
// any real vocabulary; what matters to a consumer is that the same prompt always gives the same
// ids and that a shared byte prefix gives a shared token prefix.

// tokenAt is token i of prompt.
func tokenAt(prompt []byte, i int) uint32 {
	b := prompt[i*charsPerToken : min((i+1)*charsPerToken, len(prompt))]
	if len(b) == charsPerToken {
		return binary.LittleEndian.Uint32(b)
	}
	var pad [charsPerToken]byte
	copy(pad[:], b)
	return binary.LittleEndian.Uint32(pad[:])
}

// tokenizeRequest is either of vLLM's /tokenize bodies: TokenizeCompletionRequest (prompt) or
// TokenizeChatRequest (messages). Fields that change nothing here (add_special_tokens,
// chat_template, tools) are accepted and ignored.
type tokenizeRequest struct {
	Model                string          `json:"model"`
	Prompt               json.RawMessage `json:"prompt"`
	Messages             []chatMessage   `json:"messages"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	ReturnTokenStrs      bool            `json:"return_token_strs"`
}

// tokenize serves vLLM's POST /tokenize. A chat body is rendered exactly as
// /v1/chat/completions renders it, so the answer is the engine's own prompt tokens, the ids its
// KV events are keyed by. The simulator's template has an empty generation prompt, so
// add_generation_prompt changes nothing.
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	sc := s.admit(w, r, s.metrics.tokenizeRequests)
	if sc == nil {
		return
	}
	defer s.putScratch(sc)
	var aerr *apiError
	var req tokenizeRequest
	if req, sc.prompt, aerr = parseTokenizeRequest(sc.body, sc.prompt[:0]); aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	if req.Model != "" && req.Model != s.cfg.Model {
		writeAPIError(w, modelNotFound(req.Model))
		return
	}
	sc.out = appendTokenizeResponse(sc.out[:0], sc.prompt, req.ReturnTokenStrs)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(sc.out)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(sc.out)
}

// parseTokenizeRequest decodes body and appends the rendered prompt to prompt.
func parseTokenizeRequest(body, prompt []byte) (tokenizeRequest, []byte, *apiError) {
	var req tokenizeRequest
	if aerr := decodeJSON(body, &req); aerr != nil {
		return req, prompt, aerr
	}
	var perr *apiError
	switch {
	case len(req.Prompt) > 0:
		prompt, perr = renderPrompt(prompt, req.Prompt)
	case req.Messages != nil:
		if req.ContinueFinalMessage && (req.AddGenerationPrompt == nil || *req.AddGenerationPrompt) {
			return req, prompt, badRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
		}
		prompt, perr = renderChat(prompt, req.Messages)
	default:
		perr = badRequest("either prompt or messages is required")
	}
	return req, prompt, perr
}

// appendTokenizeResponse appends vLLM's TokenizeResponse for prompt: count, max_model_len,
// tokens and token_strs (null unless asked for; here each token's bytes).
func appendTokenizeResponse(dst, prompt []byte, withStrs bool) []byte {
	n := estimateTokens(prompt)
	dst = append(dst, `{"count":`...)
	dst = strconv.AppendInt(dst, int64(n), 10)
	dst = append(dst, `,"max_model_len":`...)
	dst = strconv.AppendInt(dst, maxModelLen, 10)
	dst = append(dst, `,"tokens":[`...)
	for i := range n {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(tokenAt(prompt, i)), 10)
	}
	dst = append(dst, `],"token_strs":`...)
	if !withStrs {
		return append(dst, "null}\n"...)
	}
	dst = append(dst, '[')
	for i := range n {
		if i > 0 {
			dst = append(dst, ',')
		}
		// A token may split a UTF-8 sequence; json.Marshal writes U+FFFD for the stray bytes.
		q, _ := json.Marshal(string(prompt[i*charsPerToken : min((i+1)*charsPerToken, len(prompt))]))
		dst = append(dst, q...)
	}
	return append(dst, "]}\n"...)
}

// modelNotFound is OpenAI's (and vLLM's) answer to a request for a model the server lacks.
func modelNotFound(model string) *apiError {
	return &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "model_not_found",
		message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", model)}
}
