package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/policy"
)

// stored is one BlockStored as a test publishes it.
type stored struct {
	hashes    []uint64
	parent    *uint64
	tokens    []uint32
	blockSize int
	lora      string
	medium    string
}

// encodeBatch encodes events as vLLM does: asMap is current vLLM's layout (structs as maps),
// otherwise older vLLM's array_like one. Events are stored, []uint64 (BlockRemoved) or nil
// (AllBlocksCleared).
func encodeBatch(t *testing.T, asMap bool, events ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	nilOr := func(s string) {
		if s == "" {
			must(e.EncodeNil())
		} else {
			must(e.EncodeString(s))
		}
	}
	hashes := func(hs []uint64) {
		must(e.EncodeArrayLen(len(hs)))
		for _, h := range hs {
			must(e.EncodeUint(h))
		}
	}
	if asMap {
		must(e.EncodeMapLen(3))
		must(e.EncodeString("ts"))
		must(e.EncodeFloat64(1.5))
		must(e.EncodeString("events"))
	} else {
		must(e.EncodeArrayLen(3))
		must(e.EncodeFloat64(1.5))
	}
	must(e.EncodeArrayLen(len(events)))
	for _, ev := range events {
		switch ev := ev.(type) {
		case stored:
			if asMap {
				must(e.EncodeMapLen(9))
				must(e.EncodeString("type"))
			} else {
				must(e.EncodeArrayLen(8))
			}
			must(e.EncodeString("BlockStored"))
			field := func(name string) {
				if asMap {
					must(e.EncodeString(name))
				}
			}
			field("block_hashes")
			hashes(ev.hashes)
			field("parent_block_hash")
			if ev.parent == nil {
				must(e.EncodeNil())
			} else {
				must(e.EncodeUint(*ev.parent))
			}
			field("token_ids")
			must(e.EncodeArrayLen(len(ev.tokens)))
			for _, id := range ev.tokens {
				must(e.EncodeUint(uint64(id)))
			}
			field("block_size")
			must(e.EncodeInt(int64(ev.blockSize)))
			field("lora_id")
			must(e.EncodeNil())
			field("medium")
			nilOr(ev.medium)
			field("lora_name")
			nilOr(ev.lora)
			if asMap { // a field this decoder does not know, as a later vLLM may add
				must(e.EncodeString("kv_cache_spec_kind"))
				must(e.EncodeString("full_attention"))
			}
		case []uint64:
			if asMap {
				must(e.EncodeMapLen(3))
				must(e.EncodeString("type"))
			} else {
				must(e.EncodeArrayLen(3))
			}
			must(e.EncodeString("BlockRemoved"))
			if asMap {
				must(e.EncodeString("block_hashes"))
			}
			hashes(ev)
			if asMap {
				must(e.EncodeString("medium"))
			}
			must(e.EncodeString("GPU"))
		case nil:
			if asMap {
				must(e.EncodeMapLen(1))
				must(e.EncodeString("type"))
			} else {
				must(e.EncodeArrayLen(1))
			}
			must(e.EncodeString("AllBlocksCleared"))
		}
	}
	if asMap {
		must(e.EncodeString("data_parallel_rank"))
	}
	must(e.EncodeInt(0))
	return buf.Bytes()
}

func ids(n int, salt uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(i) + salt
	}
	return out
}

// publisher is an engine's publisher as vLLM runs it with a tcp://HOST:PORT endpoint: a PUB
// socket connecting to the proxy's.
type publisher struct {
	t     *testing.T
	sock  zmq4.Socket
	topic string
	seq   uint64
}

func newPublisher(t *testing.T, l *Listener, topic string) *publisher {
	ctx, cancel := context.WithCancel(context.Background())
	sock := zmq4.NewPub(ctx)
	if err := sock.Dial(l.Endpoint()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sock.Close(); cancel() })
	return &publisher{t: t, sock: sock, topic: topic}
}

func (p *publisher) send(payload []byte) {
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], p.seq)
	p.seq++
	if err := p.sock.Send(zmq4.NewMsgFrom([]byte(p.topic), seq[:], payload)); err != nil {
		p.t.Fatal(err)
	}
}

