package replicasim

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// A test's own reading of vLLM's KV-event messages, written from vllm/distributed/kv_events.py
// rather than from the encoder, so that an encoder mistake fails a test.

// kvMessage is one decoded multipart message.
type kvMessage struct {
	topic  string
	seq    uint64
	ts     float64
	dpRank any
	keys   []string // the batch's map keys in order; nil for the array encoding
	events []kvEvent
}

// kvEvent is one decoded event; fields is what follows the tag, by name in the map encoding or
// by vLLM's declaration order in the array encoding.
type kvEvent struct {
	typ    string
	keys   []string // map keys in order, "type" first; nil for arrays
	fields map[string]any
}

func (e kvEvent) hashes(t *testing.T) []uint64 { return uints(t, e.fields["block_hashes"]) }

// Field order of the array_like structs, after the tag.
var kvArrayFields = map[string][]string{
	"BlockStored":      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"},
	"BlockRemoved":     {"block_hashes", "medium"},
	"AllBlocksCleared": {},
}

// mapEntry keeps a msgpack map's keys in wire order.
type mapEntry struct {
	key string
	val any
}

func decodeAny(d *msgpack.Decoder) (any, error) {
	c, err := d.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		m := make([]mapEntry, n)
		for i := range m {
			if m[i].key, err = d.DecodeString(); err != nil {
				return nil, err
			}
			if m[i].val, err = decodeAny(d); err != nil {
				return nil, err
			}
		}
		return m, nil
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.DecodeArrayLen()
		if err != nil {
			return nil, err
		}
		a := make([]any, n)
		for i := range a {
			if a[i], err = decodeAny(d); err != nil {
				return nil, err
			}
		}
		return a, nil
	}
	return d.DecodeInterfaceLoose()
}

// decodeKVMessage checks the frames and decodes the payload in the encoding it finds.
func decodeKVMessage(t *testing.T, frames [][]byte) kvMessage {
	t.Helper()
	if len(frames) != 3 || len(frames[1]) != 8 {
		t.Fatalf("message frames %q: want [topic, 8-byte seq, payload]", frames)
	}
	msg := kvMessage{topic: string(frames[0]), seq: binary.BigEndian.Uint64(frames[1])}
	d := msgpack.NewDecoder(bytes.NewReader(frames[2]))
	v, err := decodeAny(d)
	if err != nil {
		t.Fatalf("payload: %v", err)
	}
	if _, err := d.PeekCode(); err == nil {
		t.Fatalf("payload has bytes after the batch")
	}
	var rawEvents any
	switch b := v.(type) {
	case []mapEntry:
		fields := map[string]any{}
		for _, e := range b {
			msg.keys = append(msg.keys, e.key)
			fields[e.key] = e.val
		}
		msg.ts, _ = fields["ts"].(float64)
		msg.dpRank, rawEvents = fields["data_parallel_rank"], fields["events"]
	case []any:
		if len(b) != 3 {
			t.Fatalf("array batch has %d elements, want [ts, events, data_parallel_rank]", len(b))
		}
		msg.ts, _ = b[0].(float64)
		rawEvents, msg.dpRank = b[1], b[2]
	default:
		t.Fatalf("batch is %T, want a map or an array", v)
	}
	events, ok := rawEvents.([]any)
	if !ok {
		t.Fatalf("events is %T, want an array", rawEvents)
	}
	for _, raw := range events {
		msg.events = append(msg.events, decodeKVEvent(t, raw))
	}
	return msg
}

func decodeKVEvent(t *testing.T, raw any) kvEvent {
	t.Helper()
	ev := kvEvent{fields: map[string]any{}}
	switch e := raw.(type) {
	case []mapEntry:
		for _, f := range e {
			ev.keys = append(ev.keys, f.key)
			ev.fields[f.key] = f.val
		}
		ev.typ, _ = ev.fields["type"].(string)
	case []any:
		if len(e) == 0 {
			t.Fatalf("empty array event")
		}
		ev.typ, _ = e[0].(string)
		names, ok := kvArrayFields[ev.typ]
		if !ok || len(e) != len(names)+1 {
			t.Fatalf("array event %v: want [tag, %v]", e, names)
		}
		for i, name := range names {
			ev.fields[name] = e[i+1]
		}
	default:
		t.Fatalf("event is %T, want a map or an array", raw)
	}
	return ev
}

// uints reads a msgpack array of non-negative ints.
func uints(t *testing.T, v any) []uint64 {
	t.Helper()
	a, ok := v.([]any)
	if !ok {
		t.Fatalf("%v (%T) is not an array", v, v)
	}
	out := make([]uint64, len(a))
	for i, x := range a {
		out[i] = asUint(t, x)
	}
	return out
}

func asUint(t *testing.T, v any) uint64 {
	t.Helper()
	switch n := v.(type) {
	case uint64:
		return n
	case int64:
		if n >= 0 {
			return uint64(n)
		}
	}
	t.Fatalf("%v (%T) is not a non-negative int", v, v)
	return 0
}

// kvSubscriber is a consumer's side: a SUB socket that binds, as Ferry's does, and subscribes
// to every topic.
type kvSubscriber struct {
	endpoint string
	messages chan [][]byte
}

func startKVSubscriber(t *testing.T) *kvSubscriber {
	t.Helper()
	return newKVSubscriber(t, func(sub zmq4.Socket) (string, error) {
		if err := sub.Listen("tcp://127.0.0.1:0"); err != nil {
			return "", err
		}
		return "tcp://" + sub.Addr().(*net.TCPAddr).String(), nil
	})
}

// dialKVSubscriber connects to a replica that binds its publisher, retrying while it starts.
func dialKVSubscriber(t *testing.T, endpoint string) *kvSubscriber {
	t.Helper()
	return newKVSubscriber(t, func(sub zmq4.Socket) (string, error) { return endpoint, sub.Dial(endpoint) },
		zmq4.WithDialerRetry(10*time.Millisecond), zmq4.WithDialerMaxRetries(1000))
}

func newKVSubscriber(t *testing.T, attach func(zmq4.Socket) (string, error), opts ...zmq4.Option) *kvSubscriber {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub := zmq4.NewSub(ctx, opts...)
	t.Cleanup(cancel)
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	endpoint, err := attach(sub)
	if err != nil {
		t.Fatal(err)
	}
	ks := &kvSubscriber{endpoint: endpoint, messages: make(chan [][]byte, 64)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			msg, err := sub.Recv()
			if err != nil {
				return
			}
			ks.messages <- msg.Frames
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = sub.Close()
		<-done
	})
	return ks
}

// next returns the next message, failing the test if none comes soon.
func (ks *kvSubscriber) next(t *testing.T) [][]byte {
	t.Helper()
	select {
	case m := <-ks.messages:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no KV-event message within 10s")
		return nil
	}
}

// none fails the test if a message arrives within a short wait.
func (ks *kvSubscriber) none(t *testing.T) {
	t.Helper()
	select {
	case m := <-ks.messages:
		t.Fatalf("unexpected message %q", m)
	case <-time.After(100 * time.Millisecond):
	}
}

// serveReplica runs a replica with Serve on a loopback port, as `ferry replica-sim` does, for
// the test's lifetime, and returns it with its base URL.
func serveReplica(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host = "127.0.0.1"
	s := NewServer(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, fmt.Sprintf("http://%s", ln.Addr())
}
