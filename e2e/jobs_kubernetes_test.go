package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// kubeJob is a 2-node train-sim job on the test cluster's A10Gs, one GPU per node.
const kubeJob = `name: %s
num_nodes: 2
resources:
  infra: kubernetes
  accelerators: A10G:1
job: {priority: 500, preemptible: %t, grace_period_seconds: 10}
run: |
  MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
  echo "rank $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES on $FERRY_HOST, master $MASTER_ADDR, gpus $SKYPILOT_NUM_GPUS_PER_NODE"
  ferry train-sim --master-addr=$MASTER_ADDR --master-port=8008 --steps=%d --step-time=50ms --checkpoint-every=5
`

// kubeService holds A10Gs in the cluster, bursting to AWS when the cluster has none.
const kubeService = `name: holder
resources:
  accelerators: A10G:1
  ordered:
    - infra: kubernetes
    - infra: aws
envs:
  REPLICA_SIM_ARGS: --model ferry-sim-1b
service:
  readiness_probe: /health
  replicas: %d
  ports: 8080
run: ferry replica-sim --port $FERRY_PORT --model ferry-sim-1b
`

// On the real API server and scheduler: jobs and services compete for one node's two A10Gs.
//
//  1. A 2-node job waits PENDING, saying why, while a service holds both GPUs, and starts when
//     the service goes; its ranks find each other by pod IP.
//  2. A service needing one GPU takes it from the preemptible job: Kubernetes preempts a job pod
//     (SIGTERM, grace), the job is RECOVERING until the service goes, then resumes from its
//     checkpoint on the claim and completes.
//  3. A non-preemptible job keeps its GPUs: the service's pod cannot be placed and the replica
//     bursts to AWS (the fake), while the job runs on.
func TestKubernetesJobsShareGPUsWithServices(t *testing.T) {
	k := newKubeEnv(t, "NVIDIA-A10G", 1, 2, 2)
	clouds := startFakeClouds(t)
	k.extraEnv = append(append([]string{}, awsEnv...), "FERRY_JOB_RETRY_INTERVAL=1s", "FERRY_JOB_WATCH_INTERVAL=200ms")
	cfg, err := os.ReadFile(filepath.Join(k.home, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(k.home, "config.yaml"), string(cfg)+clouds.config())
	dir := t.TempDir()
	svc := func(n int) string {
		f := filepath.Join(dir, fmt.Sprintf("holder-%d.yaml", n))
		writeFile(t, f, fmt.Sprintf(kubeService, n))
		return f
	}
	job := func(name string, preemptible bool, steps int) string {
		f := filepath.Join(dir, name+".yaml")
		writeFile(t, f, fmt.Sprintf(kubeJob, name, preemptible, steps))
		return f
	}

	// 1. Queued behind a service.
	k.mustRun("serve", "up", svc(2), "-y")
	id := k.launchDetached(job("train", true, 500))
	k.waitJob(id, time.Minute, "waits for capacity", func(j jobView) bool {
		return j.State == "PENDING" && j.Attempt > 0 && strings.Contains(j.Reason, "waiting for capacity")
	})
	k.mustRun("serve", "down", "holder", "-y")
	run := k.waitJob(id, 2*time.Minute, "starts once the service is gone", func(j jobView) bool { return j.State == "RUNNING" })
	if len(run.Nodes) != 2 || run.Nodes[0].IP == run.Nodes[1].IP {
		t.Fatalf("nodes %+v: want two pods with their own IPs", run.Nodes)
	}
	eventually(t, time.Minute, "training steps", func() (bool, string) {
		out, _, _ := k.run("jobs", "logs", strconv.FormatInt(id, 10))
		return strings.Contains(out, "step 30/500"), lastLines(out, 2)
	})
	rank1 := k.mustRun("jobs", "logs", strconv.FormatInt(id, 10), "--node", "1")
	if want := fmt.Sprintf("rank 1 of 2 on %s, master %s, gpus 1", run.Nodes[1].IP, run.Nodes[0].IP); !strings.Contains(rank1, want) {
		t.Errorf("rank 1's log lacks %q:\n%s", want, rank1)
	}

	// 2. Serving preempts the preemptible job.
	k.mustRun("serve", "up", svc(1), "-y")
	st, err := k.status("holder")
	if err != nil {
		t.Fatal(err)
	}
	if inf := st.Replicas[0].Infra; inf != "kubernetes/"+k.cluster.Context() {
		t.Fatalf("the service's replica went to %s: want the cluster, taken from the preemptible job", inf)
	}
	// serve logs reads the pod's output through the API server.
	if out := k.mustRun("serve", "logs", "holder", strconv.Itoa(st.Replicas[0].ID)); !strings.Contains(out, "ferry replica-sim: serving model") {
		t.Errorf("serve logs of a pod:\n%s", out)
	}
	rec := k.waitJob(id, time.Minute, "recovering, waiting for the GPU", func(j jobView) bool {
		return j.State == "RECOVERING" && len(j.Nodes) == 0 && strings.Contains(j.Reason, "waiting for capacity")
	})
	if len(rec.History) != 1 || !strings.Contains(rec.History[0].Reason, "preempted") {
		t.Errorf("recovery reason: %+v", rec.History)
	}
	k.mustRun("serve", "down", "holder", "-y")
	done := k.waitJob(id, 3*time.Minute, "completes", func(j jobView) bool { return j.State == "SUCCEEDED" && len(j.Nodes) == 0 })
	if done.Attempt < 2 || done.Recoveries != 1 || done.RestartsOnErrors != 0 || done.History[0].Lost <= 0 {
		t.Errorf("want one recovery with its lost time and no error restart: %+v", done)
	}
	if out := k.mustRun("jobs", "logs", strconv.FormatInt(id, 10)); !strings.Contains(out, "resuming from checkpoint at step") || !strings.Contains(out, "training done: 500 steps") {
		t.Errorf("the job did not resume from its checkpoint:\n%s", lastLines(out, 10))
	}

	// 3. A non-preemptible job keeps its GPUs; the service bursts to a cloud.
	keep := k.launchDetached(job("keep", false, 100000))
	k.waitJob(keep, 2*time.Minute, "runs", func(j jobView) bool { return j.State == "RUNNING" })
	k.mustRun("serve", "up", svc(1), "-y")
	st, err = k.status("holder")
	if err != nil {
		t.Fatal(err)
	}
	if inf := st.Replicas[0].Infra; inf != "aws" {
		t.Errorf("the service's replica is on %s: want AWS, the job keeping the cluster's GPUs", inf)
	}
	// serve logs reads the VM's console output.
	if out := k.mustRun("serve", "logs", "holder", strconv.Itoa(st.Replicas[0].ID)); !strings.Contains(out, "ferry replica-sim: serving model") {
		t.Errorf("serve logs of a VM:\n%s", out)
	}
	if j := k.job(keep); j.State != "RUNNING" || j.Attempt != 1 {
		t.Errorf("the non-preemptible job was disturbed: %+v", j)
	}
	capacity := k.mustRun("capacity")
	var jobRows, burstRows int
	for _, line := range strings.Split(capacity, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 3 && strings.HasPrefix(f[0], "kubernetes/") && strings.Contains(line, fmt.Sprintf("keep (%d)", keep)) && strings.Contains(line, " 500 "):
			jobRows++
		case len(f) > 3 && f[0] == "aws" && strings.Contains(line, "service") && strings.Contains(line, "holder"):
			burstRows++
		}
	}
	if jobRows != 2 || burstRows != 1 || !strings.Contains(capacity, "total: $") {
		t.Errorf("ferry capacity: want the job's 2 nodes in the cluster and the service's replica on aws:\n%s", capacity)
	}
	k.mustRun("jobs", "cancel", strconv.FormatInt(keep, 10), "-y")
	k.waitJob(keep, time.Minute, "cancelled", func(j jobView) bool { return j.State == "CANCELLED" && len(j.Nodes) == 0 })
}