// eventually polls cond for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func listen(t *testing.T) *Listener {
	l, err := Listen("tcp://127.0.0.1:0", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestListenerAppliesVLLMBatches publishes both of vLLM's layouts over a real ZeroMQ
// connection and checks what the engine's index holds after each.
func TestListenerAppliesVLLMBatches(t *testing.T) {
	for _, layout := range []struct {
		name  string
		asMap bool
	}{{"map (current vLLM)", true}, {"array_like (older vLLM)", false}} {
		t.Run(layout.name, func(t *testing.T) {
			l := listen(t)
			kv := l.For("10.0.0.7:8000")
			pub := newPublisher(t, l, "kv@10.0.0.7:8000@meta-llama/Llama-3.1-8B")
			// A PUB socket drops what it sends before the connection is up (ZeroMQ's slow
			// joiner): resend the first batch until it lands.
			first := encodeBatch(t, layout.asMap, stored{hashes: []uint64{11, 12}, tokens: ids(32, 0), blockSize: 16, medium: "GPU"})
			eventually(t, "the first batch", func() bool {
				pub.seq = 0
				pub.send(first)
				time.Sleep(20 * time.Millisecond)
				return kv.Live()
			})
			parent := uint64(12)
			pub.send(encodeBatch(t, layout.asMap,
				stored{hashes: []uint64{13}, parent: &parent, tokens: ids(16, 32), blockSize: 16},
				stored{hashes: []uint64{99}, tokens: ids(16, 900), blockSize: 16, lora: "sql-adapter"},
			))
			eventually(t, "3 blocks held", func() bool { held, _ := kv.Len(); return held == 3 })
			pub.send(encodeBatch(t, layout.asMap, []uint64{13}))
			eventually(t, "the removal", func() bool { held, _ := kv.Len(); return held == 2 })
			if got := testutil.ToFloat64(l.blocks.WithLabelValues("ignored")); got != 1 {
				t.Errorf("ignored blocks = %v, want the adapter's 1", got)
			}
			pub.send(encodeBatch(t, layout.asMap, nil))
			eventually(t, "AllBlocksCleared", func() bool { held, _ := kv.Len(); return held == 0 })
			if kv.Orphans() != 0 {
				t.Errorf("orphans = %d", kv.Orphans())
			}
		})
	}
}

// TestListenerSequenceAndTopics covers what the transport may bring: a publisher that
// restarts, lost messages, a topic for no engine, a host-only topic, garbage.
func TestListenerSequenceAndTopics(t *testing.T) {
	l := listen(t)
	dec := newDecoder()
	msg := func(topic string, seq uint64, payload []byte) [][]byte {
		var s [8]byte
		binary.BigEndian.PutUint64(s[:], seq)
		return [][]byte{[]byte(topic), s[:], payload}
	}
	kv := l.For("10.0.0.7:8000")
	block := func(h uint64) []byte {
		return encodeBatch(t, true, stored{hashes: []uint64{h}, tokens: ids(16, uint32(h)), blockSize: 16})
	}
	l.apply(dec, msg("kv@10.0.0.7:8000@m", 0, block(1)))
	l.apply(dec, msg("kv@10.0.0.7:8000@m", 1, block(2)))
	l.apply(dec, msg("kv@10.0.0.7:8000@m", 5, block(3))) // 2-4 lost
	if held, _ := kv.Len(); held != 3 || testutil.ToFloat64(l.gaps) != 1 {
		t.Fatalf("after a gap: held %d, gaps %v; want 3 and 1", held, testutil.ToFloat64(l.gaps))
	}
	l.apply(dec, msg("kv@10.0.0.7:8000@m", 0, block(4))) // restarted: a new cache
	if held, _ := kv.Len(); held != 1 {
		t.Fatalf("after the publisher restarted: held %d, want 1", held)
	}

	// A host-only topic (llm-d's kv@POD_IP@MODEL) names the one engine at that host.
	l.apply(dec, msg("kv@10.0.0.7@m", 1, block(5)))
	if held, _ := kv.Len(); held != 2 {
		t.Fatalf("host-only topic: held %d, want 2", held)
	}
	other := l.For("10.0.0.7:8001")
	l.apply(dec, msg("kv@10.0.0.7@m", 2, block(6))) // now ambiguous
	if held, _ := kv.Len(); held != 2 || other.Live() {
		t.Fatal("an ambiguous host-only topic was applied")
	}
	// An engine first heard of through its events keeps them for the replica that comes.
	l.apply(dec, msg("kv@10.0.0.9:8000@m", 0, block(7)))
	if held, _ := l.For("10.0.0.9:8000").Len(); held != 1 {
		t.Fatal("events before the replica was known were lost")
	}
	l.apply(dec, msg("metrics", 0, block(8)))
	l.apply(dec, msg("kv@10.0.0.7:8000@m", 3, []byte{0xc1}))
	l.apply(dec, [][]byte{[]byte("kv@10.0.0.7:8000@m"), {1}, block(9)})
	for result, want := range map[string]float64{"applied": 6, "unrouted": 2, "undecodable": 2} {
		if got := testutil.ToFloat64(l.batches.WithLabelValues(result)); got != want {
			t.Errorf("batches %s = %v, want %v", result, got, want)
		}
	}
}

func TestListenRefusesBadEndpoints(t *testing.T) {
	for _, endpoint := range []string{"127.0.0.1:5557", "ipc:///tmp/x", "tcp://nohost"} {
		if l, err := Listen(endpoint, zap.NewNop()); err == nil {
			l.Close()
			t.Errorf("Listen(%q) succeeded", endpoint)
		}
	}
}

// FuzzDecoder feeds arbitrary payloads to the decoder: it may refuse them, never panic.
func FuzzDecoder(f *testing.F) {
	t := &testing.T{}
	f.Add(encodeBatch(t, true, stored{hashes: []uint64{1}, tokens: ids(16, 0), blockSize: 16}, []uint64{1}, nil))
	f.Add(encodeBatch(t, false, stored{hashes: []uint64{1, 2}, tokens: ids(32, 0), blockSize: 16}))
	f.Fuzz(func(t *testing.T, payload []byte) {
		events, err := newDecoder().batch(payload)
		if err != nil {
			return
		}
		kv := policy.NewKVBlocks()
		for _, ev := range events {
			if ev.kind == kindStored {
				kv.Stored(ev.parent, ev.hasParent, ev.hashes, ev.tokens, ev.blockSize)
			}
		}
	})
}

// TestSubscriberConnectsToBoundPublishers is vLLM's default topology: each engine's publisher
// binds (tcp://*:PORT, an empty topic) and the proxy connects to it at the replica's host. The
// subscriber reaches a publisher that binds after it started trying, and Forget disconnects.
func TestSubscriberConnectsToBoundPublishers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pubSock := zmq4.NewPub(ctx)
	defer pubSock.Close()
	probe, err := net.Listen("tcp", "127.0.0.1:0") // a free port for the publisher
	if err != nil {
		t.Fatal(err)
	}
	port := probe.Addr().(*net.TCPAddr).Port
	probe.Close()

	sub, err := Subscribe(port, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	kv := sub.For("127.0.0.1:8000") // the replica's own address; the publisher is on port
	if again := sub.For("127.0.0.1:8000"); again != kv {
		t.Fatal("a second For made a second index")
	}
	time.Sleep(200 * time.Millisecond) // the subscriber is retrying by now
	if err := pubSock.Listen(fmt.Sprintf("tcp://127.0.0.1:%d", port)); err != nil {
		t.Fatal(err)
	}
	pub := &publisher{t: t, sock: pubSock, topic: ""}
	batch := encodeBatch(t, true, stored{hashes: []uint64{1, 2}, tokens: ids(32, 0), blockSize: 16, medium: "GPU"})
	eventually(t, "the engine's blocks", func() bool {
		pub.seq = 0
		pub.send(batch)
		time.Sleep(20 * time.Millisecond)
		held, _ := kv.Len()
		return held == 2
	})
	if got := testutil.ToFloat64(sub.batches.WithLabelValues("applied")); got < 1 {
		t.Errorf("applied batches = %v", got)
	}
	sub.Forget("127.0.0.1:8000")
	if _, err := Subscribe(0, zap.NewNop()); err == nil {
		t.Error("Subscribe(0) succeeded")
	}
	if bad := sub.For("no port"); bad == nil || bad.Live() {
		t.Error("an address without a port got a live index")
	}
}

// TestForgetDoesNotWaitForASilentEngine: Forget is called under the proxy service's lock, so it
// must not wait for a connection to end. Here the engine's port accepts TCP and never speaks
// ZeroMQ, so the subscriber's handshake would hang; Forget returns anyway, and Close still
// ends the connection.
func TestForgetDoesNotWaitForASilentEngine(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, silent, until the test ends
		}
	}()
	sub, err := Subscribe(silent.Addr().(*net.TCPAddr).Port, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	sub.For("127.0.0.1:8000")
	time.Sleep(100 * time.Millisecond) // connected, in the handshake
	done := make(chan struct{})
	go func() { sub.Forget("127.0.0.1:8000"); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Forget waited for a connection to a silent engine")
	}
	go sub.Close() // its connection ends when the listener closes; nothing waits on it here
}
