package proxy

import (
	"bytes"
	"math"
	"strconv"
	"strings"

	"github.com/ferryserve/ferry/policy"
)

// LoRA adapters on the replicas, as their engines report them; routing by adapter is
// policy/adapters.go.

// loraScrape is one vllm:lora_requests_info label set: the adapters of running and of waiting
// requests, comma-separated, and max_lora.
type loraScrape struct {
	running, waiting string
	maxLoRAs         int
}

// parseLoRAInfo finds vllm:lora_requests_info in a /metrics body. vLLM keeps every label set it
// ever set, each valued with the time it was set, so the current one is the one with the
// greatest value, wherever it stands.
func parseLoRAInfo(body []byte) (loraScrape, bool) {
	const name = "vllm:lora_requests_info"
	var best loraScrape
	bestAt, found := math.Inf(-1), false
	for len(body) > 0 {
		i := bytes.Index(body, []byte(name))
		if i < 0 {
			break
		}
		start := bytes.LastIndexByte(body[:i], '\n') + 1
		line := body[start:]
		if j := bytes.IndexByte(line, '\n'); j >= 0 {
			line = line[:j]
		}
		body = body[start+len(line):]
		n, value, ok := scrapeSample(line)
		if !ok || string(n) != name {
			continue
		}
		at, err := strconv.ParseFloat(string(value), 64)
		if err != nil || math.IsNaN(at) || at <= bestAt {
			continue
		}
		bestAt, found = at, true
		best = loraScrape{running: labelString(line, "running_lora_adapters"),
			waiting: labelString(line, "waiting_lora_adapters"), maxLoRAs: int(labelInt(line, "max_lora"))}
	}
	return best, found
}

// publishLoRA numbers the adapters of a scrape, learning new names, and publishes it on r.
func (s *scraper) publishLoRA(r *policy.Replica, l loraScrape, at int64) {
	running, waiting := splitAdapters(l.running), splitAdapters(l.waiting)
	s.adapters.Add(append(running, waiting...)...)
	r.SetLoRA(policy.LoRAInfo{Running: s.numbers(running), Waiting: s.numbers(waiting), MaxLoRAs: l.maxLoRAs, UpdatedAt: at})
}

// numbers maps adapter names to their numbers, leaving out those the table had no room for.
func (s *scraper) numbers(names []string) []int32 {
	var out []int32
	for _, n := range names {
		if a := s.adapters.Lookup([]byte(n)); a != 0 {
			out = append(out, a-1)
		}
	}
	return out
}

// splitAdapters splits a comma-separated label value, dropping empty names.
func splitAdapters(v string) []string {
	if v == "" {
		return nil
	}
	out := strings.Split(v, ",")
	n := 0
	for _, s := range out {
		if s = strings.TrimSpace(s); s != "" {
			out[n] = s
			n++
		}
	}
	return out[:n]
}
