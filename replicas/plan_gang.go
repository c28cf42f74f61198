package replicas

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/ferryserve/ferry/launcher"
)

// A replica of several nodes (num_nodes > 1: a model split by tensor or pipeline parallelism
// over machines) is a gang, launched all or nothing in one location (launcher.LaunchGang), each
// node labelled with the replica id, its rank (launcher.LabelNodeRank) and the gang's size
// (LabelNodes). Its head, rank 0, serves and is probed: the head's instance is the replica's
// InstanceID and its endpoint the replica's. A pass judges the gang by one instance, the head
// standing for all of it (gang.judged): ended when any node ended or, in a complete listing, is
// missing, so that the whole replica is replaced; pending until every node runs, so that it is
// READY only then; priced as all its nodes. Every termination of the replica stops every node
// (pass.terminate). A node missing where the List had a gap is unknown, not lost (InGap).

// gangNodes is a replica's nodes as a pass found them, rank order (Record.Nodes).
type gangNodes struct {
	ID    int
	Nodes []string
}

// gang is one replica's listed instances: the head, and for a gang its other nodes at index
// rank-1 (nil where none is listed).
type gang struct {
	head  *launcher.Instance
	nodes []*launcher.Instance
}

// nodeRank is an instance's rank in its gang: 0 for a head or a replica of one node.
func nodeRank(inst launcher.Instance) int {
	r, err := strconv.Atoi(inst.Labels[launcher.LabelNodeRank])
	if err != nil || r < 0 {
		return 0
	}
	return r
}

// nodeCount is the size of the gang inst was launched in (LabelNodes): 1 when it says none.
func nodeCount(inst *launcher.Instance) int {
	if inst == nil {
		return 1
	}
	n, err := strconv.Atoi(inst.Labels[LabelNodes])
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// pickGang chooses rec's instances among those labelled with its id. The head is chosen among
// rank 0 as a one-node replica's instance is (pickInstance); each further rank of the gang the
// head was launched in takes the node the record names or, when it names none (adopted, or a
// restarted controller), one in the head's location, running first. The rest are strays; with
// no head, all are.
func pickGang(rec Record, insts []launcher.Instance) (gang, []launcher.Instance) {
	var heads, others []launcher.Instance
	for _, inst := range insts {
		if nodeRank(inst) == 0 {
			heads = append(heads, inst)
		} else {
			others = append(others, inst)
		}
	}
	head, strays := pickInstance(rec, heads)
	g := gang{head: head}
	if head == nil {
		return g, append(strays, others...)
	}
	g.nodes = make([]*launcher.Instance, nodeCount(head)-1)
	for i := range others {
		o := &others[i]
		r := nodeRank(*o)
		if r > len(g.nodes) || !mayBeNode(rec, r, *head, *o) {
			strays = append(strays, *o)
			continue
		}
		switch cur := g.nodes[r-1]; {
		case cur == nil:
			g.nodes[r-1] = o
		case cur.ID == o.ID: // listed twice: not a stray
		case cur.State != launcher.StateRunning && o.State == launcher.StateRunning:
			strays = append(strays, *cur)
			g.nodes[r-1] = o
		default:
			strays = append(strays, *o)
		}
	}
	return g, strays
}

// mayBeNode reports whether o may be rank r of the gang rec's head leads: the node the record
// names for that rank or, when it names none, one in the head's location.
func mayBeNode(rec Record, r int, head, o launcher.Instance) bool {
	if r < len(rec.Nodes) && rec.Nodes[r] != "" {
		return o.ID == rec.Nodes[r]
	}
	return sameLocation(head, o)
}

// sameLocation reports whether two instances are in one location, as a gang's nodes are.
func sameLocation(a, b launcher.Instance) bool {
	return a.Infra == b.Infra && a.Zone == b.Zone && (a.Region == "" || b.Region == "" || a.Region == b.Region)
}

// listed are the gang's instances as listed, head first.
func (g gang) listed() []launcher.Instance {
	if g.head == nil {
		return nil
	}
	out := []launcher.Instance{*g.head}
	for _, n := range g.nodes {
		if n != nil {
			out = append(out, *n)
		}
	}
	return out
}

// ids are the ids of a gang's nodes in rank order, or nil when a node is not listed (or the
// replica has one node).
func (g gang) ids() []string {
	if g.head == nil || len(g.nodes) == 0 || slices.Contains(g.nodes, nil) {
		return nil
	}
	out := []string{g.head.ID}
	for _, n := range g.nodes {
		out = append(out, n.ID)
	}
	return out
}

// judged is the instance a pass judges g's replica by: the head itself for a replica of one
// node. For a gang, a copy of the head that has ended when any node did (preempted if any node
// was) or, unless inGap, is not listed; that is pending until every node runs; and that is
// priced as every node listed.
func (g gang) judged(inGap bool) *launcher.Instance {
	if g.head == nil || len(g.nodes) == 0 {
		return g.head
	}
	j := *g.head
	var lost, pending string
	var lostState launcher.State
	for rank, n := range append([]*launcher.Instance{g.head}, g.nodes...) {
		if n == nil {
			if !inGap && lost == "" {
				lostState, lost = launcher.StateTerminated, fmt.Sprintf("node %d is gone", rank)
			}
			continue
		}
		if rank > 0 {
			j.PricePerHour += n.PricePerHour
		}
		switch n.State {
		case launcher.StateRunning:
		case launcher.StatePreempted:
			if lostState != launcher.StatePreempted {
				lostState, lost = n.State, nodeEnded(rank, n)
			}
		case launcher.StateTerminated:
			if lost == "" {
				lostState, lost = n.State, nodeEnded(rank, n)
			}
		default:
			if pending == "" {
				pending = fmt.Sprintf("node %d is not running yet", rank)
			}
		}
	}
	switch {
	case lost != "":
		j.State, j.Reason = lostState, lost
	case pending != "":
		j.State, j.Reason = launcher.StatePending, pending
	}
	return &j
}

// nodeEnded says how node rank of a gang ended.
func nodeEnded(rank int, n *launcher.Instance) string {
	what := "ended"
	if n.State == launcher.StatePreempted {
		what = "was preempted"
	}
	if n.Reason != "" {
		return fmt.Sprintf("node %d %s: %s", rank, what, n.Reason)
	}
	return fmt.Sprintf("node %d %s", rank, what)
}

// allUp reports whether every node of the replica inst stands for runs (gang.judged): a
// replica of one node is up whatever its instance's state, as before gangs.
func allUp(inst *launcher.Instance) bool {
	return nodeCount(inst) == 1 || inst.State == launcher.StateRunning
}

// followNodes has rec follow its gang's nodes when the listing names them all and they differ
// from those the record names.
func (p *pass) followNodes(rec Record, g gang) {
	if ids := g.ids(); ids != nil && !slices.Equal(ids, rec.Nodes) {
		p.out.Gangs = append(p.out.Gangs, gangNodes{ID: rec.ID, Nodes: ids})
	}
}
