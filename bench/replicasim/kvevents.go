package replicasim

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmihailenco/msgpack/v5"
)

// Encodings Config.KVEventsEncoding accepts: how vLLM's msgspec structs reach the wire.
const (
	// KVEventsMap is current vLLM's: the batch and every event are msgpack maps, an event's
	// "type" key (its class name) first, fields at their defaults left out.
	KVEventsMap = "map"
	// KVEventsArray is older vLLM's (array_like structs): the batch is [ts, events, dp_rank] and
	// an event is [class name, fields...] in declaration order.
	KVEventsArray = "array"
)

const (
	// kvEventsQueue bounds the batches waiting for the publisher goroutine, and the socket's own
	// send queue (ZMQ's high-water mark), so a slow or absent subscriber costs bounded memory.
	kvEventsQueue = 1024
	// kvMediumGPU is vLLM's MEDIUM_GPU: where the blocks live.
	kvMediumGPU = "GPU"
)

// kvBatch is what one change to the prefix cache tells subscribers: vLLM's KVEventBatch,
// before encoding. Its slices are its own; the publisher goroutine reads them after the
// request that built it has moved on.
type kvBatch struct {
	seq     uint64
	ts      time.Time
	cleared bool // AllBlocksCleared, before the other events
	removed []uint64
	stored  []storedRun
}

// storedRun is one BlockStored event: consecutive newly stored blocks of one chain.
type storedRun struct {
	hashes    []uint64
	parent    uint64
	hasParent bool   // false for a chain's first block: parent_block_hash is nil
	prompt    []byte // the blocks' rendered-prompt bytes, blockChars a block: their tokens
}

// kvEndpointBinds is vLLM's rule for its publisher socket (ZmqEventPublisher._socket_setup):
// a wildcard host, an IPv6 "::" or a local transport means bind; anything else means connect,
// as in llm-d's deployment where the router binds and every engine connects to it.
func kvEndpointBinds(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

// kvEndpointError says what is wrong with a --kv-events endpoint, or nil.
func kvEndpointError(endpoint string) error {
	scheme, addr, ok := strings.Cut(endpoint, "://")
	if !ok {
		return errors.New("must be a ZMQ endpoint: tcp://HOST:PORT, ipc://PATH or inproc://NAME")
	}
	switch scheme {
	case "tcp":
		if err := checkTCPAddr(addr); err != nil {
			return fmt.Errorf("tcp endpoint must be tcp://HOST:PORT (* for every interface or any port): %w", err)
		}
	case "ipc", "inproc":
		if addr == "" {
			return fmt.Errorf("%s endpoint needs a name", scheme)
		}
	default:
		return fmt.Errorf("unsupported transport %q: use tcp, ipc or inproc", scheme)
	}
	return nil
}

// checkTCPAddr checks HOST:PORT, accepting ZMQ's "*" for either part.
func checkTCPAddr(addr string) error {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return errors.New("missing port")
	}
	if strings.Trim(addr[:i], "[]") == "" {
		return errors.New("missing host")
	}
	if port := addr[i+1:]; port != "*" {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return fmt.Errorf("bad port %q", port)
		}
	}
	return nil
}

// kvPublisher publishes the prefix cache's changes as vLLM's KV-cache events: one multipart
// ZMQ message per batch, [topic, sequence number (8 bytes, big-endian), msgpack payload], from
// one goroutine fed by a bounded queue, so a request never waits on the socket.
type kvPublisher struct {
	endpoint string
	array    bool // KVEventsArray
	queue    chan *kvBatch
	// nextSeq numbers batches as they are queued. A batch dropped on a full queue keeps its
	// number, so a subscriber sees the gap, as it would when ZMQ drops at its high-water mark.
	nextSeq atomic.Uint64
	sock    atomic.Pointer[zmq4.Socket] // set while serving
	batches prometheus.Counter          // handed to the socket
	dropped prometheus.Counter          // lost on a full queue
}

