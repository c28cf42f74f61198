package replicas

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// TestRunBatchWritesRecordsTogether checks the executor's order: writes of different records
// run at once, a record written twice in a run is written once as it is last, effects that run
// after (a start, a publication) wait for the run around them, and every other effect runs
// alone, after all before it.
func TestRunBatchWritesRecordsTogether(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock())
	var (
		mu     sync.Mutex
		events []string
	)
	note := func(ev string) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	}
	// Writes 1 and 2 each wait until the other has begun: run one after the other, they would
	// not meet, and the test fails on the timeout rather than hang.
	var met sync.WaitGroup
	met.Add(2)
	metCh := make(chan struct{})
	go func() { met.Wait(); close(metCh) }()
	meeting := func(name string) func() {
		return func() {
			note(name + " begin")
			met.Done()
			select {
			case <-metCh:
			case <-time.After(5 * time.Second):
				note(name + " ran alone")
			}
			note(name + " end")
		}
	}
	simple := func(name string) func() { return func() { note(name) } }
	started := make(chan struct{})
	batch := []effect{
		{kind: recordWrite, record: 1, run: meeting("write 1")},
		{kind: runsAfter, run: func() { note("start"); close(started) }},
		{kind: recordWrite, record: 2, run: meeting("write 2")},
		{kind: recordWrite, record: 3, run: simple("write 3 superseded")},
		{kind: runsAfter, run: simple("publish")},
		{kind: recordWrite, record: 3, run: simple("write 3 as last")},
		{kind: runsAlone, run: simple("verdict")},
		{kind: recordWrite, record: 4, run: simple("write 4")},
	}
	h.m.runBatch(batch)
	<-started

	mu.Lock()
	defer mu.Unlock()
	if slices.Contains(events, "write 1 ran alone") || slices.Contains(events, "write 2 ran alone") {
		t.Fatalf("writes of records 1 and 2 did not run at once: %q", events)
	}
	at := func(ev string) int {
		i := slices.Index(events, ev)
		if i < 0 {
			t.Fatalf("%q never happened: %q", ev, events)
		}
		return i
	}
	if slices.Contains(events, "write 3 superseded") {
		t.Errorf("a write superseded in the same run was made: %q", events)
	}
	for _, order := range [][2]string{
		{"write 1 end", "start"}, {"write 2 end", "start"}, {"write 3 as last", "start"}, // the run is written first
		{"start", "publish"},   // effects that run after keep their order
		{"publish", "verdict"}, // one that runs alone waits for everything before it
		{"verdict", "write 4"}, // and what follows waits for it
	} {
		if at(order[0]) > at(order[1]) {
			t.Errorf("%q came after %q: %q", order[0], order[1], events)
		}
	}
}

// TestPassThatChangesNothingWaitsForNoWrite: a pass that changes nothing queues nothing, so it
// does not wait behind another write in the executor (on a busy API server, seconds: such
// passes made the reconcile p99 of a 1,000-replica scale-up).
func TestPassThatChangesNothingWaitsForNoWrite(t *testing.T) {
	store := newFakeStore()
	h := newHarness(t, newFakeProvider(t), store, newFakeClock())
	h.start()
	h.m.SetDesired(1)
	h.waitReady(1)

	entered, release := store.holdSaves()
	defer release()
	wrote := make(chan struct{})
	go func() {
		h.m.do(func() { h.m.saveOwned(h.m.replicas[1]) })
		close(wrote)
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the record's write never reached the store")
	}
	passed := make(chan struct{})
	go func() {
		h.m.pass()
		close(passed)
	}()
	select {
	case <-passed:
	case <-time.After(5 * time.Second):
		t.Fatal("a pass that changed nothing waited for a write it did not queue")
	}
	select {
	case <-wrote:
		t.Fatal("the do that queued the write returned while the write was held")
	default:
	}
}
