package kubernetes

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher"
)

// These tests run jobs' pods for real: the kubelet stand-in (internal/testcluster) runs each
// job pod's command on the host, on the pod's loopback IP, and reports its exit in the pod's
// status, as a kubelet would. Programs that need more than bash call this test binary back
// (helperEnv). Each test makes its provider before it starts the stand-in: New routes klog,
// once per process, and the stand-in's informers must not be logging through it meanwhile.

// helperEnv, set in a process started from this test binary, makes it a small network program
// instead of running tests: "listen ADDR" accepts one connection, prints the line it reads and
// answers "welcome"; "connect ADDR" dials from $FERRY_HOST until it gets through, says hello
// and prints the answer.
const helperEnv = "FERRY_K8S_TEST_HELPER"

func runHelper(mode string, args []string) {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "helper: want one address")
		os.Exit(2)
	}
	addr := args[0]
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(1)
	}
	deadline := time.Now().Add(60 * time.Second)
	var conn net.Conn
	switch mode {
	case "listen":
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			fail(err)
		}
		fmt.Println("listening on", ln.Addr())
		_ = ln.(*net.TCPListener).SetDeadline(deadline)
		if conn, err = ln.Accept(); err != nil {
			fail(err)
		}
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			fail(err)
		}
		fmt.Printf("got %q from %s\n", strings.TrimSpace(line), conn.RemoteAddr().(*net.TCPAddr).IP)
		_, _ = conn.Write([]byte("welcome\n"))
	case "connect":
		// From the pod's own address: on the stand-in every pod shares the host's network.
		dialer := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(os.Getenv("FERRY_HOST"))}}
		var err error
		for conn, err = dialer.Dial("tcp", addr); err != nil; conn, err = dialer.Dial("tcp", addr) {
			if time.Now().After(deadline) {
				fail(err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_, _ = conn.Write([]byte("hello from rank 1\n"))
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			fail(err)
		}
		fmt.Printf("reply %q\n", strings.TrimSpace(line))
	default:
		fail(fmt.Errorf("unknown mode %q", mode))
	}
	_ = conn.Close()
	os.Exit(0)
}

// jobSpec is a job node running run on one GPU of product gpu, preemptible, with a 10-second
// grace and a checkpoint claim named after the job.
func jobSpec(t *testing.T, job, gpu, run string) launcher.Spec {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return launcher.Spec{
		Name:       job,
		Labels:     map[string]string{launcher.LabelOwner: "true", launcher.LabelJob: job, launcher.LabelAttempt: "1"},
		Run:        run,
		Envs:       map[string]string{"HELPER": self, "JOB_TOKEN": "s3cret"},
		SecretEnvs: []string{"JOB_TOKEN"},
		Resources:  configs.Resources{Infra: "kubernetes", Accelerators: []configs.Accelerator{{Name: gpu, Count: 1}}},
		Job: &launcher.JobSpec{
			Priority: launcher.DefaultJobPriority, Preemptible: true, Grace: 10 * time.Second,
			CheckpointDir: "/ckpt", CheckpointClaim: job + "-ckpt",
		},
	}
}

// waitEnded waits until every instance of the job has ended, and returns them by rank.
func waitEnded(t *testing.T, p *Provider, job string, n int) []launcher.Instance {
	t.Helper()
	var got []launcher.Instance
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var err error
		got, err = p.List(context.Background(), map[string]string{launcher.LabelJob: job})
		if err == nil && len(got) == n && !slices.ContainsFunc(got, func(i launcher.Instance) bool {
			return i.State == launcher.StatePending || i.State == launcher.StateRunning
		}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s did not end: %+v, %v", job, got, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	slices.SortFunc(got, func(a, b launcher.Instance) int {
		return strings.Compare(a.Labels[launcher.LabelNodeRank], b.Labels[launcher.LabelNodeRank])
	})
	return got
}

