// Package kvevents hears engines report their KV caches: vLLM's KV-cache events (BlockStored,
// BlockRemoved, AllBlocksCleared), published over ZeroMQ, applied to one policy.KVBlocks per
// engine for least_ttft to match prompts' token ids against.
//
// As in llm-d's deployments, the proxy binds a SUB socket and every engine's publisher connects
// to it, configured with
//
//	--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
//	  "endpoint": "tcp://PROXY:5557", "topic": "kv@HOST:PORT@MODEL"}'
//
// where HOST:PORT is the address the proxy reaches the engine at (Ferry's replicas find theirs
// in $FERRY_HOST and $FERRY_PORT). The topic names the engine; a topic with a host and no port
// (llm-d's kv@POD_IP@MODEL) names the one replica at that host.
//
// Each message is [topic, sequence number (8 bytes, big-endian), msgpack payload]. A sequence
// number that goes back means the publisher restarted, and with it the engine's cache: its
// index starts afresh. One that skips counts as a gap (ferry_kv_event_gaps_total): the blocks
// stored meanwhile are unknown, and their descendants are left out as orphans until chains that
// start afresh replace them. vLLM's replay socket is not used.
package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/policy"
)

// maxEngines bounds the engines one listener keeps an index for. Topics are not authenticated
// (ZeroMQ's NULL mechanism, as vLLM uses it): beyond this, new names are refused rather than
// letting a stray publisher grow the proxy without bound.
const maxEngines = 4096

// Listener is a bound SUB socket and the indexes of the engines publishing to it.
type Listener struct {
	sock   zmq4.Socket
	addr   string
	log    *zap.Logger
	cancel context.CancelFunc
	done   chan struct{}
	closed atomic.Bool

	mu      sync.Mutex
	engines map[string]*engine // by host:port

	counters
}

// counters are the metrics both ways of hearing engines keep.
type counters struct {
	batches *prometheus.CounterVec
	blocks  *prometheus.CounterVec
	gaps    prometheus.Counter
}

func newCounters() counters {
	return counters{
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_kv_event_batches_total",
			Help: "KV-cache event batches received from engines, by result: applied, undecodable (not a vLLM KVEventBatch), unrouted (a topic naming no engine this proxy routes to, or past the limit of engines)."}, []string{"result"}),
		blocks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_kv_event_blocks_total",
			Help: "KV-cache blocks engines reported, by event: stored, removed, ignored (a LoRA adapter's, another medium's or another KV-cache group's, which prompts for the base model cannot use)."}, []string{"event"}),
		gaps: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_kv_event_gaps_total",
			Help: "Times an engine's event sequence skipped numbers: events were lost, and the proxy's picture of that engine's cache misses what they said."}),
	}
}

// Collectors are the metrics, for the proxy's registry.
func (c *counters) Collectors() []prometheus.Collector {
	return []prometheus.Collector{c.batches, c.blocks, c.gaps}
}

// engine is one publisher's index and where its sequence stands.
type engine struct {
	kv      *policy.KVBlocks
	seq     uint64
	started bool
}