func newKVPublisher(endpoint, encoding string, m *metrics) *kvPublisher {
	return &kvPublisher{
		endpoint: endpoint,
		array:    encoding == KVEventsArray,
		queue:    make(chan *kvBatch, kvEventsQueue),
		batches:  m.kvEventBatches,
		dropped:  m.kvEventsDropped,
	}
}

// publish queues b without blocking. The prefix cache calls it under its lock, so batches are
// numbered and queued in the order the cache changed.
func (p *kvPublisher) publish(b *kvBatch) {
	b.seq = p.nextSeq.Add(1) - 1
	select {
	case p.queue <- b:
	default:
		p.dropped.Inc()
	}
}

// open creates the socket and binds it when vLLM's rule says bind, so that a bad or taken
// endpoint fails startup; connecting is left to run, since a subscriber may come up later.
func (p *kvPublisher) open() (zmq4.Socket, error) {
	var opts []zmq4.Option
	if !kvEndpointBinds(p.endpoint) {
		// Like libzmq's connect: keep trying until the subscriber is up, and again after it
		// goes away. (Not for a bound socket, which would dial its own endpoint.)
		opts = append(opts, zmq4.WithDialerMaxRetries(-1), zmq4.WithAutomaticReconnect(true),
			zmq4.WithDialerRetry(100*time.Millisecond))
	}
	sock := zmq4.NewPub(context.Background(), opts...)
	err := sock.SetOption(zmq4.OptionHWM, kvEventsQueue)
	if err == nil && kvEndpointBinds(p.endpoint) {
		err = sock.Listen(p.endpoint)
	}
	if err != nil {
		_ = sock.Close()
		return nil, fmt.Errorf("replica-sim: kv events: %w", err)
	}
	return sock, nil
}

// run sends queued batches, under topic, until ctx ends, then sends what is still queued and
// closes sock. Batches sent before a subscriber has connected and subscribed are lost, as with
// any ZMQ publisher.
func (p *kvPublisher) run(ctx context.Context, sock zmq4.Socket, topic []byte) {
	p.sock.Store(&sock)
	dialed := make(chan struct{})
	if kvEndpointBinds(p.endpoint) {
		close(dialed)
	} else {
		go func() {
			defer close(dialed)
			// Dial retries until it connects or the socket closes.
			if err := sock.Dial(p.endpoint); err != nil && ctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "replica-sim: kv events: %v\n", err)
			}
		}()
	}
	defer func() {
		p.sock.Store(nil)
		_ = sock.Close()
		<-dialed
	}()
	enc := msgpack.NewEncoder(nil)
	var buf bytes.Buffer
	send := func(b *kvBatch) {
		buf.Reset()
		enc.Reset(&buf)
		_ = encodeKVBatch(enc, b, p.array) // writes to a bytes.Buffer do not fail
		var seq [8]byte
		binary.BigEndian.PutUint64(seq[:], b.seq)
		// The socket queues the message and writes it later, so the payload must be a copy.
		if err := sock.Send(zmq4.NewMsgFrom(topic, seq[:], bytes.Clone(buf.Bytes()))); err == nil {
			p.batches.Inc()
		}
	}
	for {
		select {
		case b := <-p.queue:
			send(b)
		case <-ctx.Done():
			for {
				select {
				case b := <-p.queue:
					send(b)
				default:
					return
				}
			}
		}
	}
}

// subscribed reports whether a subscriber has subscribed to the socket, so a test can wait
// for ZMQ's slow-joiner window to close before it makes the cache change.
func (p *kvPublisher) subscribed() bool {
	sp := p.sock.Load()
	if sp == nil {
		return false
	}
	t, ok := (*sp).(zmq4.Topics)
	return ok && len(t.Topics()) > 0
}

