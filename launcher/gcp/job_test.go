package gcp

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/gcp/fakecompute"
	"github.com/ferryserve/ferry/launcher/internal/vmjobtest"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

// jobSpecFor is a job node's spec: no service labels, a JobSpec.
func jobSpecFor(name, setup, run string, spot bool) launcher.Spec {
	s := spec(name, launcher.Placement{Zone: "us-central1-b", InstanceType: "n1-standard-4", Spot: spot})
	s.Labels = map[string]string{launcher.LabelJob: vmjobtest.Job, launcher.LabelAttempt: "1"}
	s.Setup, s.Run = setup, run
	s.Job = &launcher.JobSpec{Priority: launcher.DefaultJobPriority, Grace: 10 * time.Second, CheckpointDir: "/ferry/checkpoints/7"}
	return s
}

// cloud is e's provider against its fake, for vmjobtest's checks.
func (e *env) cloud() vmjobtest.Cloud {
	return vmjobtest.Cloud{
		Provider: e.prov,
		Spec:     func(name, setup, run string) launcher.Spec { return jobSpecFor(name, setup, run, false) },
		Console:  func(in launcher.Instance) string { return e.fake.SerialOutput(in.Zone, in.Name) },
	}
}

// waitStatus waits until the fake's VM has the status.
func waitStatus(t *testing.T, e *env, in launcher.Instance, status string) {
	t.Helper()
	waitFor(t, in.Name+" "+status, func() bool {
		vm, _, _ := e.fake.Instance(in.Name)
		return vm.GetStatus() == status
	})
}

// TestJobGangTalksOverTCP: a 2-node job gang lands in one zone; each node learns the gang's
// internal IPs, rank 0 first, from its metadata server (an attribute set after insert); rank 1
// dials rank 0 on its IP from its own; both exit 0, which List reports as ExitCode 0 once the
// VMs have stopped.
func TestJobGangTalksOverTCP(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	insts := vmjobtest.LaunchGang(t, e.cloud())
	for _, in := range insts {
		vm, zone, _ := e.fake.Instance(in.Name)
		if in.IP != vm.GetNetworkInterfaces()[0].GetNetworkIP() || zone != "us-central1-b" {
			t.Fatalf("node %s: ip %q in %s; want its internal IP in us-central1-b", in.Name, in.IP, zone)
		}
	}
	// On GCE the ranks reach each other only through a rule (the fake does not filter).
	fw, ok := e.fake.Firewall("ferry-jobs")
	if !ok || fw.GetPriority() >= allowPriority || !slices.Equal(fw.GetSourceTags(), []string{jobTag}) || !slices.Equal(fw.GetTargetTags(), []string{jobTag}) {
		t.Fatalf("ferry-jobs rule %v, want job nodes admitted from job nodes above the deny rules", fw)
	}
	for _, in := range insts {
		if vm, _, _ := e.fake.Instance(in.Name); !slices.Contains(vm.GetTags().GetItems(), jobTag) {
			t.Fatalf("%s has network tags %v, want %s", in.Name, vm.GetTags().GetItems(), jobTag)
		}
	}
	vmjobtest.CheckGangTalked(t, e.cloud(), insts)
	for _, in := range insts {
		waitStatus(t, e, in, "TERMINATED") // powered off
	}
}

func TestJobExitCodes(t *testing.T) {
	vmjobtest.CheckExitCodes(t, newEnv(t, fakecompute.Options{}, Options{}).cloud())
}

func TestJobLogs(t *testing.T) {
	vmjobtest.CheckLogs(t, newEnv(t, fakecompute.Options{}, Options{LogInterval: 50 * time.Millisecond}).cloud())
}

// TestJobPreemptionNotice: GCE's preemption notice (shortened) reaches the program as SIGTERM
// with the time left in the preemption file while the VM still runs it; the VM then stops, is
// PREEMPTED, and reports no exit status.
func TestJobPreemptionNotice(t *testing.T) {
	const notice = 6 * time.Second
	e := newEnv(t, fakecompute.Options{PreemptionNotice: notice}, Options{})
	c := e.cloud()
	in, err := e.prov.Launch(testCtx(t), jobSpecFor("spot", "", vmjobtest.PreemptibleRun, true))
	if err != nil {
		t.Fatal(err)
	}
	vmjobtest.WaitTraining(t, c, in)
	if err := e.fake.PreemptWithNotice(in.Name, notice); err != nil {
		t.Fatal(err)
	}
	if left := vmjobtest.WaitWarned(t, c, in); left != int(notice/time.Second)-preemptionPoll {
		t.Fatalf("%d s left, want %d (the notice less the poll)", left, int(notice/time.Second)-preemptionPoll)
	}
	waitFor(t, "checkpointed", func() bool { return strings.Contains(c.Console(in), "checkpointed") })
	if vm, _, _ := e.fake.Instance(in.Name); vm.GetStatus() != "STOPPING" {
		t.Fatalf("the VM is %s when its program checkpointed, want STOPPING (still within the notice)", vm.GetStatus())
	}
	waitStatus(t, e, in, "TERMINATED")
	vmjobtest.CheckPreempted(t, c, in)
}

func TestJobGangNoCapacity(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	e.fake.SetCapacity("us-central1-b", "n1-standard-4", 1)
	vmjobtest.CheckGangBeyondCapacity(t, e.cloud())
}

// TestJobCheckpointOnSharedFilesystem: with checkpoint_nfs (the fake's stand-in for a Filestore
// mount), a node in another zone finds the first node's checkpoint.
func TestJobCheckpointOnSharedFilesystem(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{CheckpointNFS: "10.0.0.2:/checkpoints"})
	vmjobtest.CheckCheckpointShared(t, e.cloud(), "us-central1-a")
}

func TestJobBootGolden(t *testing.T) {
	vmjobtest.CheckBootGolden(t, func(nfs string) (string, error) {
		s := jobSpecFor("train", "pip install -r requirements.txt", "python train.py", true)
		s.Job.CheckpointClaim = launcher.CheckpointClaim(vmjobtest.Job)
		return vmnode.JobBoot(InfraName, s, nfs, preemptionWatch)
	})
}
