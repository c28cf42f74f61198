package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// multiNodeYAML is SkyPilot's multi-node serving shape (llm/deepseek-r1: num_nodes under a
// service, the head found as the first line of SKYPILOT_NODE_IPS, the rank in
// SKYPILOT_NODE_RANK) on local: each replica is a gang of two processes, each on a loopback
// address of its own with the task's port (%[1]d). The head serves once its worker has joined,
// as SGLang's head waits for its ranks; the worker runs its rank's server and stays up while
// the head is up.
const multiNodeYAML = `name: multinode
resources:
  infra: local
  ports: %[1]d
num_nodes: 2
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 60
  replicas: 2
  load_balancing_policy: round_robin
` + multiNodeRun

// multiNodeRun is the gang's program: the head serves once its worker answers; the worker
// serves its rank and stays up while the head answers.
const multiNodeRun = `run: |
  HEAD=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
  WORKER=$(echo "$SKYPILOT_NODE_IPS" | sed -n 2p)
  up() { (exec 3<>"/dev/tcp/$1/%[1]d") 2>/dev/null; }
  if [ "$SKYPILOT_NODE_RANK" = 0 ]; then
    until up "$WORKER"; do sleep 0.1; done
    exec ferry replica-sim --host "$HEAD" --port %[1]d --model ferry-sim-1b
  fi
  ferry replica-sim --host "$WORKER" --port %[1]d --model rank-$SKYPILOT_NODE_RANK-of-$SKYPILOT_NUM_NODES &
  until up "$HEAD"; do sleep 0.1; done
  while up "$HEAD"; do sleep 0.2; done
`

// gangNode is one node of a local replica, from the local provider's instance metadata.
type gangNode struct {
	ID, Endpoint string
	PID, PGID    int
}

// gangNodes maps each live replica id to its nodes by rank.
func (e *env) gangNodes() map[int]map[int]gangNode {
	e.t.Helper()
	out := map[int]map[int]gangNode{}
	matches, _ := filepath.Glob(filepath.Join(e.home, "local", "*", "instance.json"))
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		var meta struct {
			ID       string            `json:"id"`
			PID      int               `json:"pid"`
			PGID     int               `json:"pgid"`
			Endpoint string            `json:"endpoint"`
			Labels   map[string]string `json:"labels"`
		}
		if json.Unmarshal(b, &meta) != nil || !alive(meta.PID) {
			continue
		}
		id, err1 := strconv.Atoi(meta.Labels["ferry.replica-id"])
		rank, err2 := strconv.Atoi(meta.Labels["ferry.node-rank"])
		if err1 != nil || err2 != nil {
			continue
		}
		if out[id] == nil {
			out[id] = map[int]gangNode{}
		}
		out[id][rank] = gangNode{ID: meta.ID, Endpoint: meta.Endpoint, PID: meta.PID, PGID: meta.PGID}
	}
	return out
}

// replicaNodes reads each replica's node list from `serve status --json`.
func (e *env) replicaNodes(name string) map[int][]string {
	e.t.Helper()
	var list []struct {
		Replicas []struct {
			ID    int      `json:"id"`
			Nodes []string `json:"nodes"`
		} `json:"replicas"`
	}
	if err := json.Unmarshal([]byte(e.mustRun("serve", "status", name, "--json")), &list); err != nil || len(list) != 1 {
		e.t.Fatalf("serve status --json: %v", err)
	}
	out := map[int][]string{}
	for _, r := range list[0].Replicas {
		out[r.ID] = r.Nodes
	}
	return out
}

// checkGangs fails t unless every READY replica of st is a whole gang: both nodes' processes
// alive, the replica's instance and endpoint its head's, each node on an address of its own.
func checkGangs(t *testing.T, st serviceStatus, gangs map[int]map[int]gangNode) {
	t.Helper()
	for _, r := range st.Replicas {
		if r.Status != "READY" {
			continue
		}
		g := gangs[r.ID]
		head, worker := g[0], g[1]
		if len(g) != 2 || head.PID == 0 || worker.PID == 0 {
			t.Fatalf("READY replica %d has nodes %+v, want 2 alive", r.ID, g)
		}
		if r.InstanceID != head.ID || r.Endpoint != head.Endpoint {
			t.Fatalf("replica %d: instance %s at %s, want its head %s at %s", r.ID, r.InstanceID, r.Endpoint, head.ID, head.Endpoint)
		}
		hh, _, _ := net.SplitHostPort(head.Endpoint)
		wh, _, _ := net.SplitHostPort(worker.Endpoint)
		if hh == wh || !strings.HasPrefix(hh, "127.") || !strings.HasPrefix(wh, "127.") {
			t.Fatalf("replica %d: head at %s, worker at %s: want loopback addresses of their own", r.ID, head.Endpoint, worker.Endpoint)
		}
	}
}

