package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// The payload of one of vLLM's messages is a KVEventBatch (vllm/distributed/kv_events.py),
// encoded by msgspec. Two layouts are in use: current vLLM encodes structs as maps, the batch
// {"ts", "events", "data_parallel_rank"} and each event {"type": "BlockStored", field: value,
// ...}; older releases (array_like) as arrays, [ts, events, rank] and ["BlockStored", fields in
// declaration order...]. Both are read here, and any field either adds later is skipped.

// event is one decoded KV-cache event. Only what the index uses is kept.
type event struct {
	kind      eventKind
	hashes    []uint64
	parent    uint64
	hasParent bool
	tokens    []uint32
	blockSize int
	// other is set when the blocks are not the base model's in the GPU's cache: a LoRA
	// adapter's, another medium's (a CPU offload tier), another KV-cache group's (hybrid
	// models). A prompt for the base model matches none of them, so the index leaves them out.
	other bool
}

type eventKind uint8

const (
	kindUnknown eventKind = iota
	kindStored
	kindRemoved
	kindCleared
)

var kinds = map[string]eventKind{"BlockStored": kindStored, "BlockRemoved": kindRemoved, "AllBlocksCleared": kindCleared}

// Field order of the array layout, after the tag (vLLM's declaration order).
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

var errLayout = errors.New("not a KV event batch")

// decoder decodes batches, reusing its buffers: one per listener goroutine.
type decoder struct {
	r      bytes.Reader
	d      *msgpack.Decoder
	events []event
}

func newDecoder() *decoder {
	d := &decoder{}
	d.d = msgpack.NewDecoder(&d.r)
	return d
}

// batch decodes payload's events. The slices in them are valid until the next call.
func (d *decoder) batch(payload []byte) ([]event, error) {
	d.r.Reset(payload)
	d.d.Reset(&d.r)
	d.events = d.events[:0]
	code, err := d.d.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case msgpcode.IsFixedMap(code) || code == msgpcode.Map16 || code == msgpcode.Map32:
		n, err := d.d.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		for range n {
			key, err := d.d.DecodeString()
			if err != nil {
				return nil, err
			}
			if key != "events" {
				if err := d.d.Skip(); err != nil {
					return nil, err
				}
				continue
			}
			if err := d.eventList(); err != nil {
				return nil, err
			}
		}
	case msgpcode.IsFixedArray(code) || code == msgpcode.Array16 || code == msgpcode.Array32:
		n, err := d.d.DecodeArrayLen()
		if err != nil {
			return nil, err
		}
		if n < 2 {
			return nil, errLayout
		}
		if err := d.d.Skip(); err != nil { // ts
			return nil, err
		}
		if err := d.eventList(); err != nil {
			return nil, err
		}
		for range n - 2 {
			if err := d.d.Skip(); err != nil {
				return nil, err
			}
		}
	default:
		return nil, errLayout
	}
	return d.events, nil
}

func (d *decoder) eventList() error {
	n, err := d.d.DecodeArrayLen()
	if err != nil {
		return err
	}
	for range max(n, 0) {
		// Reuse the slot and its slices from earlier batches.
		if len(d.events) < cap(d.events) {
			d.events = d.events[:len(d.events)+1]
		} else {
			d.events = append(d.events, event{})
		}
		ev := &d.events[len(d.events)-1]
		*ev = event{hashes: ev.hashes[:0], tokens: ev.tokens[:0]}
		if err := d.event(ev); err != nil {
			return err
		}
	}
	return nil
}

// event decodes one event of either layout into ev.
func (d *decoder) event(ev *event) error {
	code, err := d.d.PeekCode()
	if err != nil {
		return err
	}
	if msgpcode.IsFixedArray(code) || code == msgpcode.Array16 || code == msgpcode.Array32 {
		n, err := d.d.DecodeArrayLen()
		if err != nil || n < 1 {
			return errors.Join(errLayout, err)
		}
		tag, err := d.d.DecodeString()
		if err != nil {
			return err
		}
		ev.kind = kinds[tag]
		fields := storedFields
		if ev.kind == kindRemoved {
			fields = removedFields
		}
		for i := range n - 1 {
			name := ""
			if i < len(fields) && ev.kind != kindCleared && ev.kind != kindUnknown {
				name = fields[i]
			}
			if err := d.field(ev, name); err != nil {
				return err
			}
		}
		return nil
	}
	n, err := d.d.DecodeMapLen()
	if err != nil {
		return errors.Join(errLayout, err)
	}
	for range max(n, 0) {
		key, err := d.d.DecodeString()
		if err != nil {
			return err
		}
		if key == "type" {
			tag, err := d.d.DecodeString()
			if err != nil {
				return err
			}
			ev.kind = kinds[tag]
			continue
		}
		if err := d.field(ev, key); err != nil {
			return err
		}
	}
	return nil
}

// field decodes the value of the named field into ev, or skips it.
func (d *decoder) field(ev *event, name string) error {
	var err error
	switch name {
	case "block_hashes":
		var n int
		if n, err = d.d.DecodeArrayLen(); err != nil {
			return err
		}
		for range max(n, 0) {
			h, err := d.hash()
			if err != nil {
				return err
			}
			ev.hashes = append(ev.hashes, h)
		}
	case "parent_block_hash":
		if d.nextIsNil() {
			return d.d.DecodeNil()
		}
		ev.parent, err = d.hash()
		ev.hasParent = err == nil
	case "token_ids":
		var n int
		if n, err = d.d.DecodeArrayLen(); err != nil {
			return err
		}
		for range max(n, 0) {
			id, err := d.d.DecodeUint32()
			if err != nil {
				return err
			}
			ev.tokens = append(ev.tokens, id)
		}
	case "block_size":
		ev.blockSize, err = d.d.DecodeInt()
	case "lora_id", "lora_name":
		ev.other = ev.other || !d.nextIsNil()
		err = d.d.Skip()
	case "medium":
		if d.nextIsNil() {
			return d.d.DecodeNil()
		}
		var medium string
		medium, err = d.d.DecodeString()
		ev.other = ev.other || medium != "GPU"
	case "group_idx":
		if d.nextIsNil() {
			return d.d.DecodeNil()
		}
		var group int
		group, err = d.d.DecodeInt()
		ev.other = ev.other || group != 0
	default:
		err = d.d.Skip()
	}
	return err
}

func (d *decoder) nextIsNil() bool {
	code, err := d.d.PeekCode()
	return err == nil && code == msgpcode.Nil
}

// hash reads an ExternalBlockHash: an int (vLLM's default, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES:
// the hash's low 64 bits) or the hash's bytes, of which the last eight name it here.
func (d *decoder) hash() (uint64, error) {
	code, err := d.d.PeekCode()
	if err != nil {
		return 0, err
	}
	if msgpcode.IsBin(code) || msgpcode.IsString(code) {
		b, err := d.d.DecodeBytes()
		if err != nil {
			return 0, err
		}
		var last [8]byte
		copy(last[8-min(len(b), 8):], b[max(len(b)-8, 0):])
		return binary.BigEndian.Uint64(last[:]), nil
	}
	if code == msgpcode.Uint64 {
		return d.d.DecodeUint64()
	}
	v, err := d.d.DecodeInt64()
	if err != nil {
		return 0, fmt.Errorf("block hash: %w", err)
	}
	return uint64(v), nil
}