// logOf reads an instance's whole log through the API server.
func logOf(t *testing.T, p *Provider, id string) string {
	t.Helper()
	var b bytes.Buffer
	if err := p.StreamLogs(context.Background(), id, launcher.LogOptions{Tail: -1}, &b); err != nil {
		t.Fatalf("StreamLogs(%s): %v", id, err)
	}
	return b.String()
}

func exitOf(inst launcher.Instance) string {
	if code, ok := inst.Exited(); ok {
		return fmt.Sprint(code)
	}
	return "none"
}

// TestJobGangTalksOverTCP is a 2-node gang on two nodes: each pod learns the gang's addresses
// (rank 0 first) from the downward API once both run, rank 0 listens on its own IP and rank 1
// connects to it, and both exit 0, which List reports as their exit codes.
func TestJobGangTalksOverTCP(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	for _, node := range []string{"jg-l4-0", "jg-l4-1"} {
		if err := c.AddGPUNode(ctx, node, "NVIDIA-L4", 1); err != nil {
			t.Fatal(err)
		}
	}
	p := newProvider(t, c, Options{})
	testcluster.StartKubelet(t, c, testcluster.KubeletOptions{})

	spec := jobSpec(t, "train", "L4", `
ips=$(echo "$SKYPILOT_NODE_IPS" | tr '\n' ' ')
echo "rank $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES on $FERRY_HOST; nodes: $ips; setup saw $SKYPILOT_SETUP_NODE_IPS_COPY"
echo "token $JOB_TOKEN"
master=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
if [ "$SKYPILOT_NODE_RANK" = 0 ]; then
  [ "$master" = "$FERRY_HOST" ] || { echo "rank 0 is not listed first"; exit 3; }
  FERRY_K8S_TEST_HELPER=listen "$HELPER" "$master:29500"
else
  FERRY_K8S_TEST_HELPER=connect "$HELPER" "$master:29500"
fi
`)
	spec.Setup = `export SKYPILOT_SETUP_NODE_IPS_COPY=$(echo "$SKYPILOT_SETUP_NODE_IPS" | wc -l)`
	insts, err := launcher.LaunchGang(ctx, p, spec, 2)
	if err != nil {
		t.Fatal(err)
	}
	_, cidr, _ := net.ParseCIDR(c.CIDR())
	for rank, inst := range insts {
		if !cidr.Contains(net.ParseIP(inst.IP)) || inst.Labels[launcher.LabelNodeRank] != fmt.Sprint(rank) {
			t.Errorf("rank %d: %+v, want a pod IP in %s and its rank label", rank, inst, c.CIDR())
		}
	}
	if insts[0].IP == insts[1].IP {
		t.Fatalf("both nodes have IP %s", insts[0].IP)
	}
	pod, err := c.Client().CoreV1().Pods(p.Namespace()).Get(ctx, insts[1].Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := pod.Annotations[AnnotationNodeIPs], insts[0].IP+"\n"+insts[1].IP; got != want {
		t.Errorf("annotation %s = %q, want %q", AnnotationNodeIPs, got, want)
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever || pod.Spec.PriorityClassName != "ferry-job-500" ||
		pod.Spec.TerminationGracePeriodSeconds == nil || *pod.Spec.TerminationGracePeriodSeconds != 10 {
		t.Errorf("pod spec: restart %s, class %q, grace %v; want Never, ferry-job-500, 10", pod.Spec.RestartPolicy, pod.Spec.PriorityClassName, pod.Spec.TerminationGracePeriodSeconds)
	}
	pc, err := c.Client().SchedulingV1().PriorityClasses().Get(ctx, "ferry-job-500", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pc.Value != 500 || pc.PreemptionPolicy == nil || *pc.PreemptionPolicy != corev1.PreemptNever {
		t.Errorf("priority class %s: value %d, policy %v; want 500, Never", pc.Name, pc.Value, pc.PreemptionPolicy)
	}

	ended := waitEnded(t, p, "train", 2)
	logs := []string{logOf(t, p, ended[0].ID), logOf(t, p, ended[1].ID)}
	for rank, inst := range ended {
		if code, ok := inst.Exited(); !ok || code != 0 || inst.State != launcher.StateTerminated {
			t.Errorf("rank %d: state %s, exit %s (%s); want TERMINATED with 0\nlog:\n%s", rank, inst.State, exitOf(inst), inst.Reason, logs[rank])
		}
		want := fmt.Sprintf("rank %d of 2 on %s; nodes: %s %s ; setup saw 2", rank, insts[rank].IP, insts[0].IP, insts[1].IP)
		if !strings.Contains(logs[rank], want) || !strings.Contains(logs[rank], "token s3cret") {
			t.Errorf("rank %d log lacks %q and the secret:\n%s", rank, want, logs[rank])
		}
	}
	if want := fmt.Sprintf("got \"hello from rank 1\" from %s", insts[1].IP); !strings.Contains(logs[0], want) {
		t.Errorf("rank 0 log lacks %q:\n%s", want, logs[0])
	}
	if !strings.Contains(logs[1], `reply "welcome"`) {
		t.Errorf("rank 1 log lacks the reply:\n%s", logs[1])
	}
}

// TestJobExitCodes: a failing node reports its own exit code, the others theirs, and a failing
// setup reports launcher.ExitSetupFailed with the setup's status in the log.
func TestJobExitCodes(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "je-p4-0", "Tesla-P4", 4); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, c, Options{})
	testcluster.StartKubelet(t, c, testcluster.KubeletOptions{})

	if _, err := launcher.LaunchGang(ctx, p, jobSpec(t, "fails", "P4", `[ "$SKYPILOT_NODE_RANK" = 1 ] && exit 7; exit 0`), 2); err != nil {
		t.Fatal(err)
	}
	setup := jobSpec(t, "badsetup", "P4", "echo the run never starts")
	setup.Setup = "echo setting up; exit 4"
	if _, err := launcher.LaunchGang(ctx, p, setup, 1); err != nil {
		t.Fatal(err)
	}

	got := map[string]string{}
	for _, inst := range waitEnded(t, p, "fails", 2) {
		got["fails/"+inst.Labels[launcher.LabelNodeRank]] = string(inst.State) + " " + exitOf(inst)
	}
	bad := waitEnded(t, p, "badsetup", 1)
	got["badsetup/0"] = string(bad[0].State) + " " + exitOf(bad[0])
	want := map[string]string{
		"fails/0":    "TERMINATED 0",
		"fails/1":    "TERMINATED 7",
		"badsetup/0": fmt.Sprintf("TERMINATED %d", launcher.ExitSetupFailed),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("states and exit codes (-want +got):\n%s", diff)
	}
	if log := logOf(t, p, bad[0].ID); !strings.Contains(log, "setup failed with exit status 4") || strings.Contains(log, "never starts") {
		t.Errorf("setup failure log:\n%s", log)
	}
}

// TestPreemptibleJobYieldsToService: a service's pod that needs the GPU a preemptible job
// holds makes the scheduler preempt the job's pod; the program gets SIGTERM and its grace
// period, and what it writes then lands in the checkpoint claim; the job reads as preempted,
// without an exit code.
func TestPreemptibleJobYieldsToService(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "jp-a10-0", "NVIDIA-A10", 1); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, c, Options{ProvisionTimeout: time.Minute})
	kubelet := testcluster.StartKubelet(t, c, testcluster.KubeletOptions{})

	spec := jobSpec(t, "yields", "A10", `
trap 'sleep 1; echo "saved at step $step" > "$FERRY_CHECKPOINT_DIR/ckpt"; echo "checkpointed on SIGTERM"; exit 0' TERM
step=0
echo "started with grace $FERRY_PREEMPTION_GRACE_SECONDS"
while true; do step=$((step+1)); sleep 0.1; done
`)
	insts, err := launcher.LaunchGang(ctx, p, spec, 1)
	if err != nil {
		t.Fatal(err)
	}
	waitLog(t, kubelet, p.Namespace(), insts[0].Name, "started with grace 10")

	svc, err := p.Launch(ctx, gpuSpec("svc-1", "A10", 1))
	if err != nil {
		t.Fatalf("the service's pod was not placed by preempting the job: %v", err)
	}
	pod, err := c.Client().CoreV1().Pods(p.Namespace()).Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.PriorityClassName != ServingPriorityClass || pod.Spec.Priority == nil || *pod.Spec.Priority != launcher.ServingPriority {
		t.Errorf("service pod: class %q priority %v, want %s at %d", pod.Spec.PriorityClassName, pod.Spec.Priority, ServingPriorityClass, launcher.ServingPriority)
	}

	var job launcher.Instance
	eventually(t, "the job reads as preempted", func() bool {
		got, err := p.List(ctx, map[string]string{launcher.LabelJob: "yields"})
		if err != nil || len(got) != 1 {
			return false
		}
		job = got[0]
		return job.State == launcher.StatePreempted
	})
	if job.ExitCode != nil || !strings.Contains(job.Reason, "PreemptionByScheduler") {
		t.Errorf("preempted job: exit %s, reason %q; want no exit code, the scheduler's reason", exitOf(job), job.Reason)
	}
	dir, err := kubelet.ClaimDir(p.Namespace(), "yields-ckpt")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the program checkpoints within its grace", func() bool {
		data, err := os.ReadFile(filepath.Join(dir, "ckpt"))
		return err == nil && strings.HasPrefix(string(data), "saved at step ")
	})
	waitLog(t, kubelet, p.Namespace(), insts[0].Name, "checkpointed on SIGTERM")

	// Terminate forgets it.
	if err := p.Terminate(ctx, job.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := p.List(ctx, map[string]string{launcher.LabelJob: "yields"}); err != nil || len(got) != 0 {
		t.Errorf("after Terminate: %+v, %v; want nothing", got, err)
	}
}

