package replicasim

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestMetricsExposeTGINames(t *testing.T) {
	cfg := fastConfig()
	cfg.Engine = EngineTGI
	_, base := startServer(t, cfg)
	mustPost(t, base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hello"}],"max_tokens":3}`)
	body := string(get(t, base+"/metrics").body)
	for _, series := range []string{
		"tgi_queue_size 0", "tgi_batch_current_size 0", "tgi_request_count 1",
		`tgi_request_queue_duration_bucket{le="0.00015"}`, `tgi_request_queue_duration_bucket{le="+Inf"} 1`,
		"tgi_request_queue_duration_count 1",
	} {
		if !strings.Contains(body, series+"\n") && !strings.Contains(body, series+" ") {
			t.Errorf("/metrics lacks %q", series)
		}
	}
	if strings.Contains(body, "vllm:") {
		t.Errorf("TGI /metrics has vLLM series:\n%s", body)
	}
	if got := strings.Count(body, "tgi_request_queue_duration_bucket{"); got != 36 {
		t.Errorf("%d queue-duration buckets, want TGI's 35 and +Inf", got)
	}
}

// TestTGIQueueGauges holds one request in the batch and one in the queue and checks that the TGI
// gauges show them, and that tgi_request_count counts every request while the queue-duration
// histogram counts only those that left the queue for a batch slot.
func TestTGIQueueGauges(t *testing.T) {
	cfg := slowConfig()
	cfg.Engine = EngineTGI
	cfg.MaxNumSeqs, cfg.MaxWaiting = 1, 1
	_, base := startServer(t, cfg)

	var wg sync.WaitGroup
	hold := func() context.CancelFunc {
		ctx, cancel := context.WithCancel(context.Background())
		wg.Go(func() {
			if _, err := post(t, ctx, base+"/v1/chat/completions", slowBody); !errors.Is(err, context.Canceled) {
				t.Errorf("held request ended with %v, want context.Canceled", err)
			}
		})
		return cancel
	}
	gauges := func(batch, queue float64) func() bool {
		return func() bool {
			m := scrape(t, base)
			return m["tgi_batch_current_size"] == batch && m["tgi_queue_size"] == queue
		}
	}
	stopRunning := hold()
	defer stopRunning()
	waitFor(t, "one in the batch", gauges(1, 0))
	stopWaiting := hold()
	defer stopWaiting()
	waitFor(t, "one in the batch and one queued", gauges(1, 1))

	// The queued client leaves before it gets a slot.
	stopWaiting()
	waitFor(t, "the queue empty", gauges(1, 0))
	m := scrape(t, base)
	got := map[string]float64{"tgi_request_count": m["tgi_request_count"], "tgi_request_queue_duration_count": m["tgi_request_queue_duration_count"]}
	want := map[string]float64{"tgi_request_count": 2, "tgi_request_queue_duration_count": 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
	stopRunning()
	wg.Wait()
	waitFor(t, "the batch empty", gauges(0, 0))
}

// TestUnknownEngineIsVLLM: NewServer repairs what Validate rejects, like every other field.
func TestUnknownEngineIsVLLM(t *testing.T) {
	cfg := fastConfig()
	cfg.Engine = "sglang"
	_, base := startServer(t, cfg)
	m := scrape(t, base)
	if _, ok := m["vllm:num_requests_waiting"]; !ok {
		t.Errorf("engine %q: /metrics lacks vLLM names", cfg.Engine)
	}
	if _, ok := m["tgi_queue_size"]; ok {
		t.Errorf("engine %q: /metrics has TGI names", cfg.Engine)
	}
}
