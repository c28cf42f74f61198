package replicasim

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// chatBody is a chat request with a long shared system prompt and a per-request question.
func twoTurnChat(system, user string) string {
	b, _ := json.Marshal(map[string]any{
		"messages":   []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}},
		"max_tokens": 2,
	})
	return string(b)
}

// tokenizeChat asks /tokenize for the tokens of the same messages as twoTurnChat.
func tokenizeChat(t *testing.T, base, system, user string) []uint64 {
	t.Helper()
	b, _ := json.Marshal(map[string]any{
		"messages":              []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}},
		"add_generation_prompt": true,
	})
	r := mustPost(t, base+"/tokenize", string(b))
	if r.status != 200 {
		t.Fatalf("/tokenize: status %d: %s", r.status, r.body)
	}
	return decode[tokenizeResponse](t, r.body).Tokens
}

// wantStoredFields are a BlockStored's keys in current vLLM's map encoding: the tag, then every
// field without a default, in declaration order.
var wantStoredFields = []string{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"}

// Two chats sharing a long system prompt: the first stores its whole blocks as one chain with no
// parent; the second stores only the blocks after the shared prefix, with the last shared block
// as parent. The token ids are /tokenize's, block by block, in both encodings.
func TestKVEventsStoredBlocksMatchTokenize(t *testing.T) {
	for _, encoding := range []string{KVEventsMap, KVEventsArray} {
		t.Run(encoding, func(t *testing.T) {
			sub := startKVSubscriber(t)
			cfg := fastConfig()
			cfg.Model = "sim/model"
			cfg.KVEvents, cfg.KVEventsEncoding = sub.endpoint, encoding
			s, base := serveReplica(t, cfg)
			waitFor(t, "the subscriber's subscription", s.kvEvents.subscribed)

			system := strings.Repeat("You are a careful assistant. ", 12) // 348 bytes: 5 whole blocks
			start := time.Now()
			mustPost(t, base+"/v1/chat/completions", twoTurnChat(system, "What is a ferry? Answer in one sentence, please, with care."))
			first := decodeKVMessage(t, sub.next(t))
			mustPost(t, base+"/v1/chat/completions", twoTurnChat(system, "And what is a river? Answer in two sentences, with examples of each."))
			second := decodeKVMessage(t, sub.next(t))

			tokA := tokenizeChat(t, base, system, "What is a ferry? Answer in one sentence, please, with care.")
			tokB := tokenizeChat(t, base, system, "And what is a river? Answer in two sentences, with examples of each.")
			u, _ := url.Parse(base)
			wantTopic := "kv@" + u.Host + "@sim/model"
			for i, m := range []kvMessage{first, second} {
				if m.topic != wantTopic || m.seq != uint64(i) {
					t.Errorf("message %d: topic %q seq %d, want %q and %d", i, m.topic, m.seq, wantTopic, i)
				}
				if got := time.Unix(0, int64(m.ts*1e9)); got.Before(start.Add(-time.Second)) || got.After(time.Now().Add(time.Second)) {
					t.Errorf("message %d: ts %v is not the time of the insert", i, m.ts)
				}
				if asUint(t, m.dpRank) != 0 {
					t.Errorf("message %d: data_parallel_rank %v, want 0", i, m.dpRank)
				}
				if encoding == KVEventsMap && !slices.Equal(m.keys, []string{"ts", "events", "data_parallel_rank"}) {
					t.Errorf("message %d: batch keys %v", i, m.keys)
				}
				if len(m.events) != 1 || m.events[0].typ != "BlockStored" {
					t.Fatalf("message %d: events %+v, want one BlockStored", i, m.events)
				}
				ev := m.events[0]
				if encoding == KVEventsMap && !slices.Equal(ev.keys, wantStoredFields) {
					t.Errorf("message %d: BlockStored keys %v, want %v", i, ev.keys, wantStoredFields)
				}
				if asUint(t, ev.fields["block_size"]) != blockTokens || ev.fields["medium"] != "GPU" || ev.fields["lora_id"] != nil {
					t.Errorf("message %d: block_size %v medium %v lora_id %v", i, ev.fields["block_size"], ev.fields["medium"], ev.fields["lora_id"])
				}
			}

			a, b := first.events[0], second.events[0]
			hashesA := a.hashes(t)
			if len(hashesA) != len(tokA)/blockTokens {
				t.Fatalf("first chat stored %d blocks, want its %d whole blocks", len(hashesA), len(tokA)/blockTokens)
			}
			if diff := cmp.Diff(tokA[:len(hashesA)*blockTokens], uints(t, a.fields["token_ids"])); diff != "" {
				t.Errorf("first chat's token_ids differ from /tokenize's whole blocks (-tokenize +event):\n%s", diff)
			}
			if a.fields["parent_block_hash"] != nil {
				t.Errorf("a chain's first block has parent %v, want nil", a.fields["parent_block_hash"])
			}

			shared := 0
			for shared < len(tokA)/blockTokens && slices.Equal(tokA[shared*blockTokens:(shared+1)*blockTokens], tokB[shared*blockTokens:(shared+1)*blockTokens]) {
				shared++
			}
			if shared < 5 {
				t.Fatalf("the chats share %d blocks, want at least the system prompt's 5", shared)
			}
			hashesB := b.hashes(t)
			if len(hashesB) != len(tokB)/blockTokens-shared {
				t.Fatalf("second chat stored %d blocks, want the %d after the %d shared", len(hashesB), len(tokB)/blockTokens-shared, shared)
			}
			if got := asUint(t, b.fields["parent_block_hash"]); got != hashesA[shared-1] {
				t.Errorf("second chain's parent %x, want the last shared block %x", got, hashesA[shared-1])
			}
			if diff := cmp.Diff(tokB[shared*blockTokens:(shared+len(hashesB))*blockTokens], uints(t, b.fields["token_ids"])); diff != "" {
				t.Errorf("second chat's token_ids (-tokenize +event):\n%s", diff)
			}
			// The hashes are the simulator's own chain hashes over the same blocks.
			var prompt []byte
			prompt, _ = renderChat(prompt, []chatMessage{{"system", mustJSON(system)}, {"user", mustJSON("And what is a river? Answer in two sentences, with examples of each.")}})
			if diff := cmp.Diff(blockHashes(nil, s.modelSeed, prompt)[shared:], hashesB); diff != "" {
				t.Errorf("second chat's block hashes are not the cache's (-cache +event):\n%s", diff)
			}

			mustPost(t, base+"/v1/chat/completions", twoTurnChat(system, "What is a ferry? Answer in one sentence, please, with care."))
			sub.none(t) // a repeated prompt stores nothing new
			if m := scrape(t, base); m["replicasim_kv_event_batches_total"] != 2 || m["replicasim_kv_events_dropped_total"] != 0 {
				t.Errorf("batches %v dropped %v, want 2 and 0", m["replicasim_kv_event_batches_total"], m["replicasim_kv_events_dropped_total"])
			}
		})
	}
}

func mustJSON(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// A cache of 4 blocks: a second 3-block prompt evicts the first prompt's last two blocks (its
// tail goes first), and the batch names exactly those, before the new blocks.
func TestKVEventsReportEvictions(t *testing.T) {
	for _, encoding := range []string{KVEventsMap, KVEventsArray} {
		t.Run(encoding, func(t *testing.T) {
			sub := startKVSubscriber(t)
			cfg := fastConfig()
			cfg.KVCacheBlocks = 4
			cfg.KVEvents, cfg.KVEventsEncoding = sub.endpoint, encoding
			s, base := serveReplica(t, cfg)
			waitFor(t, "the subscriber's subscription", s.kvEvents.subscribed)

			promptA, promptB := strings.Repeat("a", 3*blockChars+10), strings.Repeat("b", 3*blockChars+10)
			hashesA := blockHashes(nil, s.modelSeed, []byte(promptA))
			mustPost(t, base+"/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, promptA))
			if got := decodeKVMessage(t, sub.next(t)); len(got.events) != 1 || !slices.Equal(got.events[0].hashes(t), hashesA) {
				t.Fatalf("first batch %+v, want BlockStored of %x", got.events, hashesA)
			}
			mustPost(t, base+"/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, promptB))
			got := decodeKVMessage(t, sub.next(t))
			if len(got.events) != 2 || got.events[0].typ != "BlockRemoved" || got.events[1].typ != "BlockStored" {
				t.Fatalf("second batch %+v, want BlockRemoved then BlockStored", got.events)
			}
			removed := got.events[0]
			if diff := cmp.Diff(hashesA[1:], sortedLike(hashesA, removed.hashes(t))); diff != "" {
				t.Errorf("removed blocks (-want +got):\n%s", diff)
			}
			if encoding == KVEventsMap && !slices.Equal(removed.keys, []string{"type", "block_hashes", "medium"}) {
				t.Errorf("BlockRemoved keys %v", removed.keys)
			}
			if removed.fields["medium"] != "GPU" {
				t.Errorf("BlockRemoved medium %v", removed.fields["medium"])
			}
			for i, h := range hashesA {
				if held := s.cache.match([]uint64{h}, 1) == 1; held != (i == 0) {
					t.Errorf("block %d of the first prompt held=%v; the events say otherwise", i, held)
				}
			}
		})
	}
}

// sortedLike orders got as the same hashes appear in order, so a comparison ignores the
// eviction order, which the wire does not promise.
func sortedLike(order, got []uint64) []uint64 {
	out := slices.Clone(got)
	slices.SortFunc(out, func(a, b uint64) int { return slices.Index(order, a) - slices.Index(order, b) })
	return out
}

// An endpoint vLLM binds is bound by the replica, and a subscriber connects to it; one it
// cannot bind fails Serve at once.
func TestKVEventsBindAndBindFailure(t *testing.T) {
	cfg := fastConfig()
	cfg.KVEvents = "inproc://replicasim-kv-bind-test"
	s, base := serveReplica(t, cfg)
	sub := dialKVSubscriber(t, cfg.KVEvents)
	waitFor(t, "the subscriber's subscription", s.kvEvents.subscribed)
	mustPost(t, base+"/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, strings.Repeat("z", blockChars)))
	if m := decodeKVMessage(t, sub.next(t)); len(m.events) != 1 || m.events[0].typ != "BlockStored" {
		t.Errorf("events %+v, want one BlockStored", m.events)
	}

	taken, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg.KVEvents = fmt.Sprintf("tcp://*:%d", taken.Addr().(*net.TCPAddr).Port)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	err = NewServer(cfg).Serve(context.Background(), ln)
	if err == nil || !strings.Contains(err.Error(), "kv events") {
		t.Errorf("Serve with a taken event endpoint: %v, want a kv events error", err)
	}
}

// A full queue drops the batch and counts it, and the batch's sequence number is not reused,
// so the subscriber sees a gap.
func TestKVPublisherDropsWhenQueueFull(t *testing.T) {
	s := NewServer(Config{KVEvents: "tcp://127.0.0.1:1"})
	p := s.kvEvents
	for range kvEventsQueue + 1 {
		p.publish(&kvBatch{})
	}
	if got := metricValueOf(t, s, "replicasim_kv_events_dropped_total"); got != 1 {
		t.Errorf("dropped %v, want 1", got)
	}
	p.publish(&kvBatch{}) // also dropped
	if next := p.nextSeq.Load(); next != kvEventsQueue+2 {
		t.Errorf("next seq %d, want %d: dropped batches keep their numbers", next, kvEventsQueue+2)
	}
}

func metricValueOf(t *testing.T, s *Server, name string) float64 {
	t.Helper()
	families, err := s.metrics.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestKVEndpointRules(t *testing.T) {
	tests := map[string]struct {
		endpoint  string
		wantBinds bool
		wantErr   string
	}{
		"wildcard host binds":        {endpoint: "tcp://*:5557", wantBinds: true},
		"ipv6 binds (vLLM's rule)":   {endpoint: "tcp://[::1]:5557", wantBinds: true},
		"ipc binds":                  {endpoint: "ipc:///tmp/kv.sock", wantBinds: true},
		"inproc binds":               {endpoint: "inproc://kv", wantBinds: true},
		"a host connects":            {endpoint: "tcp://router.local:5557"},
		"an address connects":        {endpoint: "tcp://10.0.0.2:5557"},
		"no scheme":                  {endpoint: "localhost:5557", wantErr: "must be a ZMQ endpoint"},
		"http is no ZMQ transport":   {endpoint: "http://router:5557", wantErr: `unsupported transport "http"`},
		"udp is not vLLM's":          {endpoint: "udp://router:5557", wantErr: `unsupported transport "udp"`},
		"tcp without a port":         {endpoint: "tcp://router", wantErr: "missing port"},
		"tcp with a bad port":        {endpoint: "tcp://router:http", wantErr: `bad port "http"`},
		"tcp with a too large port":  {endpoint: "tcp://router:70000", wantErr: `bad port "70000"`},
		"tcp without a host":         {endpoint: "tcp://:5557", wantErr: "missing host"},
		"ipc without a path":         {endpoint: "ipc://", wantErr: "ipc endpoint needs a name"},
		"any port on every address":  {endpoint: "tcp://*:*", wantBinds: true},
		"connect to an IPv4 literal": {endpoint: "tcp://127.0.0.1:1", wantBinds: false},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			err := kvEndpointError(tt.endpoint)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("kvEndpointError(%q) = %v, want %q", tt.endpoint, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("kvEndpointError(%q) = %v", tt.endpoint, err)
			}
			if got := kvEndpointBinds(tt.endpoint); got != tt.wantBinds {
				t.Errorf("binds = %v, want %v", got, tt.wantBinds)
			}
		})
	}
}

func TestValidateKVEventFlags(t *testing.T) {
	cfg := DefaultConfig()
	cfg.KVEvents, cfg.KVEventsEncoding = "http://router:5557", "json"
	err := cfg.Validate()
	for _, want := range []string{
		`--kv-events="http://router:5557": unsupported transport "http": use tcp, ipc or inproc`,
		`--kv-events-encoding="json": must be map or array`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want %q", err, want)
		}
	}
	cfg.KVEvents, cfg.KVEventsEncoding = "tcp://127.0.0.1:5557", KVEventsArray
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate of a good endpoint and encoding: %v", err)
	}
}

// The batch an insert publishes is its net effect, also when it evicts blocks of its own prompt
// or evicts a block that it then stores again.
func TestPrefixCacheEventsAreNetEffect(t *testing.T) {
	prompt := make([]byte, 4*blockChars)
	for i := range prompt {
		prompt[i] = byte(i / blockChars) // block i's bytes are all i
	}
	block := func(i, j int) []byte { return prompt[i*blockChars : j*blockChars] }
	tests := map[string]struct {
		capacity int
		before   []uint64
		insert   []uint64
		want     *kvBatch
	}{
		"new chain": {
			capacity: 8, insert: []uint64{1, 2, 3},
			want: &kvBatch{stored: []storedRun{{hashes: []uint64{1, 2, 3}, prompt: block(0, 3)}}},
		},
		"only what is new, with its parent": {
			capacity: 8, before: []uint64{1, 2}, insert: []uint64{1, 2, 3, 4},
			want: &kvBatch{stored: []storedRun{{hashes: []uint64{3, 4}, parent: 2, hasParent: true, prompt: block(2, 4)}}},
		},
		"nothing new": {capacity: 8, before: []uint64{1, 2}, insert: []uint64{1, 2}},
		"a block evicted and stored again is neither": {
			// 3 is the oldest: storing 5 evicts it, storing 4 evicts 2, storing 3 again evicts 1.
			capacity: 3, before: []uint64{1, 2, 3}, insert: []uint64{3, 4, 5},
			want: &kvBatch{removed: []uint64{2, 1}, stored: []storedRun{{hashes: []uint64{4, 5}, parent: 3, hasParent: true, prompt: block(1, 3)}}},
		},
		"a prompt longer than the cache keeps its head": {
			// 3 is stored, then evicted to store 1: a subscriber never hears of it.
			capacity: 2, insert: []uint64{1, 2, 3},
			want: &kvBatch{stored: []storedRun{{hashes: []uint64{1, 2}, prompt: block(0, 2)}}},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			var got []*kvBatch
			c := newPrefixCache(tt.capacity, func(b *kvBatch) { got = append(got, b) })
			if tt.before != nil {
				c.insert(tt.before, prompt, 0)
			}
			got = nil
			c.insert(tt.insert, prompt, 0)
			var want []*kvBatch
			if tt.want != nil {
				want = []*kvBatch{tt.want}
			}
			if diff := cmp.Diff(want, got, cmp.AllowUnexported(kvBatch{}, storedRun{}), cmpopts.IgnoreFields(kvBatch{}, "ts")); diff != "" {
				t.Errorf("batches (-want +got):\n%s", diff)
			}
		})
	}
}

// A replica whose subscriber never comes up serves as usual and still shuts down promptly.
func TestKVEventsWithoutSubscriber(t *testing.T) {
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "tcp://" + gone.Addr().String()
	gone.Close() // nothing listens there now
	cfg := fastConfig()
	cfg.KVEvents = endpoint
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- NewServer(cfg).Serve(ctx, ln) }()
	base := "http://" + ln.Addr().String()
	if r := mustPost(t, base+"/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, strings.Repeat("q", 2*blockChars))); r.status != 200 {
		t.Fatalf("completion: status %d", r.status)
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return within 5s of its context ending")
	}
}

