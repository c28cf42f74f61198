package kvevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/policy"
)

// Subscriber is the other way to hear engines, and vLLM's own default: each engine's publisher
// binds (`"endpoint": "tcp://*:5557"`, the default of --kv-events-config), and the proxy
// connects to every replica it routes to, at the replica's host and the publisher's port. It
// needs no per-replica configuration (the topic may be empty: a connection is one engine), and
// any number of proxies can connect to the same engine, which a publisher that connects to one
// proxy's Listener cannot serve.
type Subscriber struct {
	port int
	log  *zap.Logger
	counters

	mu     sync.Mutex
	subs   map[string]*subscription // by the replica's host:port
	closed bool
}

// subscription is one replica's engine, its socket and the goroutine applying what it says.
type subscription struct {
	engine
	refs   int // For calls not yet matched by Forget; guarded by Subscriber.mu
	cancel context.CancelFunc
	done   chan struct{}
}

// Subscribe returns a Subscriber connecting to port on each replica's host.
func Subscribe(port int, log *zap.Logger) (*Subscriber, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("KV events port %d: want 1-65535", port)
	}
	return &Subscriber{port: port, log: log, subs: map[string]*subscription{}, counters: newCounters()}, nil
}

// For returns the index of the engine behind the replica at addr (host:port), connecting to its
// publisher the first time. The connection is retried in the background until the engine's
// publisher answers, and again whenever it drops. Every For is matched by a Forget when its
// caller lets go of the replica (several services or updates may hold one address).
func (s *Subscriber) For(addr string) *policy.KVBlocks {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sub, ok := s.subs[addr]; ok {
		sub.refs++
		return sub.kv
	}
	sub := &subscription{engine: engine{kv: policy.NewKVBlocks()}, refs: 1, done: make(chan struct{})}
	host, _, err := net.SplitHostPort(addr)
	if err != nil || s.closed {
		close(sub.done)
		return sub.kv // never hears anything: the picker keeps guessing from bytes
	}
	var ctx context.Context
	ctx, sub.cancel = context.WithCancel(context.Background())
	s.subs[addr] = sub
	go s.run(ctx, sub, "tcp://"+net.JoinHostPort(host, strconv.Itoa(s.port)))
	return sub.kv
}

// Forget matches a For: when no caller holds the replica at addr any more, the connection to its
// engine closes. It does not wait for that: callers hold their service's lock, and a
// connection still dialling an engine that never answered ends only at its next retry (Close
// waits).
func (s *Subscriber) Forget(addr string) {
	s.mu.Lock()
	sub, ok := s.subs[addr]
	if ok {
		if sub.refs--; sub.refs > 0 {
			ok = false
		} else {
			delete(s.subs, addr)
		}
	}
	s.mu.Unlock()
	if ok {
		sub.cancel()
	}
}

// Close closes every connection.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	s.closed = true
	subs := s.subs
	s.subs = map[string]*subscription{}
	s.mu.Unlock()
	for _, sub := range subs {
		sub.cancel()
		<-sub.done
	}
	return nil
}

func (s *Subscriber) run(ctx context.Context, sub *subscription, endpoint string) {
	defer close(sub.done)
	log := s.log.With(zap.String("endpoint", endpoint))
	stdlog, err := zap.NewStdLogAt(log.Named("zmq"), zap.DebugLevel)
	if err != nil {
		return
	}
	sock := zmq4.NewSub(ctx, zmq4.WithLogger(stdlog), zmq4.WithDialerRetry(time.Second),
		zmq4.WithDialerMaxRetries(-1), zmq4.WithAutomaticReconnect(true))
	defer sock.Close()
	if err := sock.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		log.Warn("KV events: subscribe", zap.Error(err))
		return
	}
	if err := sock.Dial(endpoint); err != nil { // returns once connected, or when ctx ends
		if ctx.Err() == nil {
			log.Warn("KV events: connect", zap.Error(err))
		}
		return
	}
	dec := newDecoder()
	for {
		msg, err := sock.Recv()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			log.Debug("KV events: receive", zap.Error(err))
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond): // a broken peer; not a reason to spin
			}
			continue
		}
		s.applyTo(&sub.engine, dec, msg.Frames, log)
	}
}

// Source is either way of hearing engines: what the proxy and the controller hold.
type Source interface {
	For(addr string) *policy.KVBlocks
	Collectors() []prometheus.Collector
	Close() error
	// Describe says where engines' events come from, for the log.
	Describe() string
}

// Open returns a Listener on listen (engines connect to it), or a Subscriber to connectPort on
// every replica's host (each engine binds), whichever is set; nil, nil when neither is.
func Open(listen string, connectPort int, log *zap.Logger) (Source, error) {
	switch {
	case listen != "" && connectPort != 0:
		return nil, errors.New("KV events: listen for publishers or connect to them, not both")
	case listen != "":
		return Listen(listen, log)
	case connectPort != 0:
		return Subscribe(connectPort, log)
	}
	return nil, nil
}

// Describe says where the subscriber connects.
func (s *Subscriber) Describe() string {
	return fmt.Sprintf("connecting to every replica's publisher at port %d", s.port)
}
