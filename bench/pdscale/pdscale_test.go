package main

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/bench/azuretrace"
	"github.com/ferryserve/ferry/configs"
)

func TestWorkloadFollowsTheTraceAtTheRate(t *testing.T) {
	recs := []azuretrace.Record{{ContextTokens: 2000, GeneratedTokens: 20}, {ContextTokens: 0, GeneratedTokens: 5000}}
	reqs := workload(recs, 10, 100*time.Second, 600, rand.New(rand.NewPCG(1, 2)))
	if n := len(reqs); n < 900 || n > 1100 {
		t.Fatalf("%d requests in 100 s at 10/s", n)
	}
	for i, r := range reqs {
		if r.At >= 100*time.Second || (i > 0 && r.At < reqs[i-1].At) {
			t.Fatalf("request %d at %v: out of order or past the phase", i, r.At)
		}
		if !(r.PromptTokens == 2000 && r.Answer == 20) && !(r.PromptTokens == 1 && r.Answer == 600) {
			t.Fatalf("request %d: %+v, want a record's lengths (an empty prompt as 1 token, answers capped at 600)", i, r)
		}
	}
}

func TestFlagsAndTheServiceTheyWrite(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	task, err := configs.Parse("pd.yaml", []byte(o.yaml()), configs.Overrides{})
	if err != nil {
		t.Fatalf("the driver's service does not parse: %v\n%s", err, o.yaml())
	}
	if !task.Service.Disaggregated() || task.Service.Pools.Prefill.TargetQueuedPromptTokens != 2000 {
		t.Fatalf("pools %+v", task.Service.Pools)
	}
	for _, args := range [][]string{{"--rate", "0"}, {"--phase", "1s"}, {"--max-replicas", "9"}, {"--max-tokens", "0"}, {"extra"}} {
		if _, err := parseFlags(args); err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(args[0], "--")) {
			t.Errorf("%v: error %v", args, err)
		}
	}
}