// TestNonPreemptibleJobKeepsItsGPU: a job that is not preemptible runs at serving priority, so
// the service's pod stays unschedulable and its launch fails with ErrNoCapacity (the service
// bursts elsewhere), while the job runs on.
func TestNonPreemptibleJobKeepsItsGPU(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "jn-l40-0", "NVIDIA-L40", 1); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, c, Options{ProvisionTimeout: 3 * time.Second})
	kubelet := testcluster.StartKubelet(t, c, testcluster.KubeletOptions{})

	spec := jobSpec(t, "keeps", "L40", `echo running; while true; do sleep 0.1; done`)
	spec.Job.Preemptible = false
	insts, err := launcher.LaunchGang(ctx, p, spec, 1)
	if err != nil {
		t.Fatal(err)
	}
	waitLog(t, kubelet, p.Namespace(), insts[0].Name, "running")
	pod, err := c.Client().CoreV1().Pods(p.Namespace()).Get(ctx, insts[0].Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.PriorityClassName != "ferry-job-1000" || *pod.Spec.Priority != launcher.ServingPriority {
		t.Errorf("non-preemptible job pod: class %q priority %d, want ferry-job-1000 at %d", pod.Spec.PriorityClassName, *pod.Spec.Priority, launcher.ServingPriority)
	}

	_, err = p.Launch(ctx, gpuSpec("svc-1", "L40", 1))
	if !errors.Is(err, launcher.ErrNoCapacity) || !strings.Contains(err.Error(), "Insufficient nvidia.com/gpu") {
		t.Fatalf("service launch next to a non-preemptible job: %v, want ErrNoCapacity", err)
	}
	got, err := p.List(ctx, map[string]string{launcher.LabelJob: "keeps"})
	if err != nil || len(got) != 1 || got[0].State != launcher.StateRunning {
		t.Fatalf("the job after the service's attempt: %+v, %v; want it running", got, err)
	}
	if !slices.Contains(kubelet.Running(), p.Namespace()+"/"+insts[0].Name) {
		t.Errorf("the job's process is not running: %v", kubelet.Running())
	}
}