// encodeKVBatch writes b as vLLM's KVEventBatch: {ts, events, data_parallel_rank} or, in the
// array encoding, [ts, events, data_parallel_rank]. ts is seconds since the epoch, as Python's
// time.time(); the simulator is one data-parallel rank, 0.
func encodeKVBatch(enc *msgpack.Encoder, b *kvBatch, array bool) error {
	removed := len(b.removed) > 0
	n := len(b.stored)
	if b.cleared {
		n++
	}
	if removed {
		n++
	}
	ts := float64(b.ts.UnixNano()) / 1e9
	var err error
	if array {
		err = errors.Join(enc.EncodeArrayLen(3), enc.EncodeFloat64(ts), enc.EncodeArrayLen(n))
	} else {
		err = errors.Join(enc.EncodeMapLen(3), enc.EncodeString("ts"), enc.EncodeFloat64(ts),
			enc.EncodeString("events"), enc.EncodeArrayLen(n))
	}
	// vLLM evicts while allocating and stores once the blocks are computed, so a step's
	// BlockRemoved comes before its BlockStored.
	if b.cleared {
		err = errors.Join(err, encodeEventHead(enc, "AllBlocksCleared", 0, array))
	}
	if removed {
		err = errors.Join(err, encodeEventHead(enc, "BlockRemoved", 2, array))
		if !array {
			err = errors.Join(err, enc.EncodeString("block_hashes"))
		}
		err = errors.Join(err, encodeHashes(enc, b.removed), encodeField(enc, "medium", array), enc.EncodeString(kvMediumGPU))
	}
	for i := range b.stored {
		err = errors.Join(err, encodeStored(enc, &b.stored[i], array))
	}
	if !array {
		err = errors.Join(err, enc.EncodeString("data_parallel_rank"))
	}
	return errors.Join(err, enc.EncodeUint(0))
}

// encodeStored writes one BlockStored. lora_name exists only in the map era's struct; the
// array era's ends at medium.
func encodeStored(enc *msgpack.Encoder, r *storedRun, array bool) error {
	fields := 7
	if array {
		fields = 6
	}
	err := encodeEventHead(enc, "BlockStored", fields, array)
	if !array {
		err = errors.Join(err, enc.EncodeString("block_hashes"))
	}
	err = errors.Join(err, encodeHashes(enc, r.hashes), encodeField(enc, "parent_block_hash", array))
	if r.hasParent {
		err = errors.Join(err, enc.EncodeUint(r.parent))
	} else {
		err = errors.Join(err, enc.EncodeNil())
	}
	tokens := len(r.prompt) / charsPerToken
	err = errors.Join(err, encodeField(enc, "token_ids", array), enc.EncodeArrayLen(tokens))
	for i := range tokens {
		if err != nil {
			return err
		}
		err = enc.EncodeUint(uint64(tokenAt(r.prompt, i)))
	}
	err = errors.Join(err,
		encodeField(enc, "block_size", array), enc.EncodeUint(blockTokens),
		encodeField(enc, "lora_id", array), enc.EncodeNil(),
		encodeField(enc, "medium", array), enc.EncodeString(kvMediumGPU))
	if !array {
		err = errors.Join(err, enc.EncodeString("lora_name"), enc.EncodeNil())
	}
	return err
}

// encodeEventHead opens an event with fields fields after its tag: msgspec's tagged struct, a
// map whose first key is "type" or an array whose first element is the class name.
func encodeEventHead(enc *msgpack.Encoder, class string, fields int, array bool) error {
	if array {
		return errors.Join(enc.EncodeArrayLen(fields+1), enc.EncodeString(class))
	}
	return errors.Join(enc.EncodeMapLen(fields+1), enc.EncodeString("type"), enc.EncodeString(class))
}

// encodeField writes a field's key in the map encoding; arrays are positional.
func encodeField(enc *msgpack.Encoder, name string, array bool) error {
	if array {
		return nil
	}
	return enc.EncodeString(name)
}

// encodeHashes writes block hashes as msgpack unsigned ints: vLLM's integer block hashes
// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, the default) are the hash's low 64 bits, unsigned.
func encodeHashes(enc *msgpack.Encoder, hashes []uint64) error {
	err := enc.EncodeArrayLen(len(hashes))
	for _, h := range hashes {
		err = errors.Join(err, enc.EncodeUint(h))
	}
	return err
}