// TestMultiNodeReplicas: a service of two replicas, each a gang of two local processes,
// serves through the proxy from the heads; a replica is READY with both its nodes up; when one
// node of a replica dies (its head still answering), the whole replica is replaced by a new
// gang while requests keep succeeding on the other; a restarted controller adopts the gangs
// as they run; serve down stops every node.
func TestMultiNodeReplicas(t *testing.T) {
	port := freePort(t)
	e := newEnv(t)
	file := filepath.Join(t.TempDir(), "multinode.yaml")
	writeFile(t, file, fmt.Sprintf(multiNodeYAML, port))
	upAt := time.Now()
	e.mustRun("serve", "up", file, "-y")

	var st serviceStatus
	eventually(t, 90*time.Second, "2 READY replicas", func() (bool, string) {
		var err error
		if st, err = e.status("multinode"); err != nil {
			return false, err.Error()
		}
		return len(st.ready()) == 2, fmt.Sprintf("%+v", st.Replicas)
	})
	t.Logf("2 gangs of 2 nodes READY %.1fs after serve up began", time.Since(upAt).Seconds())
	gangs := e.gangNodes()
	checkGangs(t, st, gangs)
	chatPlain(t, st.Endpoint)

	ids := slices.Sorted(maps.Keys(st.ready()))
	victim, other := ids[0], ids[1]
	victimHead, otherGang := gangs[victim][0], gangs[other]

	t.Run("a lost node replaces its whole replica; the other serves on", func(t *testing.T) {
		load := startSteadyLoad(st.Endpoint)
		defer load.stop()
		eventually(t, 30*time.Second, "requests flowing", func() (bool, string) { return load.sent.Load() >= 10, fmt.Sprint(load.sent.Load()) })
		// The worker's machine dies: every process of its node. Its head still answers probes.
		killedAt := time.Now()
		if err := syscall.Kill(-gangs[victim][1].PGID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		var after serviceStatus
		eventually(t, 90*time.Second, "a new gang READY in place of the broken one", func() (bool, string) {
			var err error
			if after, err = e.status("multinode"); err != nil {
				return false, err.Error()
			}
			ready := after.ready()
			_, victimReady := ready[victim]
			newOne := slices.ContainsFunc(slices.Collect(maps.Keys(ready)), func(id int) bool { return id > other })
			return len(ready) == 2 && !victimReady && newOne && !alive(victimHead.PID), fmt.Sprintf("%+v", after.Replicas)
		})
		t.Logf("replica %d replaced whole: a new gang READY %.1fs after its worker was killed", victim, time.Since(killedAt).Seconds())
		sentBefore := load.sent.Load()
		eventually(t, 30*time.Second, "requests served by the new gang too", func() (bool, string) {
			return load.sent.Load() >= sentBefore+10, fmt.Sprint(load.sent.Load())
		})
		load.stop()
		t.Logf("steady load through the proxy: %d requests, %d failed", load.sent.Load(), load.failed.Load())
		if n := load.failed.Load(); n > 0 {
			t.Errorf("%d of %d requests failed while the replica was replaced; first: %v", n, load.sent.Load(), load.firstErr.Load())
		}
		now := e.gangNodes()
		checkGangs(t, after, now)
		if now[other][0].PID != otherGang[0].PID || now[other][1].PID != otherGang[1].PID {
			t.Errorf("the other replica's nodes changed: %+v -> %+v", otherGang, now[other])
		}
		if len(now[victim]) != 0 {
			t.Errorf("the broken replica left nodes running: %+v", now[victim])
		}
	})

	t.Run("a restarted controller adopts the gangs", func(t *testing.T) {
		before := e.gangNodes()
		ctrl := e.controllerPID()
		if err := syscall.Kill(ctrl, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "controller gone", func() (bool, string) { return !alive(ctrl), "alive" })
		eventually(t, 60*time.Second, "both gangs READY again, their nodes known", func() (bool, string) {
			st, err := e.status("multinode")
			if err != nil {
				return false, err.Error()
			}
			nodes := e.replicaNodes("multinode")
			whole := 0
			for id := range st.ready() {
				if len(nodes[id]) == 2 {
					whole++
				}
			}
			return whole == 2, fmt.Sprintf("%+v nodes %v", st.Replicas, nodes)
		})
		if after := e.gangNodes(); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("gangs not adopted as they ran: before %v, after %v", before, after)
		}
		st, err := e.status("multinode")
		if err != nil {
			t.Fatal(err)
		}
		chatPlain(t, st.Endpoint)
	})

	t.Run("serve down stops every node", func(t *testing.T) {
		nodes := e.gangNodes()
		e.mustRun("serve", "down", "multinode", "-y")
		for id, g := range nodes {
			for rank, n := range g {
				if alive(n.PID) {
					t.Errorf("replica %d node %d (pid %d) still running after serve down", id, rank, n.PID)
				}
			}
		}
		if left := processesWith("replica-sim", "--port "+strconv.Itoa(port)); len(left) != 0 {
			t.Errorf("replica-sim processes left: %v", left)
		}
	})
}