// TestJobLogsAndCheckpoint: StreamLogs follows a running job to its end and tails an ended one;
// a second gang of the same job finds what the first left in its checkpoint claim; CleanupJob
// deletes the claim.
func TestJobLogsAndCheckpoint(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "jl-v100-0", "Tesla-V100-SXM2-32GB", 4); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, c, Options{})
	kubelet := testcluster.StartKubelet(t, c, testcluster.KubeletOptions{})

	run := `
echo "previous: $(cat "$FERRY_CHECKPOINT_DIR/state" 2>/dev/null || echo none)"
echo "attempt $ATTEMPT" > "$FERRY_CHECKPOINT_DIR/state"
for i in $(seq 1 20); do echo "line $i"; sleep 0.05; done
echo done
`
	launch := func(attempt string) launcher.Instance {
		spec := jobSpec(t, "logs", "V100-32GB", run)
		spec.Labels[launcher.LabelAttempt] = attempt
		spec.Envs["ATTEMPT"] = attempt
		insts, err := launcher.LaunchGang(ctx, p, spec, 1)
		if err != nil {
			t.Fatal(err)
		}
		return insts[0]
	}

	first := launch("1")
	var followed bytes.Buffer
	followCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	opened := 0
	if err := p.StreamLogs(followCtx, first.ID, launcher.LogOptions{Tail: -1, Follow: true, Opened: func() { opened++ }}, &followed); err != nil {
		t.Fatal(err)
	}
	if followCtx.Err() != nil {
		t.Fatal("the follow did not end with the job")
	}
	if opened != 1 {
		t.Errorf("Opened was called %d times: want once, as the stream opened", opened)
	}
	if got := followed.String(); !strings.Contains(got, "previous: none\n") || !strings.HasSuffix(got, "line 20\ndone\n") {
		t.Errorf("followed log:\n%s\nwant it whole, from a fresh checkpoint to done", got)
	}
	ended := waitEnded(t, p, "logs", 1)
	if code, ok := ended[0].Exited(); !ok || code != 0 {
		t.Errorf("first attempt: %+v", ended[0])
	}
	var tail bytes.Buffer
	if err := p.StreamLogs(ctx, first.ID, launcher.LogOptions{Tail: 2}, &tail); err != nil {
		t.Fatal(err)
	}
	if tail.String() != "line 20\ndone\n" {
		t.Errorf("tail 2 = %q", tail.String())
	}
	if err := p.Terminate(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	var gone bytes.Buffer
	eventually(t, "the first pod's log is gone with it", func() bool {
		return errors.Is(p.StreamLogs(ctx, first.ID, launcher.LogOptions{Tail: -1}, &gone), launcher.ErrNotFound)
	})

	second := launch("2")
	waitLog(t, kubelet, p.Namespace(), second.Name, "done")
	if got := logOf(t, p, second.ID); !strings.Contains(got, "previous: attempt 1\n") {
		t.Errorf("second attempt's log:\n%s\nwant the first attempt's checkpoint", got)
	}
	dir, err := kubelet.ClaimDir(p.Namespace(), "logs-ckpt")
	if err != nil {
		t.Fatal(err)
	}
	waitEnded(t, p, "logs", 1)
	if err := p.Terminate(ctx, second.ID); err != nil {
		t.Fatal(err)
	}

	if err := p.CleanupJob(ctx, "logs"); err != nil {
		t.Fatal(err)
	}
	if err := p.CleanupJob(ctx, "logs"); err != nil {
		t.Errorf("second CleanupJob: %v, want nil", err)
	}
	if _, err := c.Client().CoreV1().PersistentVolumeClaims(p.Namespace()).Get(ctx, "logs-ckpt", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("checkpoint claim after CleanupJob: %v, want it deleted", err)
	}
	if _, err := c.Client().NetworkingV1().NetworkPolicies(p.Namespace()).Get(ctx, jobPolicyName("logs"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("job network policy after CleanupJob: %v, want it deleted", err)
	}
	eventually(t, "the claim's data is deleted", func() bool {
		_, err := os.Stat(dir)
		return errors.Is(err, os.ErrNotExist)
	})
}

// TestGangAllOrNothing: a gang that does not fit is not half-launched: its pods are deleted and
// the launch fails with ErrNoCapacity.
func TestGangAllOrNothing(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "ja-a100-80-0", "NVIDIA-A100-SXM4-80GB", 1); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, c, Options{ProvisionTimeout: 3 * time.Second})
	testcluster.StartKubelet(t, c, testcluster.KubeletOptions{})

	_, err := launcher.LaunchGang(ctx, p, jobSpec(t, "toobig", "A100-80GB", "echo never"), 2)
	if !errors.Is(err, launcher.ErrNoCapacity) {
		t.Fatalf("a gang of 2 on one GPU: %v, want ErrNoCapacity", err)
	}
	eventually(t, "the gang's pods are gone", func() bool {
		pods, err := c.Client().CoreV1().Pods(p.Namespace()).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0
	})
	// The provider reads pods from its informer, which may lag the API server by a moment.
	eventually(t, "List after the failed gang shows nothing", func() bool {
		got, err := p.List(ctx, nil)
		return err == nil && len(got) == 0
	})
}