// POST /reset_prefix_cache empties the cache and publishes AllBlocksCleared alone.
func TestKVEventsResetPrefixCache(t *testing.T) {
	for _, encoding := range []string{KVEventsMap, KVEventsArray} {
		t.Run(encoding, func(t *testing.T) {
			sub := startKVSubscriber(t)
			cfg := fastConfig()
			cfg.KVEvents, cfg.KVEventsEncoding = sub.endpoint, encoding
			s, base := serveReplica(t, cfg)
			waitFor(t, "the subscriber's subscription", s.kvEvents.subscribed)
			prompt := fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, strings.Repeat("r", 2*blockChars))
			mustPost(t, base+"/v1/completions", prompt)
			sub.next(t)

			if r := mustPost(t, base+"/reset_prefix_cache", ""); r.status != 200 || len(r.body) != 0 {
				t.Fatalf("/reset_prefix_cache: status %d body %q, want an empty 200", r.status, r.body)
			}
			m := decodeKVMessage(t, sub.next(t))
			if m.seq != 1 || len(m.events) != 1 || m.events[0].typ != "AllBlocksCleared" || len(m.events[0].fields) > 1 {
				t.Fatalf("seq %d events %+v, want seq 1 and one bare AllBlocksCleared", m.seq, m.events)
			}
			if s.cache.len() != 0 {
				t.Errorf("%d blocks cached after the reset", s.cache.len())
			}
			mustPost(t, base+"/v1/completions", prompt) // stored anew, from its first block
			if m := decodeKVMessage(t, sub.next(t)); len(m.events) != 1 || m.events[0].fields["parent_block_hash"] != nil || len(m.events[0].hashes(t)) != 2 {
				t.Errorf("after the reset: events %+v, want both blocks stored again", m.events)
			}
		})
	}
}
