package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// jobView is what `ferry jobs queue --json` says of a job, as far as these tests read it.
type jobView struct {
	ID               int64   `json:"id"`
	Name             string  `json:"name"`
	State            string  `json:"state"`
	Reason           string  `json:"reason"`
	Attempt          int     `json:"attempt"`
	Recoveries       int     `json:"recoveries"`
	RestartsOnErrors int     `json:"restarts_on_errors"`
	ExitCodes        []int   `json:"exit_codes"`
	RunningSeconds   float64 `json:"running_seconds"`
	Nodes            []struct {
		Rank       int    `json:"rank"`
		InstanceID string `json:"instance_id"`
		IP         string `json:"ip"`
	} `json:"nodes"`
	History []struct {
		Reason string `json:"reason"`
		Lost   int64  `json:"lost"`
	} `json:"history"`
}

// jobs lists every job.
func (e *env) jobs() []jobView {
	e.t.Helper()
	var list []jobView
	if err := json.Unmarshal([]byte(e.mustRun("jobs", "queue", "--all", "--json")), &list); err != nil {
		e.t.Fatal(err)
	}
	return list
}

func (e *env) job(id int64) jobView {
	e.t.Helper()
	for _, j := range e.jobs() {
		if j.ID == id {
			return j
		}
	}
	e.t.Fatalf("no job %d", id)
	return jobView{}
}

// waitJob polls job id until cond holds.
func (e *env) waitJob(id int64, timeout time.Duration, what string, cond func(jobView) bool) jobView {
	e.t.Helper()
	var j jobView
	eventually(e.t, timeout, what, func() (bool, string) {
		j = e.job(id)
		return cond(j), fmt.Sprintf("%s attempt %d: %s", j.State, j.Attempt, j.Reason)
	})
	return j
}

