package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

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
	resp, err := c.request(ctx, method, path, body)
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

// request sends a request and turns a non-2xx answer into a typed error.
func (c *Client) request(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
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

// Error is a controller error of a known kind; errors.Is matches the kind.
type Error struct {
	Kind error
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Unwrap lets errors.Is(err, ErrNotFound) work on client errors.
func (e *Error) Unwrap() error { return e.Kind }

// ControllerStatus asks the controller who it is; the CLI uses it as the liveness check.
func (c *Client) ControllerStatus(ctx context.Context) (ControllerStatus, error) {
	var st ControllerStatus
	err := c.Do(ctx, http.MethodGet, "/v1/controller", nil, &st)
	return st, err
}

// StopController asks the controller to exit.
func (c *Client) StopController(ctx context.Context) error {
	return c.Do(ctx, http.MethodPost, "/v1/controller/stop", nil, nil)
}

// CreateService launches a service.
func (c *Client) CreateService(ctx context.Context, req CreateServiceRequest) (ServiceStatus, error) {
	var st ServiceStatus
	err := c.Do(ctx, http.MethodPost, "/v1/services", req, &st)
	return st, err
}

// Services lists the named services (all when names is empty).
func (c *Client) Services(ctx context.Context, names ...string) ([]ServiceStatus, error) {
	path := "/v1/services"
	if len(names) > 0 {
		path += "?names=" + url.QueryEscape(strings.Join(names, ","))
	}
	var list []ServiceStatus
	err := c.Do(ctx, http.MethodGet, path, nil, &list)
	return list, err
}

// UpdateService starts a rollout of a service to a new task; it returns once the rollout is
// recorded, not when it finishes (watch Services' Update).
func (c *Client) UpdateService(ctx context.Context, name string, req UpdateServiceRequest) (ServiceStatus, error) {
	var st ServiceStatus
	err := c.Do(ctx, http.MethodPost, "/v1/services/"+url.PathEscape(name)+"/update", req, &st)
	return st, err
}

// LogOptions select which part of a log to read.
type LogOptions struct {
	// Tail is the number of last lines; negative means the whole file.
	Tail   int
	Follow bool
}

// ReplicaLogs copies a replica's log to w; with Follow it returns when ctx ends.
func (c *Client) ReplicaLogs(ctx context.Context, service string, id int, opts LogOptions, w io.Writer) error {
	path := "/v1/services/" + url.PathEscape(service) + "/replicas/" + strconv.Itoa(id) + "/logs"
	return c.copyLog(ctx, path, opts, w)
}

// ControllerLogs copies the controller's log to w.
func (c *Client) ControllerLogs(ctx context.Context, opts LogOptions, w io.Writer) error {
	return c.copyLog(ctx, "/v1/controller/logs", opts, w)
}

func (c *Client) copyLog(ctx context.Context, path string, opts LogOptions, w io.Writer) error {
	q := url.Values{}
	if opts.Tail >= 0 {
		q.Set("tail", strconv.Itoa(opts.Tail))
	}
	if opts.Follow {
		q.Set("follow", "1")
	}
	resp, err := c.request(ctx, http.MethodGet, path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// WaitTimeout bounds how long a caller waits for a controller to answer its liveness check.
const WaitTimeout = 20 * time.Second
