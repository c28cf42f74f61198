package api

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/internal/rpc"
)

// Client is the controller's client with the domain's calls (services, logs, jobs) on top of
// the generic one.
type Client struct{ *rpc.Client }

// NewClient returns a client for the controller at base, over TCP (rpc.NewClient).
func NewClient(base, token string) *Client { return &Client{rpc.NewClient(base, token)} }

// ClientFor returns a client for the controller h's controller.json (info) describes
// (rpc.ClientFor).
func ClientFor(h home.Home, info home.Info, token string) (*Client, error) {
	c, err := rpc.ClientFor(h, info, token)
	if err != nil {
		return nil, err
	}
	return &Client{c}, nil
}

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
	resp, err := c.Request(ctx, http.MethodGet, path+"?"+q.Encode(), nil)
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