// waitLog waits until a pod's log (the stand-in's file) holds want.
func waitLog(t *testing.T, k *testcluster.Kubelet, ns, pod, want string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		data, _ := os.ReadFile(k.LogPath(ns, pod))
		if strings.Contains(string(data), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("log of %s/%s never said %q:\n%s", ns, pod, want, data)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestJobPriority covers the priority a job runs at.
func TestJobPriority(t *testing.T) {
	tests := map[string]struct {
		job  launcher.JobSpec
		want int32
	}{
		"preemptible default":         {launcher.JobSpec{Priority: launcher.DefaultJobPriority, Preemptible: true}, 500},
		"preemptible above serving":   {launcher.JobSpec{Priority: 5000, Preemptible: true}, launcher.ServingPriority - 1},
		"not preemptible, low":        {launcher.JobSpec{Priority: 100}, launcher.ServingPriority},
		"not preemptible, very high":  {launcher.JobSpec{Priority: 2000}, 2000},
		"preemptible, below zero":     {launcher.JobSpec{Priority: -5, Preemptible: true}, -5},
		"not preemptible, zero value": {launcher.JobSpec{}, launcher.ServingPriority},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := jobPriority(&tt.job); got != tt.want {
				t.Errorf("jobPriority = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestWithoutPriorityClassPermission: a controller that may not read or create PriorityClasses
// still launches services and jobs, without a class (nothing preempts anything then).
func TestWithoutPriorityClassPermission(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	// Labelled with the canonical name: without node access the provider selects on it.
	if err := c.AddGPUNode(ctx, "jr-h100mega-0", "H100-MEGA", 2); err != nil {
		t.Fatal(err)
	}
	admin := newProvider(t, c, Options{})
	ns := admin.Namespace()
	testcluster.StartKubelet(t, c, testcluster.KubeletOptions{})
	cfg := grantRole(t, c, ns, "no-classes", "ferry-no-classes", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "secrets", "persistentvolumeclaims"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"get", "list", "create", "update", "delete"}},
	})
	p, err := New(Options{RESTConfig: cfg, Context: "no-classes", Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	svc, err := p.Launch(ctx, gpuSpec("svc-1", "H100-MEGA", 1))
	if err != nil {
		t.Fatalf("service launch without priority classes: %v", err)
	}
	jobs, err := launcher.LaunchGang(ctx, p, jobSpec(t, "noclass", "H100-MEGA", "echo ok"), 1)
	if err != nil {
		t.Fatalf("job launch without priority classes: %v", err)
	}
	for _, name := range []string{svc.Name, jobs[0].Name} {
		pod, err := c.Client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Spec.PriorityClassName != "" {
			t.Errorf("pod %s: priority class %q, want none", name, pod.Spec.PriorityClassName)
		}
	}
	if ended := waitEnded(t, p, "noclass", 1); exitOf(ended[0]) != "0" {
		t.Errorf("job: %+v", ended[0])
	}
}

// TestJobNodeLost: a job whose node goes away (its pod deleted with it, not by Ferry) reads as
// preempted, without an exit code, and its process is stopped.
func TestJobNodeLost(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "jx-p4-0", "Tesla-P4", 4); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, c, Options{})
	kubelet := testcluster.StartKubelet(t, c, testcluster.KubeletOptions{})
	insts, err := launcher.LaunchGang(ctx, p, jobSpec(t, "lost", "P4", `echo running; while true; do sleep 0.1; done`), 1)
	if err != nil {
		t.Fatal(err)
	}
	waitLog(t, kubelet, p.Namespace(), insts[0].Name, "running")
	pod, err := c.Client().CoreV1().Pods(p.Namespace()).Get(ctx, insts[0].Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteNode(ctx, pod.Spec.NodeName); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the job reads as preempted", func() bool {
		got, err := p.List(ctx, map[string]string{launcher.LabelJob: "lost"})
		return err == nil && len(got) == 1 && got[0].State == launcher.StatePreempted && got[0].ExitCode == nil
	})
	eventually(t, "its process is stopped", func() bool {
		return !slices.Contains(kubelet.Running(), p.Namespace()+"/"+insts[0].Name)
	})
}

// TestAdoptedGangGetsItsAddresses: a gang whose controller stopped after creating its pods and
// before writing their addresses waits; the next controller's List writes them, and the gang
// runs.
func TestAdoptedGangGetsItsAddresses(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "jd-p4-0", "Tesla-P4", 4); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, c, Options{})
	testcluster.StartKubelet(t, c, testcluster.KubeletOptions{})
	if err := p.ensureStarted(ctx); err != nil {
		t.Fatal(err)
	}
	// What LaunchGang does up to its wait, as a controller killed right after would leave it:
	// a job's gang, and a multi-node service replica's (told apart by service and replica id).
	const run = `echo "nodes: $(echo $SKYPILOT_NODE_IPS)"`
	job := jobSpec(t, "adopted", "P4", run)
	job.Job.NodeIPsCommand = nodeIPsCommand
	if err := p.ensureCheckpointClaim(ctx, job, 2); err != nil {
		t.Fatal(err)
	}
	replica := jobSpec(t, "adopted-svc", "P4", run)
	replica.Labels = map[string]string{launcher.LabelOwner: "true", launcher.LabelService: "adopted-svc", launcher.LabelReplicaID: "1"}
	replica.Job = &launcher.JobSpec{Priority: launcher.ServingPriority, NodeIPsCommand: nodeIPsCommand}
	for _, spec := range []launcher.Spec{job, replica} {
		for rank := range 2 {
			node := launcher.GangNode(spec, rank, 2)
			pod, err := p.podFor(node)
			if err != nil {
				t.Fatal(err)
			}
			pod.Annotations[annotationGangSize] = "2"
			if _, err := p.create(ctx, pod, node); err != nil {
				t.Fatal(err)
			}
		}
	}

	restarted, err := New(Options{Kubeconfig: c.Kubeconfig(), Context: c.Context(), Namespace: p.Namespace()})
	if err != nil {
		t.Fatal(err)
	}
	defer restarted.Close()
	for _, selector := range []map[string]string{{launcher.LabelJob: "adopted"}, {launcher.LabelService: "adopted-svc"}} {
		eventually(t, fmt.Sprintf("the adopted gang %v gets its addresses", selector), func() bool {
			got, err := restarted.List(ctx, selector)
			if err != nil || len(got) != 2 || got[0].IP == "" || got[1].IP == "" {
				return false
			}
			// Listed by id, "NAME-RANK-...": rank order.
			want := got[0].IP + "\n" + got[1].IP
			for _, inst := range got {
				pod, err := c.Client().CoreV1().Pods(p.Namespace()).Get(ctx, inst.Name, metav1.GetOptions{})
				if err != nil || pod.Annotations[AnnotationNodeIPs] != want {
					return false
				}
			}
			return true
		})
	}
	// The job's program read them as SKYPILOT_NODE_IPS.
	ended := waitEnded(t, restarted, "adopted", 2)
	want := "nodes: " + ended[0].IP + " " + ended[1].IP + "\n"
	for _, inst := range ended {
		if log := logOf(t, restarted, inst.ID); !strings.Contains(log, want) {
			t.Errorf("%s log: %q, want %q", inst.Name, log, want)
		}
	}
}

