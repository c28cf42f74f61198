package main

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strconv"
)

// adapterName is the i-th LoRA adapter of the --adapters workload.
func adapterName(i int) string { return "lora-" + strconv.Itoa(i) }

// assignAdapters makes every request of wl name one of n adapters instead of the base model,
// each conversation's drawn with Zipf popularity of exponent s (the i-th adapter, from 1, has weight 1/i^s): one
// base model fine-tuned per customer or task, a few of them hot. The arrivals, lengths and
// shared prefixes stay the workload's; a prefix is shared only between requests of one
// adapter, since an engine keys cached blocks by the adapter too.
func assignAdapters(wl *workload, base string, n int, s float64, seed uint64) {
	weights := make([]float64, n)
	total := 0.0
	for i := range weights {
		weights[i] = 1 / math.Pow(float64(i+1), s)
		total += weights[i]
	}
	rng := rand.New(rand.NewPCG(seed, 0x6c6f7261)) // "lora"
	from := []byte(`"model":"` + base + `"`)
	chosen := map[int]int{} // a conversation keeps its adapter
	for i := range wl.Requests {
		r := &wl.Requests[i]
		a, ok := chosen[r.Conversation]
		if !ok {
			x := rng.Float64() * total
			for a < n-1 && x >= weights[a] {
				x -= weights[a]
				a++
			}
			chosen[r.Conversation] = a
		}
		r.Adapter = adapterName(a)
		r.Body = bytes.Replace(r.Body, from, []byte(`"model":"`+adapterName(a)+`"`), 1)
	}
}
