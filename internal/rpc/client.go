package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Errors the server maps to HTTP statuses and the client maps back, so callers use errors.Is.
var (
	ErrNotFound     = errors.New("not found")
	ErrConflict     = errors.New("already exists")
	ErrInvalid      = errors.New("invalid request")
	ErrUnauthorized = errors.New("unauthorized")
	// ErrForbidden is a valid token of too narrow a scope for the call (the attach token).
	ErrForbidden = errors.New("forbidden")
)

// ErrorBody is the JSON shape of every API error.
type ErrorBody struct {
	Error struct {
		Message string `json:"message"`
		Code    string `json:"code"`
	} `json:"error"`
}

// Error is a controller error of a known kind; errors.Is matches the kind.
type Error struct {
	Kind error
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Unwrap lets errors.Is(err, ErrNotFound) work on client errors.
func (e *Error) Unwrap() error { return e.Kind }

// Client talks to one controller. ClientFor makes one from what the controller published in
// its home.
type Client struct {
	// Base is the URL prefix of every call: "http://127.0.0.1:PORT" over TCP.
	Base  string
	Token string
	HTTP  *http.Client
	// Where names the controller's listener in messages: "unix:PATH" or Base.
	Where string
}

// NewClient returns a client for the controller at base, over TCP. Calls have no whole-request
// timeout (logs stream); callers bound them with their context.
func NewClient(base, token string) *Client {
	base = strings.TrimRight(base, "/")
	return &Client{Base: base, Token: token, HTTP: &http.Client{}, Where: base}
}

// Do sends an authenticated request to path (which carries its query), with in as its JSON
// body unless in is nil, and decodes a 2xx answer into out (nil discards it). An answer of a
// kind the API names (404, 409, 400, 401, 403) is an *Error that errors.Is matches with
// ErrNotFound, ErrConflict, ErrInvalid, ErrUnauthorized or ErrForbidden.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	resp, err := c.Request(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode response: %w", method, path, err)
	}
	return nil
}

// Request sends an authenticated request and turns a non-2xx answer into a typed error; the
// caller reads and closes a 2xx answer's body (a log stream).
func (c *Client) Request(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	var eb ErrorBody
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	msg := strings.TrimSpace(string(raw))
	if json.Unmarshal(raw, &eb) == nil && eb.Error.Message != "" {
		msg = eb.Error.Message
	}
	var kind error
	switch resp.StatusCode {
	case http.StatusNotFound:
		kind = ErrNotFound
	case http.StatusConflict:
		kind = ErrConflict
	case http.StatusBadRequest:
		kind = ErrInvalid
	case http.StatusUnauthorized:
		kind = ErrUnauthorized
	case http.StatusForbidden:
		kind = ErrForbidden
	default:
		return nil, fmt.Errorf("controller: %s (HTTP %d)", msg, resp.StatusCode)
	}
	return nil, &Error{Kind: kind, Msg: msg}
}
