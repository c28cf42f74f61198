//go:build !linux

package privnet

import (
	"context"
	"errors"
	"net"
)

// Available: the private network can exist on this OS. It needs Linux's user and network
// namespaces; elsewhere local replicas listen on loopback.
const Available = false

var errNotLinux = errors.New("ferry's private network needs Linux user and network namespaces")

// Client gets sockets from the helper of one FERRY_HOME; it never connects off Linux.
type Client struct{ path string }

// NewClient returns a client of the helper listening at path.
func NewClient(path string) *Client { return &Client{path: path} }

// Path is the helper's socket.
func (c *Client) Path() string { return c.path }

// Connect fails: there is no helper off Linux.
func (c *Client) Connect() error { return errors.Join(ErrUnreachable, errNotLinux) }

// Close does nothing.
func (c *Client) Close() error { return nil }

// Socket fails: there is no helper off Linux.
func (c *Client) Socket(int) (int, error) { return -1, c.Connect() }

// DialContext fails: there is no helper off Linux.
func (c *Client) DialContext(context.Context, string) (net.Conn, error) { return nil, c.Connect() }

// Start fails: there is no helper off Linux.
func (c *Client) Start(_, _ string) error { return c.Connect() }

// Open fails: there is no helper off Linux.
func Open(_, path, _ string) (*Client, error) { return nil, NewClient(path).Connect() }

// Serve fails: there is no helper off Linux.
func Serve([]string) int { return 2 }
