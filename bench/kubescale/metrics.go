package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ferryserve/ferry/bench/procstat"
	"github.com/ferryserve/ferry/bench/servicekit"
)

// histogram is one Prometheus histogram summed over the series that match, as
// histogram_quantile(q, sum by (le) (...)) sees it over the whole life of the process.
type histogram struct {
	bounds []float64 // upper bounds, ascending, +Inf last
	counts []float64 // cumulative
	count  int64
	sum    float64
}

// scrapeHistogram reads the histogram name from a /metrics endpoint, summing the series whose
// label key is value (every series when key is "").
func scrapeHistogram(ctx context.Context, url, name, key, value string) (histogram, error) {
	return scrapeHistogramWhere(ctx, url, name, func(m *dto.Metric) bool { return key == "" || labelValue(m, key) == value })
}

// scrapeHistogramWhere is scrapeHistogram of the series that match accepts.
func scrapeHistogramWhere(ctx context.Context, url, name string, match func(*dto.Metric) bool) (histogram, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return histogram{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return histogram{}, err
	}
	defer resp.Body.Close()
	h, err := parseHistogram(resp.Body, name, match)
	if err != nil {
		return histogram{}, fmt.Errorf("%s: %w", url, err)
	}
	return h, nil
}

// parseHistogram reads the histogram name from the text exposition format, summing the series
// that match accepts.
func parseHistogram(r io.Reader, name string, match func(*dto.Metric) bool) (histogram, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return histogram{}, err
	}
	family, ok := families[name]
	if !ok || family.GetType() != dto.MetricType_HISTOGRAM {
		return histogram{}, fmt.Errorf("no histogram %s", name)
	}
	byBound := map[float64]float64{}
	var h histogram
	for _, m := range family.GetMetric() {
		if !match(m) {
			continue
		}
		hist := m.GetHistogram()
		h.count += int64(hist.GetSampleCount())
		h.sum += hist.GetSampleSum()
		for _, b := range hist.GetBucket() {
			if !math.IsInf(b.GetUpperBound(), 1) { // the text format lists +Inf; the count is it
				byBound[b.GetUpperBound()] += float64(b.GetCumulativeCount())
			}
		}
		byBound[math.Inf(1)] += float64(hist.GetSampleCount())
	}
	for b := range byBound {
		h.bounds = append(h.bounds, b)
	}
	sort.Float64s(h.bounds)
	for _, b := range h.bounds {
		h.counts = append(h.counts, byBound[b])
	}
	return h, nil
}

func labelValue(m *dto.Metric, key string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == key {
			return l.GetValue()
		}
	}
	return ""
}

// quantile is Prometheus's histogram_quantile: linear within the bucket the rank falls in, the
// highest finite bound when it falls in +Inf, 0 without observations.
func (h histogram) quantile(q float64) float64 {
	if len(h.counts) == 0 || h.counts[len(h.counts)-1] == 0 {
		return 0
	}
	rank := q * h.counts[len(h.counts)-1]
	for i, c := range h.counts {
		if c < rank {
			continue
		}
		if math.IsInf(h.bounds[i], 1) {
			if i == 0 {
				return 0
			}
			return h.bounds[i-1]
		}
		lower, below := 0.0, 0.0
		if i > 0 {
			lower, below = h.bounds[i-1], h.counts[i-1]
		}
		if c == below {
			return h.bounds[i]
		}
		return lower + (h.bounds[i]-lower)*(rank-below)/(c-below)
	}
	return h.bounds[len(h.bounds)-1]
}

// rssSampler reads a process's resident memory from /proc every interval until stopped.
type rssSampler struct {
	stop func() memory
}

// memory is what the sampler saw, in MiB: the largest RSS sampled and the kernel's own peak
// (VmHWM) at the last reading, which also catches a peak between samples.
type memory struct {
	PeakSampledMiB float64 `json:"peak_sampled_mib"`
	HWMMiB         float64 `json:"hwm_mib"`
	Samples        int     `json:"samples"`
}

func sampleRSS(pid int, interval time.Duration) rssSampler {
	var mu sync.Mutex
	var m memory
	read := func() {
		mem, err := procstat.ReadMemory(servicekit.ProcRoot, pid)
		if err != nil {
			return // exited
		}
		mu.Lock()
		defer mu.Unlock()
		m.Samples++
		m.PeakSampledMiB = max(m.PeakSampledMiB, float64(mem.RSS)/(1<<20))
		m.HWMMiB = max(m.HWMMiB, float64(mem.HWM)/(1<<20))
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			read()
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	stop := sync.OnceValue(func() memory {
		close(done)
		wg.Wait()
		read()
		mu.Lock()
		defer mu.Unlock()
		return m
	})
	return rssSampler{stop: stop}
}
