package replicas

import (
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/ferryserve/ferry/launcher"
)

// node is rank of replica id's gang of size nodes, as a provider lists it: the head is "i-ID"
// (as a one-node replica's instance), the others "i-ID-RANK", each priced 1 an hour.
func node(id, rank, size int, state launcher.State, reason string) launcher.Instance {
	i := inst(id, state, reason)
	if rank > 0 {
		i.ID += "-" + strconv.Itoa(rank)
		i.Endpoint = ""
	}
	i.Labels[launcher.LabelNodeRank] = strconv.Itoa(rank)
	i.Labels[LabelNodes] = strconv.Itoa(size)
	i.PricePerHour = 1
	return i
}

// gangRec is replica id's record as a launch leaves it: the head's instance, every node named.
func gangRec(id int, s Status, size int) Record {
	r := rec(id, s)
	r.Price = float64(size)
	for rank := range size {
		r.Nodes = append(r.Nodes, node(id, rank, size, launcher.StateRunning, "").ID)
	}
	return r
}

func gangOf(id, size int) []launcher.Instance {
	var out []launcher.Instance
	for rank := range size {
		out = append(out, node(id, rank, size, launcher.StateRunning, ""))
	}
	return out
}

// TestPlanGangs: a replica of several nodes is READY only when every node runs and its head's
// probe passes; it is replaced as a whole when any node ends, is preempted or is missing from
// a complete listing, never for a node the List could not see; whatever stops it stops every
// node; a restarted controller adopts it by its replica id and ranks.
func TestPlanGangs(t *testing.T) {
	now := t0.Add(time.Minute)
	base := planInput{Now: now, Service: "svc", Desired: 1, InitialDelay: 20 * time.Minute,
		FailureThreshold: 3 * time.Minute, KeepFailed: 10}
	withInput := func(f func(*planInput)) planInput {
		in := base
		f(&in)
		return in
	}
	stopAll := termination{ReplicaID: 1, InstanceID: "i-1", Nodes: []string{"i-1-1"}}
	tests := map[string]struct {
		in   planInput
		want actions
	}{
		"head answers but a node is not running yet: still starting": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(gangRec(1, StatusStarting, 2), probeOK)}
				in.Instances = []launcher.Instance{node(1, 0, 2, launcher.StateRunning, ""), node(1, 1, 2, launcher.StatePending, "")}
			}),
			want: actions{},
		},
		"every node runs and the head answers: ready": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(gangRec(1, StatusStarting, 2), probeOK)}
				in.Instances = gangOf(1, 2)
			}),
			want: actions{Transitions: []transition{{ID: 1, From: StatusStarting, To: StatusReady}}},
		},
		"a ready gang whose node stops running leaves the ready set": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(gangRec(1, StatusReady, 3), probeOK)}
				in.Instances = []launcher.Instance{node(1, 0, 3, launcher.StateRunning, ""), node(1, 1, 3, launcher.StateRunning, ""),
					node(1, 2, 3, launcher.StatePending, "")}
			}),
			want: actions{Transitions: []transition{{ID: 1, From: StatusReady, To: StatusNotReady, Reason: "node 2 is not running yet"}}},
		},
		"a node gone from a complete listing: the whole replica is replaced": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(gangRec(1, StatusReady, 2), probeOK)}
				in.Instances = gangOf(1, 2)[:1]
			}),
			want: actions{
				Transitions: []transition{{ID: 1, From: StatusReady, To: StatusFailed, Reason: "node 1 is gone"}},
				Terminate:   []termination{terminateKeep(1)},
				Launch:      1,
			},
		},
		"a node that ended: both nodes stop and a new gang launches": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(gangRec(1, StatusReady, 2), probeOK)}
				in.Instances = []launcher.Instance{node(1, 0, 2, launcher.StateRunning, ""), node(1, 1, 2, launcher.StateTerminated, "exit status 1")}
			}),
			want: actions{
				Transitions: []transition{{ID: 1, From: StatusReady, To: StatusFailed, Reason: "node 1 ended: exit status 1"}},
				Terminate:   []termination{stopAll},
				Launch:      1,
			},
		},
		"a preempted node preempts the replica": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(gangRec(1, StatusReady, 2), probeOK)}
				in.Instances = []launcher.Instance{node(1, 0, 2, launcher.StateRunning, ""), node(1, 1, 2, launcher.StatePreempted, "")}
			}),
			want: actions{
				Transitions: []transition{{ID: 1, From: StatusReady, To: StatusPreempted, Reason: "node 1 was preempted"}},
				Terminate:   []termination{stopAll},
				Launch:      1,
			},
		},
		"a node the List could not see is unknown, not lost": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{{Record: gangRec(1, StatusReady, 2), Probe: probeOK, InGap: true}}
				in.Instances = gangOf(1, 2)[:1]
			}),
			want: actions{},
		},
		"scale-down stops every node": {
			in: withInput(func(in *planInput) {
				in.Desired = 0
				in.Replicas = []replicaView{view(gangRec(1, StatusReady, 2), probeOK)}
				in.Instances = gangOf(1, 2)
			}),
			want: actions{
				Transitions: []transition{{ID: 1, From: StatusReady, To: StatusShuttingDown, Reason: "scaled down"}},
				Terminate:   []termination{{ReplicaID: 1, InstanceID: "i-1", Nodes: []string{"i-1-1"}, Forget: true}},
			},
		},
		"a restarted controller adopts a gang by its replica id and ranks": {
			in: withInput(func(in *planInput) {
				in.Instances = gangOf(1, 2)
			}),
			want: actions{Adopt: []Record{{Service: "svc", ID: 1, Version: 1, Status: StatusStarting, Reason: "adopted",
				InstanceID: "i-1", Endpoint: "127.0.0.1:9001", Infra: "local", Price: 2, LaunchedAt: t0, Nodes: []string{"i-1", "i-1-1"}}}},
		},
		"a record that lost its nodes (SQLite) follows the gang listed": {
			in: withInput(func(in *planInput) {
				r := gangRec(1, StatusReady, 2)
				r.Nodes = nil
				in.Replicas = []replicaView{view(r, probeOK)}
				in.Instances = gangOf(1, 2)
			}),
			want: actions{Gangs: []gangNodes{{ID: 1, Nodes: []string{"i-1", "i-1-1"}}}},
		},
		"nodes of a gang without its head are strays": {
			in: withInput(func(in *planInput) {
				in.Desired = 0
				in.Instances = gangOf(1, 2)[1:]
			}),
			want: actions{Terminate: []termination{{InstanceID: "i-1-1"}}},
		},
		"a node elsewhere than its head is a stray": {
			in: withInput(func(in *planInput) {
				r := gangRec(1, StatusReady, 2)
				r.Nodes = nil
				in.Replicas = []replicaView{view(r, probeOK)}
				far := node(1, 1, 2, launcher.StateRunning, "")
				far.ID, far.Zone = "i-far", "b"
				in.Instances = append(gangOf(1, 2), far)
			}),
			want: actions{Terminate: []termination{{InstanceID: "i-far"}}, Gangs: []gangNodes{{ID: 1, Nodes: []string{"i-1", "i-1-1"}}}},
		},
		"a node the record does not name is a stray": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{view(gangRec(1, StatusReady, 2), probeOK)}
				other := node(1, 1, 2, launcher.StateRunning, "")
				other.ID = "i-other"
				in.Instances = append(gangOf(1, 2), other)
			}),
			want: actions{Terminate: []termination{{InstanceID: "i-other"}}},
		},
		"a gang's launch under way keeps what it made": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{{Record: Record{Service: "svc", ID: 1, Version: 1, Status: StatusProvisioning}, Launching: true}}
				failed := node(1, 0, 2, launcher.StateRunning, "")
				failed.ID, failed.Zone = "i-rolling-back", "a"
				in.Instances = append(gangOf(1, 2), failed)
			}),
			want: actions{},
		},
		"an interrupted launch with a node missing fails and stops what it made": {
			in: withInput(func(in *planInput) {
				in.Replicas = []replicaView{{Record: Record{Service: "svc", ID: 1, Version: 1, Status: StatusProvisioning}}}
				in.Instances = gangOf(1, 2)[:1]
			}),
			want: actions{
				Transitions: []transition{{ID: 1, From: StatusProvisioning, To: StatusFailedProvision, Reason: "launch interrupted; instance ended: node 1 is gone"}},
				Terminate:   []termination{terminateKeep(1)},
				Launch:      1,
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := plan(tc.in)
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("plan() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