// kubeB200Job is a 1-node train-sim job on the cluster's one B200.
const kubeB200Job = `name: %s
resources:
  infra: kubernetes
  accelerators: B200:1
job: {priority: %d, preemptible: %t, grace_period_seconds: 10}
run: ferry train-sim --master-port 8008 --steps=%d --step-time=50ms --checkpoint-every=5
`

// On the real API server and scheduler, a job preempts a job (Ferry's queue decides, as Kueue
// does; the scheduler never lets a job's pod preempt): a high-priority job that finds the one
// B200 taken has the low-priority preemptible job's pod deleted with its grace, runs, and the
// low job resumes from its checkpoint on the claim and completes.
func TestKubernetesJobPreemptsLowerPriorityJob(t *testing.T) {
	t.Parallel()
	k := newKubeEnv(t, "NVIDIA-B200", 1, 1, 2)
	k.extraEnv = append(k.extraEnv, "FERRY_JOB_RETRY_INTERVAL=1s", "FERRY_JOB_WATCH_INTERVAL=200ms")
	defer k.stopJobs()
	job := jobFiles(t, kubeB200Job)
	low := k.launchDetached(job("low", 100, true, 400))
	k.waitJob(low, 2*time.Minute, "runs", func(j jobView) bool { return j.State == "RUNNING" })
	eventually(t, time.Minute, "the low job trains", func() (bool, string) {
		out, _, _ := k.run("jobs", "logs", strconv.FormatInt(low, 10))
		return strings.Contains(out, "step 20/400"), lastLines(out, 2)
	})
	high := k.launchDetached(job("high", 900, false, 40))
	rec := k.waitJob(low, 2*time.Minute, "preempted for the high job", func(j jobView) bool { return j.State == "RECOVERING" })
	if want := fmt.Sprintf("preempted for job %d (high, priority 900)", high); len(rec.History) != 1 || !strings.Contains(rec.History[0].Reason, want) {
		t.Errorf("the low job's recovery: %+v, want %q", rec.History, want)
	}
	k.waitJob(high, 2*time.Minute, "the high job completes", func(j jobView) bool { return j.State == "SUCCEEDED" })
	done := k.waitJob(low, 3*time.Minute, "the low job completes", func(j jobView) bool { return j.State == "SUCCEEDED" && len(j.Nodes) == 0 })
	if done.Recoveries != 1 || done.RestartsOnErrors != 0 {
		t.Errorf("want one recovery and no error restart: %+v", done)
	}
	if out := k.mustRun("jobs", "logs", strconv.FormatInt(low, 10)); !strings.Contains(out, "resuming from checkpoint at step") || !strings.Contains(out, "training done: 400 steps") {
		t.Errorf("the low job did not resume from its checkpoint:\n%s", lastLines(out, 10))
	}
}