// stopJobs cancels every unfinished job and waits for their nodes to stop, so that no job's
// process outlives a test.
func (e *env) stopJobs() {
	if _, _, err := e.run("jobs", "cancel", "-a", "-y"); err != nil {
		return
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		out, _, err := e.run("jobs", "queue", "--json")
		if err != nil || !strings.Contains(out, `"CANCELLING"`) && !strings.Contains(out, `"instance_id"`) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// launchDetached queues a job and returns its id.
func (e *env) launchDetached(args ...string) int64 {
	e.t.Helper()
	out := e.mustRun(append([]string{"jobs", "launch", "-y", "-d"}, args...)...)
	_, after, ok := strings.Cut(out, "queued. ID: ")
	if !ok {
		e.t.Fatalf("no job id in:\n%s", out)
	}
	id, err := strconv.ParseInt(strings.Fields(after)[0], 10, 64)
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

// docs/jobs.md's 2-node example, as written: the ranks rendezvous over TCP on their own loopback
// addresses, with SkyPilot's variables; `jobs launch` streams rank 0 and exits 0.
func TestJobTorchrunExample(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	out := e.mustRun("jobs", "launch", "configs/examples/train-torchrun.yaml", "-y", "--env", "STEPS=40")
	for _, want := range []string{"rank 0 of 2; master 127.", "rank 0: rank 1 joined", "training done: 40 steps on 2 node(s)",
		"Managed job 1 finished (status: SUCCEEDED)"} {
		if !strings.Contains(out, want) {
			t.Errorf("jobs launch output lacks %q:\n%s", want, out)
		}
	}
	j := e.job(1)
	if j.State != "SUCCEEDED" || fmt.Sprint(j.ExitCodes) != "[0 0]" || j.Attempt != 1 {
		t.Errorf("job: %+v", j)
	}
	master := out[strings.Index(out, "rank 0 of 2; master ")+len("rank 0 of 2; master "):]
	master, _, _ = strings.Cut(master, ";")
	rank1 := e.mustRun("jobs", "logs", "train-torchrun", "--node", "1")
	if !strings.Contains(rank1, "rank 1 of 2; master "+master+";") || !strings.Contains(rank1, "rank 1: joined "+master+":8008") {
		t.Errorf("rank 1 did not find rank 0 at %s:\n%s", master, rank1)
	}
	if !strings.Contains(rank1, "task sky-managed-") || !strings.Contains(rank1, "_train-torchrun_1-0") || !strings.Contains(rank1, "setup on node 1 of 2") ||
		!strings.Contains(rank1, `cluster {"cluster_name":"train-torchrun-1","cloud":"Local","region":null,"zone":null}`) {
		t.Errorf("rank 1 lacks its SkyPilot variables (SKYPILOT_TASK_ID and SKYPILOT_CLUSTER_INFO in SkyPilot's form):\n%s", rank1)
	}

	// A failing job: jobs launch exits with the program's status, and says why.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("name: bad\nrun: |\n  echo working\n  exit 7\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, _, err := e.run("jobs", "launch", bad, "-y")
	var exit *exec.ExitError
	if !asExit(err, &exit) || exit.ExitCode() != 7 || !strings.Contains(stdout, "status: FAILED): node 0 exited with status 7") {
		t.Errorf("failing job: %v\n%s", err, stdout)
	}
}

func asExit(err error, target **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	if ok {
		*target = e
	}
	return ok
}

// recoveringJob is a 2-node train-sim job whose nodes take 3 s to stop on SIGTERM, and whose
// failed rank lingers as a real one tearing down would, so that a test can catch the job
// between its verdict and its relaunch.
const recoveringJob = `name: long
num_nodes: 2
job: {grace_period_seconds: 20}
run: |
  MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
  ferry train-sim --master-addr=$MASTER_ADDR --master-port=8008 --steps=%d --step-time=50ms \
    --checkpoint-dir="$FERRY_CHECKPOINT_DIR" --checkpoint-every=5 &
  pid=$!
  trap 'kill -TERM $pid 2>/dev/null; sleep 3; exit 143' TERM
  wait $pid
  rc=$?
  if [ $rc != 0 ]; then sleep 30 & wait $!; fi
  exit $rc
`

// kill -9 of the controller while a job runs, and again while it recovers: the job runs on,
// is recovered once, resumes from its checkpoint, succeeds; no node runs twice.
func TestJobSurvivesControllerKills(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.extraEnv = append(e.extraEnv, "FERRY_JOB_WATCH_INTERVAL=100ms")
	yaml := filepath.Join(t.TempDir(), "long.yaml")
	if err := os.WriteFile(yaml, []byte(fmt.Sprintf(recoveringJob, 300)), 0o600); err != nil {
		t.Fatal(err)
	}
	id := e.launchDetached(yaml)
	j := e.waitJob(id, time.Minute, "runs", func(j jobView) bool { return j.State == "RUNNING" })

	// 1. Killed while the job runs: the next controller adopts the same gang.
	killController(t, e)
	e.mustRun("controller", "status") // starts a new controller
	adopted := e.waitJob(id, time.Minute, "adopted", func(j jobView) bool { return j.State == "RUNNING" })
	if adopted.Attempt != 1 || adopted.Nodes[0].InstanceID != j.Nodes[0].InstanceID {
		t.Fatalf("the restart relaunched the job: %+v, was %+v", adopted, j)
	}

	// 2. A node lost, and the controller killed while the job recovers.
	time.Sleep(time.Second) // some steps, a checkpoint
	killNode(t, e, adopted.Nodes[1].InstanceID)
	e.waitJob(id, time.Minute, "recovers", func(j jobView) bool { return j.State == "RECOVERING" })
	killController(t, e)
	e.mustRun("controller", "status")

	done := e.waitJob(id, 2*time.Minute, "succeeds", func(j jobView) bool { return j.State == "SUCCEEDED" && len(j.Nodes) == 0 })
	if done.Attempt != 2 || done.Recoveries != 1 || len(done.History) != 1 || done.History[0].Lost <= 0 {
		t.Errorf("want one recovery with its lost time: %+v", done)
	}
	if ctl, _ := os.ReadFile(filepath.Join(e.home, "controller.log")); !strings.Contains(string(ctl), "stopping the nodes of an ended gang") {
		t.Errorf("the second restart did not find the job mid-recovery (its nodes being stopped)")
	}
	log := e.mustRun("jobs", "logs", strconv.FormatInt(id, 10))
	if !strings.Contains(log, "resuming from checkpoint at step") || !strings.Contains(log, "training done: 300 steps") {
		t.Errorf("the recovered gang did not resume from its checkpoint:\n%s", lastLines(log, 20))
	}
}

func killController(t *testing.T, e *env) {
	t.Helper()
	pid := e.controllerPID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "controller gone", func() (bool, string) { return !alive(pid), "" })
}

// killNode SIGKILLs a local instance's process group, as a lost machine.
func killNode(t *testing.T, e *env, instanceID string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.home, "local", instanceID, "instance.json"))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		PGID int `json:"pgid"`
	}
	if err := json.Unmarshal(b, &meta); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(-meta.PGID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// Cancel in each state: a running job's nodes stop; a cancelled job cannot be cancelled again.
func TestJobCancel(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	yaml := filepath.Join(t.TempDir(), "sleep.yaml")
	if err := os.WriteFile(yaml, []byte("name: sleeper\nnum_nodes: 2\nrun: exec sleep 600\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	id := e.launchDetached(yaml)
	j := e.waitJob(id, time.Minute, "runs", func(j jobView) bool { return j.State == "RUNNING" })
	out := e.mustRun("jobs", "cancel", "sleeper", "-y")
	if !strings.Contains(out, "CANCELLING") && !strings.Contains(out, "CANCELLED") {
		t.Errorf("cancel said %q", out)
	}
	e.waitJob(id, time.Minute, "cancelled", func(j jobView) bool { return j.State == "CANCELLED" && len(j.Nodes) == 0 })
	for _, n := range j.Nodes {
		if _, err := os.Stat(filepath.Join(e.home, "local", n.InstanceID)); !os.IsNotExist(err) {
			t.Errorf("node %s still there after cancel", n.InstanceID)
		}
	}
	if _, stderr, err := e.run("jobs", "cancel", strconv.FormatInt(id, 10), "-y"); err == nil || !strings.Contains(stderr, "CANCELLED") {
		t.Errorf("cancelling a cancelled job: %v %s", err, stderr)
	}
}

// The batch-inference example sends a file of prompts through a service endpoint.
func TestJobBatchInferenceThroughService(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.mustRun("serve", "up", "configs/examples/quickstart.yaml", "-y")
	endpoint := strings.TrimSpace(e.mustRun("serve", "status", "quickstart", "--endpoint"))
	prompts := filepath.Join(t.TempDir(), "prompts.txt")
	var b strings.Builder
	for i := range 25 {
		fmt.Fprintf(&b, "Tell me fact number %d.\n", i)
	}
	if err := os.WriteFile(prompts, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	out := e.mustRun("jobs", "launch", "configs/examples/batch-inference.yaml", "-y", "--env", "ENDPOINT="+endpoint, "--env", "PROMPTS="+prompts)
	if !strings.Contains(out, "25 to send") || !strings.Contains(out, "25/25 answered (0 errors)") || strings.Count(out, `"completion":`) != 25 {
		t.Errorf("batch output:\n%s", out)
	}
}

// spotJob is a 2-node spot training job on AWS, recovering to another zone on preemption.
const spotJob = `name: spot-train
num_nodes: 2
resources:
  infra: aws
  accelerators: T4:1
  use_spot: true
  job_recovery: EAGER_NEXT_REGION
run: |
  MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
  echo "gpus $SKYPILOT_NUM_GPUS_PER_NODE"
  ferry train-sim --master-addr=$MASTER_ADDR --master-port=8008 --steps=300 --step-time=50ms --checkpoint-every=5
`

// On the fake clouds, through the real AWS SDK: a 2-node spot gang in one zone; one node gets
// EC2's interruption warning mid-run; the job recovers the whole gang in another zone, resumes
// from the checkpoint on the region's shared filesystem, reports the time lost and succeeds.
func TestJobSpotPreemptionRecoversInAnotherZone(t *testing.T) {
	t.Parallel()
	clouds := startFakeClouds(t)
	e := newEnv(t)
	e.extraEnv = append(append([]string{}, awsEnv...), "FERRY_JOB_WATCH_INTERVAL=200ms")
	cfg := strings.Replace(clouds.config(), "  amis: {us-east-1: ami-0fe771}\n",
		"  amis: {us-east-1: ami-0fe771}\n  checkpoint_nfs: fs-0123456789abcdef0.efs.us-east-1.amazonaws.com:/\n", 1)
	writeFile(t, filepath.Join(e.home, "config.yaml"), cfg)
	file := filepath.Join(t.TempDir(), "spot.yaml")
	writeFile(t, file, spotJob)

	id := e.launchDetached(file)
	j := e.waitJob(id, 2*time.Minute, "runs", func(j jobView) bool { return j.State == "RUNNING" })
	first := e.jobZones(id)
	if len(first) != 1 {
		t.Fatalf("the gang spans zones %v: want one", first)
	}
	eventually(t, time.Minute, "a checkpoint", func() (bool, string) {
		log, _, _ := e.run("jobs", "logs", strconv.FormatInt(id, 10))
		return strings.Contains(log, "step 30/300"), lastLines(log, 2)
	})
	// EC2's interruption warning for rank 1's VM, reclaimed a minute later.
	victim := j.Nodes[1].InstanceID
	if err := clouds.ec2.PreemptWithNotice(victim[strings.LastIndex(victim, "/")+1:], time.Minute); err != nil {
		t.Fatal(err)
	}
	rec := e.waitJob(id, 2*time.Minute, "recovered", func(j jobView) bool { return j.State == "RUNNING" && j.Attempt == 2 })
	if rec.Recoveries != 1 || rec.RestartsOnErrors != 0 {
		t.Errorf("want one recovery and no error restart: %+v", rec)
	}
	second := e.jobZones(id)
	for z := range second {
		if first[z] {
			t.Errorf("recovered in the zone it was preempted in (%s)", z)
		}
	}
	done := e.waitJob(id, 3*time.Minute, "succeeds", func(j jobView) bool { return j.State == "SUCCEEDED" && len(j.Nodes) == 0 })
	if len(done.History) != 1 || done.History[0].Lost <= 0 || !strings.Contains(done.History[0].Reason, "preemption") {
		t.Errorf("recovery not reported with its lost time: %+v", done.History)
	}
	log := e.mustRun("jobs", "logs", strconv.FormatInt(id, 10))
	if !strings.Contains(log, "resuming from checkpoint at step") || !strings.Contains(log, "training done: 300 steps") || !strings.Contains(log, "gpus 1") {
		t.Errorf("the recovered gang did not resume from its checkpoint:\n%s", lastLines(log, 20))
	}
	queue := e.mustRun("jobs", "queue")
	if !strings.Contains(queue, "lost ") || !strings.Contains(queue, "to 1 recovery") {
		t.Errorf("queue does not show the time lost:\n%s", queue)
	}
}

// jobZones are the zones the job's current nodes run in, from ferry capacity.
func (e *env) jobZones(id int64) map[string]bool {
	e.t.Helper()
	var list []struct {
		Kind, Owner, Zone, Infra string
	}
	if err := json.Unmarshal([]byte(e.mustRun("capacity", "--json")), &list); err != nil {
		e.t.Fatal(err)
	}
	zones := map[string]bool{}
	for _, h := range list {
		if h.Kind == "job" && strings.HasSuffix(h.Owner, fmt.Sprintf("(%d)", id)) {
			zones[h.Infra+"/"+h.Zone] = true
		}
	}
	return zones
}