// multiNodeSpotYAML is the same gang as spot VMs on a fake cloud (%[2]s, with accelerator
// %[3]s): one replica of two nodes.
const multiNodeSpotYAML = `name: mnspot
resources:
  infra: %[2]s
  accelerators: %[3]s
  use_spot: true
  ports: %[1]d
num_nodes: 2
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 120
  replicas: 1
` + multiNodeRun

// gangVM is what a fake cloud says of one VM of a gang.
type gangVM struct {
	state, zone, group, ip string
}

// vm reads instance id (the replica's "infra/.../name") from the fake cloud it is on.
func (f *fakeClouds) vm(t *testing.T, id string) gangVM {
	t.Helper()
	name := id[strings.LastIndex(id, "/")+1:]
	if strings.HasPrefix(id, "aws/") {
		for _, in := range f.ec2.Instances() {
			if in.ID == name {
				return gangVM{state: in.State, zone: in.ZoneName, group: in.PlacementGroup, ip: in.PrivateIP}
			}
		}
		return gangVM{}
	}
	in, zone, ok := f.gce.Instance(name)
	if !ok {
		return gangVM{state: "deleted"}
	}
	ip := ""
	if nics := in.GetNetworkInterfaces(); len(nics) > 0 {
		ip = nics[0].GetNetworkIP()
	}
	return gangVM{state: strings.ToLower(in.GetStatus()), zone: zone, ip: ip}
}

// TestMultiNodeReplicaOnFakeClouds: on the fake EC2 and Compute Engine a replica's gang is two
// spot VMs in one zone (one placement group on EC2), which learn each other's addresses from
// their instance metadata as a job's gang does; the head serves through the proxy; when the
// cloud reclaims the worker, the whole replica goes (on the worker's interruption warning, or
// PREEMPTED once the listing shows it reclaimed), its head VM is stopped, and a new gang serves
// in its place.
func TestMultiNodeReplicaOnFakeClouds(t *testing.T) {
	t.Parallel()
	for infra, gpu := range map[string]string{"aws": "A10G:1", "gcp": "L4:1"} {
		t.Run(infra, func(t *testing.T) { testGangOnFakeCloud(t, infra, gpu) })
	}
}

func testGangOnFakeCloud(t *testing.T, infra, gpu string) {
	clouds := startFakeClouds(t)
	e := newEnv(t)
	e.extraEnv = awsEnv
	writeFile(t, filepath.Join(e.home, "config.yaml"), clouds.config())
	file := filepath.Join(t.TempDir(), "mnspot.yaml")
	writeFile(t, file, fmt.Sprintf(multiNodeSpotYAML, 8080, infra, gpu))
	e.mustRun("serve", "up", file, "-y")

	var st serviceStatus
	var nodes []string
	eventually(t, 120*time.Second, "the gang READY", func() (bool, string) {
		var err error
		if st, err = e.status("mnspot"); err != nil {
			return false, err.Error()
		}
		ready := st.ready()
		for id := range ready {
			nodes = e.replicaNodes("mnspot")[id]
		}
		return len(ready) == 1 && len(nodes) == 2, fmt.Sprintf("%+v nodes %v", st.Replicas, nodes)
	})
	head, worker := clouds.vm(t, nodes[0]), clouds.vm(t, nodes[1])
	if head.state != "running" || worker.state != "running" || head.zone == "" || head.zone != worker.zone ||
		(infra == "aws" && (head.group == "" || head.group != worker.group)) {
		t.Fatalf("gang VMs: head %+v, worker %+v; want two running VMs in one zone (and placement group on EC2)", head, worker)
	}
	old := st.Replicas[0]
	if old.InstanceID != nodes[0] || head.ip == "" || !strings.HasPrefix(old.Endpoint, head.ip+":") {
		t.Fatalf("replica %s at %s, want its head %s at %s", old.InstanceID, old.Endpoint, nodes[0], head.ip)
	}
	chatPlain(t, st.Endpoint)

	clouds.preempt(t, nodes[1])
	eventually(t, 120*time.Second, "the preempted gang replaced whole", func() (bool, string) {
		var err error
		if st, err = e.status("mnspot"); err != nil {
			return false, err.Error()
		}
		oldStatus, newReady := "", false
		for _, r := range st.Replicas {
			if r.ID == old.ID {
				oldStatus = r.Status
			}
			newReady = newReady || (r.ID > old.ID && r.Status == "READY")
		}
		headState := clouds.vm(t, nodes[0]).state
		// The cloud's interruption warning for the worker may replace the replica first (it is
		// then retired and forgotten), or the listing finds the worker reclaimed (PREEMPTED).
		return newReady && (oldStatus == "PREEMPTED" || oldStatus == "") && headState != "running",
			fmt.Sprintf("replicas %+v, old head VM %q", st.Replicas, headState)
	})
	chatPlain(t, st.Endpoint)
}