// TestReplicaGangRunsAtServingPriority: a service replica's gang carries a JobSpec (for its
// addresses) but is served, so it runs in the serving class, which may preempt batch jobs.
func TestReplicaGangRunsAtServingPriority(t *testing.T) {
	p := offlineProvider(t)
	replica := launcher.Spec{
		Labels: map[string]string{launcher.LabelService: "svc", launcher.LabelReplicaID: "1"},
		Job:    &launcher.JobSpec{Priority: launcher.ServingPriority},
	}
	if class, value, policy := p.priorityClassFor(replica); class != ServingPriorityClass || value != launcher.ServingPriority || policy != corev1.PreemptLowerPriority {
		t.Errorf("replica gang: %s %d %s, want the serving class", class, value, policy)
	}
	job := launcher.Spec{Labels: map[string]string{launcher.LabelJob: "j"}, Job: &launcher.JobSpec{Priority: 2000}}
	if class, value, policy := p.priorityClassFor(job); class != "ferry-job-2000" || value != 2000 || policy != corev1.PreemptNever {
		t.Errorf("job: %s %d %s, want ferry-job-2000 that preempts nothing", class, value, policy)
	}
}

// TestJobInstanceTakenBack covers how a pod being deleted reads: a job's pod that others
// delete before its program ended was taken back (preempted); one Ferry deletes, or whose
// program had ended, or a replica's, is terminated.
func TestJobInstanceTakenBack(t *testing.T) {
	p, err := New(Options{RESTConfig: &rest.Config{Host: "https://127.0.0.1:1"}, Context: "unit", Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	deleting := metav1.Now()
	pod := func(name string, job bool, phase corev1.PodPhase, code *int32) *corev1.Pod {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: map[string]string{launcher.LabelOwner: "true"}, DeletionTimestamp: &deleting},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: containerName}}},
			Status:     corev1.PodStatus{Phase: phase},
		}
		if job {
			pod.Labels[launcher.LabelJob] = "j"
		}
		if code != nil {
			pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: containerName, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: *code}}}}
		}
		return pod
	}
	three := int32(3)
	p.markOurs("ours")
	tests := map[string]struct {
		pod  *corev1.Pod
		want string
	}{
		"job pod deleted by others":     {pod("others", true, corev1.PodRunning, nil), "PREEMPTED none"},
		"job pod Ferry deletes":         {pod("ours", true, corev1.PodRunning, nil), "TERMINATED none"},
		"job pod that had exited":       {pod("exited", true, corev1.PodFailed, &three), "TERMINATED 3"},
		"replica pod deleted by others": {pod("replica", false, corev1.PodRunning, nil), "TERMINATED none"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			inst := p.jobInstance(tt.pod)
			if got := string(inst.State) + " " + exitOf(inst); got != tt.want {
				t.Errorf("got %s (%s), want %s", got, inst.Reason, tt.want)
			}
		})
	}
}