// Listen binds endpoint (tcp://HOST:PORT; port 0 picks one) and applies what engines publish
// until Close.
func Listen(endpoint string, log *zap.Logger) (*Listener, error) {
	if !strings.HasPrefix(endpoint, "tcp://") {
		return nil, fmt.Errorf("KV events endpoint %q: want tcp://HOST:PORT", endpoint)
	}
	if _, _, err := net.SplitHostPort(strings.TrimPrefix(endpoint, "tcp://")); err != nil {
		return nil, fmt.Errorf("KV events endpoint %q: %w", endpoint, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stdlog, err := zap.NewStdLogAt(log.Named("zmq"), zap.DebugLevel)
	if err != nil {
		cancel()
		return nil, err
	}
	sock := zmq4.NewSub(ctx, zmq4.WithLogger(stdlog))
	if err := sock.Listen(endpoint); err != nil {
		cancel()
		return nil, fmt.Errorf("KV events: listen on %s: %w", endpoint, err)
	}
	if err := sock.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		sock.Close()
		cancel()
		return nil, fmt.Errorf("KV events: subscribe: %w", err)
	}
	l := &Listener{
		sock: sock, addr: sock.Addr().String(), log: log, cancel: cancel, done: make(chan struct{}),
		engines: map[string]*engine{}, counters: newCounters(),
	}
	go l.run()
	return l, nil
}

// Addr is the bound host:port.
func (l *Listener) Addr() string { return l.addr }

// Endpoint is the address engines' publishers connect to, tcp://HOST:PORT.
func (l *Listener) Endpoint() string { return "tcp://" + l.addr }

// Describe says where engines publish to.
func (l *Listener) Describe() string { return "listening at " + l.Endpoint() }

// Close stops listening.
func (l *Listener) Close() error {
	l.closed.Store(true)
	l.cancel()
	err := l.sock.Close()
	<-l.done
	return err
}

// For returns the index of the engine at addr (host:port), creating it: the proxy attaches it
// to the replica at that address (policy.Replica.SetKV). Events may come first (a replica
// warming up before it is READY); they are kept for it.
func (l *Listener) For(addr string) *policy.KVBlocks {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.engines[addr]; ok {
		return e.kv
	}
	e := &engine{kv: policy.NewKVBlocks()}
	l.engines[addr] = e
	return e.kv
}

func (l *Listener) run() {
	defer close(l.done)
	dec := newDecoder()
	for {
		msg, err := l.sock.Recv()
		if err != nil {
			if l.closed.Load() || errors.Is(err, context.Canceled) || errors.Is(err, net.ErrClosed) {
				return
			}
			l.log.Debug("KV events: receive", zap.Error(err))
			time.Sleep(10 * time.Millisecond) // a broken peer; not a reason to spin
			continue
		}
		l.apply(dec, msg.Frames)
	}
}

// apply routes one message to its engine's index.
func (l *Listener) apply(dec *decoder, frames [][]byte) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		l.batches.WithLabelValues("undecodable").Inc()
		return
	}
	e := l.route(string(frames[0]))
	if e == nil {
		l.batches.WithLabelValues("unrouted").Inc()
		return
	}
	l.applyTo(e, dec, frames, l.log)
}

// applyTo applies one message to engine e's index. Only one goroutine applies to an engine.
func (c *counters) applyTo(e *engine, dec *decoder, frames [][]byte, log *zap.Logger) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		c.batches.WithLabelValues("undecodable").Inc()
		return
	}
	events, err := dec.batch(frames[2])
	if err != nil {
		c.batches.WithLabelValues("undecodable").Inc()
		log.Debug("KV events: undecodable batch", zap.String("topic", string(frames[0])), zap.Error(err))
		return
	}
	seq := binary.BigEndian.Uint64(frames[1])
	switch {
	case e.started && seq <= e.seq:
		e.kv.Cleared() // the publisher restarted, and with it the engine's cache
	case e.started && seq > e.seq+1:
		c.gaps.Inc()
	}
	e.started, e.seq = true, seq
	for i := range events {
		c.applyEvent(e.kv, &events[i])
	}
	c.batches.WithLabelValues("applied").Inc()
}

func (c *counters) applyEvent(kv *policy.KVBlocks, ev *event) {
	switch {
	case ev.kind == kindCleared:
		kv.Cleared()
	case ev.other:
		c.blocks.WithLabelValues("ignored").Add(float64(len(ev.hashes)))
	case ev.kind == kindStored:
		kv.Stored(ev.parent, ev.hasParent, ev.hashes, ev.tokens, ev.blockSize)
		c.blocks.WithLabelValues("stored").Add(float64(len(ev.hashes)))
	case ev.kind == kindRemoved:
		kv.Removed(ev.hashes)
		c.blocks.WithLabelValues("removed").Add(float64(len(ev.hashes)))
	}
}

// route finds the engine a topic names: kv@HOST:PORT@MODEL, or kv@HOST@MODEL for the one
// engine at HOST. The listener's goroutine is the only one to touch an engine's sequence.
func (l *Listener) route(topic string) *engine {
	name, ok := strings.CutPrefix(topic, "kv@")
	if !ok {
		return nil
	}
	if i := strings.LastIndexByte(name, '@'); i >= 0 {
		name = name[:i]
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, _, err := net.SplitHostPort(name); err == nil {
		if e, ok := l.engines[name]; ok {
			return e
		}
		if len(l.engines) >= maxEngines {
			return nil
		}
		e := &engine{kv: policy.NewKVBlocks()}
		l.engines[name] = e
		return e
	}
	var found *engine
	for addr, e := range l.engines {
		if host, _, _ := net.SplitHostPort(addr); host == name {
			if found != nil {
				return nil // several engines at that host: the topic must name the port
			}
			found = e
		}
	}
	return found
}