// kubeMultiNodeYAML is one replica of two pods on the test cluster's H200 nodes, one GPU each.
// The cluster's kubelet stand-in runs `ferry replica-sim $REPLICA_SIM_ARGS` in every pod that is
// no job's.
const kubeMultiNodeYAML = `name: mnkube
resources:
  infra: kubernetes
  accelerators: H200:1
  ports: 8080
num_nodes: 2
envs:
  REPLICA_SIM_ARGS: --model ferry-sim-1b
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 120
  replicas: 1
run: ferry replica-sim --port $FERRY_PORT --model ferry-sim-1b
`

// TestMultiNodeReplicaOnKubernetes: on a real API server and scheduler a replica's gang is two
// pods created together, each told the gang's pod IPs (rank order) through its annotation; the
// head's pod serves; when the worker's pod is deleted, the whole replica is replaced by a new
// gang and the head's pod goes too.
func TestMultiNodeReplicaOnKubernetes(t *testing.T) {
	k := newKubeEnv(t, "NVIDIA-H200", 2, 2, 30)
	file := filepath.Join(t.TempDir(), "mnkube.yaml")
	writeFile(t, file, kubeMultiNodeYAML)
	k.mustRun("serve", "up", file, "-y")

	var st serviceStatus
	eventually(t, 120*time.Second, "the gang READY", func() (bool, string) {
		var err error
		if st, err = k.status("mnkube"); err != nil {
			return false, err.Error()
		}
		return len(st.ready()) == 1 && len(k.replicaNodes("mnkube")[st.Replicas[0].ID]) == 2, fmt.Sprintf("%+v", st.Replicas)
	})
	old := st.Replicas[0].ID
	byRank := map[string]corev1.Pod{}
	for _, p := range k.pods("mnkube") {
		if p.Labels["ferry.replica-id"] == strconv.Itoa(old) {
			byRank[p.Labels["ferry.node-rank"]] = p
		}
	}
	head, worker := byRank["0"], byRank["1"]
	ips := head.Status.PodIP + "\n" + worker.Status.PodIP
	if len(byRank) != 2 || head.Annotations["ferry.dev/node-ips"] != ips || worker.Annotations["ferry.dev/node-ips"] != ips {
		t.Fatalf("gang pods %v: want ranks 0 and 1, each told %q", byRank, ips)
	}
	if ep := st.Replicas[0].Endpoint; !strings.HasPrefix(ep, head.Status.PodIP+":") {
		t.Fatalf("replica at %s, want its head's pod %s", ep, head.Status.PodIP)
	}
	chatPlain(t, st.Endpoint)

	zero := int64(0)
	if err := k.cluster.Client().CoreV1().Pods(k.ns).Delete(context.Background(), worker.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 120*time.Second, "a new gang READY, the old head's pod gone", func() (bool, string) {
		var err error
		if st, err = k.status("mnkube"); err != nil {
			return false, err.Error()
		}
		oldPods := 0
		for _, p := range k.pods("mnkube") {
			if p.Labels["ferry.replica-id"] == strconv.Itoa(old) {
				oldPods++
			}
		}
		_, oldReady := st.ready()[old]
		return len(st.ready()) == 1 && !oldReady && oldPods == 0, fmt.Sprintf("%+v, %d pods of replica %d", st.Replicas, oldPods, old)
	})
	chatPlain(t, st.Endpoint)
}
