package replicas

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// The manager with replicas of two nodes (num_nodes: 2) against the fake provider: each node
// is a real HTTP server on loopback; the head's is probed.

func withNodes(n int) func(*Config) {
	return func(c *Config) {
		task := *c.Task
		task.NumNodes = n
		c.Task = &task
	}
}

// gangNode finds node rank of replica id.
func (p *fakeProvider) gangNode(id, rank int) *fakeInstance {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, fi := range p.insts {
		if fi.inst.Labels[launcher.LabelReplicaID] == strconv.Itoa(id) && fi.inst.Labels[launcher.LabelNodeRank] == strconv.Itoa(rank) {
			return fi
		}
	}
	p.t.Fatalf("no node %d of replica %d", rank, id)
	return nil
}

// setNode changes how node rank of replica id is listed.
func (p *fakeProvider) setNode(id, rank int, state launcher.State, reason string) {
	fi := p.gangNode(id, rank)
	p.mu.Lock()
	defer p.mu.Unlock()
	fi.inst.State, fi.inst.Reason = state, reason
}

// dropNode makes node rank of replica id vanish from listings, as a machine the infra lost
// without a trace.
func (p *fakeProvider) dropNode(id, rank int) {
	fi := p.gangNode(id, rank)
	p.mu.Lock()
	defer p.mu.Unlock()
	fi.srv.Close()
	delete(p.insts, fi.inst.ID)
}

func (p *fakeProvider) wasTerminated(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Contains(p.terminated, id)
}

func (p *fakeProvider) launchCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.specs)
}

// passes waits until the manager has listed n more times: passes that could have decided.
func (h *harness) passes(n int) {
	h.t.Helper()
	from := h.prov.listCount()
	eventually(h.t, fmt.Sprintf("%d more passes", n), func() bool { return h.prov.listCount() >= from+n })
}

func TestManagerGangLaunchesAllNodesAndServesFromTheHead(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock(), withNodes(2))
	h.start()
	h.m.SetDesired(1)
	h.waitReady(1)

	head, worker := h.prov.gangNode(1, 0), h.prov.gangNode(1, 1)
	rec := h.record(1)
	if rec.InstanceID != head.inst.ID || rec.Endpoint != head.inst.Endpoint || h.m.Ready()[0].Addr != head.inst.Endpoint {
		t.Errorf("record %+v, READY %v: want the head's instance %s and endpoint %s", rec, h.m.Ready(), head.inst.ID, head.inst.Endpoint)
	}
	if want := []string{head.inst.ID, worker.inst.ID}; !slices.Equal(rec.Nodes, want) {
		t.Errorf("record's nodes %v, want %v", rec.Nodes, want)
	}
	h.prov.mu.Lock()
	specs := slices.Clone(h.prov.specs)
	h.prov.mu.Unlock()
	if len(specs) != 2 {
		t.Fatalf("%d launches, want the gang's 2 nodes", len(specs))
	}
	slices.SortFunc(specs, func(a, b launcher.Spec) int { return compareStrings(a.Name, b.Name) })
	for rank, s := range specs {
		r := strconv.Itoa(rank)
		if s.Name != "svc-1-"+r || s.Labels[launcher.LabelNodeRank] != r || s.Labels[LabelNodes] != "2" ||
			s.Labels[launcher.LabelReplicaID] != "1" || s.Envs[launcher.EnvNodeRank] != r || s.Envs[launcher.EnvNumNodes] != "2" {
			t.Errorf("node %d: name %s, labels %v, rank env %q, nodes env %q", rank, s.Name, s.Labels, s.Envs[launcher.EnvNodeRank], s.Envs[launcher.EnvNumNodes])
		}
		// The infras hand a gang its addresses (SKYPILOT_NODE_IPS) through its JobSpec.
		if s.Job == nil || s.Job.Priority != launcher.ServingPriority || s.Job.Preemptible {
			t.Errorf("node %d: job spec %+v, want serving priority, not preemptible", rank, s.Job)
		}
	}
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// TestManagerGangReadyOnlyWhenEveryNodeRuns: the head answering its probe is not enough.
func TestManagerGangReadyOnlyWhenEveryNodeRuns(t *testing.T) {
	prov := newFakeProvider(t)
	prov.nodesPending = true
	h := newHarness(t, prov, newFakeStore(), newFakeClock(), withNodes(2))
	h.start()
	h.m.SetDesired(1)
	h.waitStatus(1, StatusStarting)
	eventually(t, "the head's probe passing", func() bool {
		ok := false
		h.m.own(func() {
			r := h.m.replicas[1]
			ok = r != nil && r.probe.OK
		})
		return ok
	})
	h.passes(3)
	if s := h.status(1); s != StatusStarting || len(h.m.Ready()) != 0 {
		t.Fatalf("head answers, node 1 pending: replica %s, READY %v; want STARTING and none", s, h.m.Ready())
	}
	h.prov.setNode(1, 1, launcher.StateRunning, "")
	h.waitReady(1)

	// A READY gang whose node stops running leaves the READY set while the head still answers.
	h.prov.setNode(1, 1, launcher.StatePending, "")
	h.waitReady()
	if r := h.record(1); r.Status != StatusNotReady || r.Reason != "node 1 is not running yet" {
		t.Fatalf("replica %s (%s), want NOT_READY for node 1", r.Status, r.Reason)
	}
	h.prov.setNode(1, 1, launcher.StateRunning, "")
	h.waitReady(1)
}

