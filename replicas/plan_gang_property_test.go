package replicas

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/ferryserve/ferry/launcher"
)

// Property tests of plan for replicas of several nodes, over the same drawn services as
// plan_property_test.go (whose replicas are gangs of 1 to 3 nodes, some nodes missing, ended or
// elsewhere, some in a List's gap). A gang's nodes are told here by their ids, as drawGang
// makes them ("HEAD-RANK"), not by the plan's own pickGang.

// gangView is what the drawn instances say of a recorded replica's gang.
type gangView struct {
	size int
	// head is the head's instance, nil when not listed.
	head *launcher.Instance
	// broken: a node other than the head ended, was preempted or is not listed; running:
	// every node, the head too, is listed and runs.
	broken, running bool
}

// gangOfView reads r's gang from in; ok is false when instances of another launch carry r's id
// (an unowned draw with the same id), which would blur what is r's.
func gangOfView(in planInput, r replicaView) (gangView, bool) {
	var g gangView
	mine := labelledWith(in, r.Record.ID)
	for i := range mine {
		// Exactly the head ("i-4") or one of its nodes ("i-4-1"): another launch's instances
		// ("i-4u", "i-4u-1") share the head's id as a prefix but are not its.
		if r.Record.InstanceID == "" || mine[i].ID != r.Record.InstanceID && !strings.HasPrefix(mine[i].ID, r.Record.InstanceID+"-") {
			return g, false
		}
		if mine[i].ID == r.Record.InstanceID {
			g.head = &mine[i]
		}
	}
	g.size = nodeCount(g.head)
	g.running = g.head != nil && g.head.State == launcher.StateRunning
	for rank := 1; rank < g.size; rank++ {
		i := slices.IndexFunc(mine, func(n launcher.Instance) bool { return n.ID == r.Record.InstanceID+"-"+strconv.Itoa(rank) })
		switch {
		case i < 0:
			g.broken = g.broken || !r.InGap
			g.running = false
		case mine[i].State == launcher.StateTerminated || mine[i].State == launcher.StatePreempted:
			g.broken, g.running = true, false
		case mine[i].State != launcher.StateRunning:
			g.running = false
		}
	}
	return g, true
}

// statusAfter is r's status once out is applied.
func statusAfter(r replicaView, out actions) Status {
	for _, tr := range out.Transitions {
		if tr.ID == r.Record.ID {
			return tr.To
		}
	}
	return r.Record.Status
}

// TestPlanReplacesBrokenGangs: a replica whose head still runs but a node of which ended, was
// preempted or is missing from a complete listing does not stay live: the whole replica goes.
func TestPlanReplacesBrokenGangs(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in, out := settle(drawPlanInput(t))
		for _, r := range in.Replicas {
			g, ok := gangOfView(in, r)
			if !ok || r.Launching || g.head == nil || !g.broken || !live(r.Record.Status) ||
				g.head.State == launcher.StateTerminated || g.head.State == launcher.StatePreempted {
				continue
			}
			if s := statusAfter(r, out); live(s) {
				t.Fatalf("replica %d keeps status %s with a node lost\ninstances %+v\nactions %+v", r.Record.ID, s, labelledWith(in, r.Record.ID), out)
			}
		}
	})
}

// TestPlanReadyOnlyWithEveryNode: a pass makes a gang READY only when every node is listed and
// runs.
func TestPlanReadyOnlyWithEveryNode(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in, out := settle(drawPlanInput(t))
		for _, r := range in.Replicas {
			g, ok := gangOfView(in, r)
			if !ok || g.size == 1 || r.InGap {
				continue
			}
			for _, tr := range out.Transitions {
				if tr.ID == r.Record.ID && tr.To == StatusReady && !g.running {
					t.Fatalf("replica %d READY with a node not running\ninstances %+v\nactions %+v", r.Record.ID, labelledWith(in, r.Record.ID), out)
				}
			}
		}
	})
}

// TestPlanNeverFailsAGangForAGap: a node the List could not see never fails its replica.
func TestPlanNeverFailsAGangForAGap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in, out := settle(drawPlanInput(t))
		for _, r := range in.Replicas {
			for _, tr := range out.Transitions {
				if tr.ID == r.Record.ID && r.InGap && strings.Contains(tr.Reason, "is gone") {
					t.Fatalf("replica %d in a gap failed: %s\nactions %+v", r.Record.ID, tr.Reason, out)
				}
			}
		}
	})
}

// TestPlanStopsWholeGangs: a pass that stops a replica (no launch under way) stops every
// instance that carries its id: the nodes of its gang with it, and strays on their own; none is
// left running unowned.
func TestPlanStopsWholeGangs(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in, out := settle(drawPlanInput(t))
		stopped := map[string]bool{}
		for _, term := range out.Terminate {
			for _, id := range append([]string{term.InstanceID}, term.Nodes...) {
				stopped[id] = true
			}
		}
		launching := map[int]bool{}
		for _, r := range in.Replicas {
			launching[r.Record.ID] = r.Launching
		}
		for _, term := range out.Terminate {
			if term.ReplicaID == 0 || launching[term.ReplicaID] {
				continue
			}
			for _, i := range labelledWith(in, term.ReplicaID) {
				if !stopped[i.ID] {
					t.Fatalf("replica %d stopped without its instance %s\ninstances %+v\nactions %+v",
						term.ReplicaID, i.ID, labelledWith(in, term.ReplicaID), out)
				}
			}
		}
	})
}