// TestManagerGangReplacedWholeWhenANodeIsLost: a node that ends, or vanishes from a complete
// listing, takes the whole replica down, though its head still answers: every node is
// stopped and a new gang serves in its place.
func TestManagerGangReplacedWholeWhenANodeIsLost(t *testing.T) {
	for name, lose := range map[string]func(p *fakeProvider, id int){
		"ended":    func(p *fakeProvider, id int) { p.setNode(id, 1, launcher.StateTerminated, "exit status 137") },
		"vanished": func(p *fakeProvider, id int) { p.dropNode(id, 1) },
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock(), withNodes(2))
			h.start()
			h.m.SetDesired(2)
			h.waitReady(1, 2)
			head, worker := h.prov.gangNode(1, 0).inst.ID, h.prov.gangNode(1, 1).inst.ID
			// A launch's nodes count as running until a List begun after it has shown them
			// (launchListGrace, 30 s): READY can come first on a busy host, and a node
			// vanishing then is not yet "gone from a complete listing". Let one be listed.
			h.passes(2)
			lose(h.prov, 1)
			h.waitReady(2, 3)
			if s := h.status(1); s != StatusFailed {
				t.Errorf("replica 1 %s, want FAILED", s)
			}
			eventually(t, "the head stopped with its lost node", func() bool { return h.prov.wasTerminated(head) })
			if name == "ended" && !h.prov.wasTerminated(worker) {
				t.Error("the ended node was not stopped")
			}
			if r := h.record(3); len(r.Nodes) != 2 {
				t.Errorf("replacement's nodes %v, want 2", r.Nodes)
			}
			if n := h.prov.launchCount(); n != 6 {
				t.Errorf("%d node launches, want 6: two gangs and one whole replacement", n)
			}
		})
	}
}

// TestManagerGangNoticeOnANodeReplacesTheReplica: a spot warning for any node of a gang
// replaces the whole replica ahead of the reclaim.
func TestManagerGangNoticeOnANodeReplacesTheReplica(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock(), withNodes(2))
	h.start()
	h.m.SetDesired(1)
	h.waitReady(1)
	warned := h.record(1).Nodes
	if !h.m.Notice(warned[1], h.clock.Now().Add(2*time.Minute)) {
		t.Fatal("a notice for node 1 was not taken as the replica's")
	}
	h.waitReady(2)
	eventually(t, "the warned replica's nodes stopped", func() bool {
		return h.prov.wasTerminated(warned[0]) && h.prov.wasTerminated(warned[1])
	})
}

// TestManagerGangScaleDownAndShutdownStopEveryNode: a replica scaled down, and a service
// taken down, leave no node running.
func TestManagerGangScaleDownAndShutdownStopEveryNode(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock(), withNodes(2))
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2)
	nodes := map[int][]string{1: h.record(1).Nodes, 2: h.record(2).Nodes}
	h.m.SetDesired(1)
	eventually(t, "one replica left", func() bool { return len(h.m.Replicas()) == 1 })
	gone := 3 - h.m.Replicas()[0].ID
	for _, id := range nodes[gone] {
		if !h.prov.wasTerminated(id) {
			t.Errorf("node %s of scaled-down replica %d still runs", id, gone)
		}
	}
	if n := h.prov.count(); n != 2 {
		t.Errorf("%d instances after scale-down, want the remaining gang's 2", n)
	}
	if _, err := h.m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := h.prov.count(); n != 0 {
		t.Errorf("%d instances after Shutdown", n)
	}
}

// TestManagerAdoptsGangsAfterRestart: a restarted controller whose store kept no node list
// (SQLite does not) finds each gang by its replica id and ranks: nothing is launched or
// stopped, and the records name the nodes again. An infra that cannot be listed meanwhile
// loses no gang either.
func TestManagerAdoptsGangsAfterRestart(t *testing.T) {
	prov, store, clock := newFakeProvider(t), newFakeStore(), newFakeClock()
	first := newHarness(t, prov, store, clock, withNodes(2))
	first.start()
	first.m.SetDesired(2)
	first.waitReady(1, 2)
	want := map[int][]string{1: first.record(1).Nodes, 2: first.record(2).Nodes}
	first.stop()
	for _, id := range []int{1, 2} {
		r, _ := store.get("svc", id)
		r.Nodes = nil
		_ = store.SaveReplica(r)
	}

	prov.setGaps(fakeDown)
	second := newHarness(t, prov, store, clock, withNodes(2))
	second.start()
	second.waitReady(1, 2)
	second.passes(5)
	prov.setGaps()
	second.passes(3)
	second.waitReady(1, 2)
	for id, nodes := range want {
		if got := second.record(id).Nodes; !slices.Equal(got, nodes) {
			t.Errorf("replica %d nodes %v after restart, want %v", id, got, nodes)
		}
	}
	prov.mu.Lock()
	launches, terminated := len(prov.specs), slices.Clone(prov.terminated)
	prov.mu.Unlock()
	if launches != 4 || len(terminated) != 0 {
		t.Fatalf("after restart: %d node launches and terminated %v; want the first 4 and none", launches, terminated)
	}
}

// TestManagerRollingUpdateToAndBetweenGangs: a rolling update from one-node replicas to
// 2-node gangs launches the new version as gangs, and one between gang versions stops every
// node of the old gangs.
func TestManagerRollingUpdateToAndBetweenGangs(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock())
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2)

	gangs := v2Task()
	gangs.NumNodes = 2
	h.m.startRollout(Version{Number: 2, Task: gangs}, newRollout(configs.UpdateRolling))
	h.waitRollout(RolloutSucceeded)
	h.waitReady(3, 4)
	old := map[int][]string{3: h.record(3).Nodes, 4: h.record(4).Nodes}
	for id, nodes := range old {
		if len(nodes) != 2 {
			t.Fatalf("replica %d of version 2 has nodes %v, want a gang of 2", id, nodes)
		}
	}
	eventually(t, "version 1's instances stopped", func() bool { return h.prov.count() == 4 })

	v3 := v2Task()
	v3.NumNodes, v3.Run = 2, "serve-v3 --port $FERRY_PORT"
	r := newRollout(configs.UpdateRolling)
	r.From, r.To = 2, 3
	h.m.startRollout(Version{Number: 3, Task: v3}, r)
	h.waitRollout(RolloutSucceeded)
	h.waitReady(5, 6)
	eventually(t, "version 2's gangs stopped, every node", func() bool {
		for _, nodes := range old {
			for _, id := range nodes {
				if !h.prov.wasTerminated(id) {
					return false
				}
			}
		}
		return h.prov.count() == 4
	})
}

// TestManagerGangShutdownLeavesWhatItCannotReach: a teardown that cannot list the gangs' infra
// names every node of each gang as left behind, and the rest of the service by selector.
func TestManagerGangShutdownLeavesWhatItCannotReach(t *testing.T) {
	h := newHarness(t, newFakeProvider(t), newFakeStore(), newFakeClock(), withNodes(2))
	h.start()
	h.m.SetDesired(2)
	h.waitReady(1, 2)
	want := slices.Concat(h.record(1).Nodes, h.record(2).Nodes)
	h.prov.setGaps(fakeDown)
	left, err := h.m.Shutdown(context.Background())
	if err != nil {
		t.Fatalf("Shutdown with the infra down: %v, want success with leftovers", err)
	}
	var ids []string
	selectors := 0
	for _, l := range left {
		if l.InstanceID != "" {
			ids = append(ids, l.InstanceID)
		} else if l.Selector[launcher.LabelService] == "svc" {
			selectors++
		}
	}
	slices.Sort(ids)
	slices.Sort(want)
	if !slices.Equal(ids, want) || selectors != 1 {
		t.Fatalf("left behind %+v; want every node %v and one selector", left, want)
	}
}
