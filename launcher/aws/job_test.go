package aws

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
	"github.com/ferryserve/ferry/launcher/internal/vmjobtest"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

// jobSpecFor is a job node's spec: a service replica's without service labels, with a JobSpec.
func jobSpecFor(name, setup, run string, spot bool) launcher.Spec {
	s := spec(name, run, spot)
	s.Labels = map[string]string{launcher.LabelJob: vmjobtest.Job, launcher.LabelAttempt: "1"}
	s.Setup = setup
	s.Job = &launcher.JobSpec{Priority: launcher.DefaultJobPriority, Grace: 10 * time.Second, CheckpointDir: "/ferry/checkpoints/7"}
	return s
}

// cloud is the provider p against e's fake, for vmjobtest's checks.
func (e env) cloud(p *Provider) vmjobtest.Cloud {
	return vmjobtest.Cloud{
		Provider: p,
		Spec:     func(name, setup, run string) launcher.Spec { return jobSpecFor(name, setup, run, false) },
		Console: func(in launcher.Instance) string {
			return e.fake.ConsoleOutput(in.ID[strings.LastIndexByte(in.ID, '/')+1:])
		},
	}
}

// TestJobGangTalksOverTCP: a 2-node job gang lands in one zone and one cluster placement group;
// each node learns the gang's private IPs, rank 0 first, from its instance metadata service
// (the ferry-node-ips tag, IMDSv2); rank 1 dials rank 0 on its IP from its own; both exit 0,
// which List reports as ExitCode 0 once the VMs have powered off.
func TestJobGangTalksOverTCP(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	insts := vmjobtest.LaunchGang(t, e.cloud(e.p))
	for _, in := range insts {
		fi := fakeInstance(t, e.fake, in.ID)
		if in.IP != fi.PrivateIP || fi.ZoneID != testZoneID || fi.PlacementGroup == "" || fi.PlacementGroup != fakeInstance(t, e.fake, insts[0].ID).PlacementGroup {
			t.Fatalf("node %s: ip %q, fake %+v: want its private IP, in %s, in the gang's placement group", in.Name, in.IP, fi, testZoneID)
		}
		if fi.Metadata.InstanceMetadataTags != "enabled" || fi.Metadata.HTTPTokens != "required" || fi.Metadata.HopLimit != 1 {
			t.Fatalf("node %s metadata options %+v: want tags in metadata, IMDSv2 required, hop limit 1", in.Name, fi.Metadata)
		}
	}
	// On EC2 the ranks reach each other only through a rule (the fake does not filter).
	rules := e.fake.IngressRules(testRegion, DefaultJobSecurityGroup)
	if len(rules) != 1 || rules[0].Protocol != "-1" || rules[0].GroupID == "" {
		t.Fatalf("job security group rules %+v, want all traffic from the group itself", rules)
	}
	vmjobtest.CheckGangTalked(t, e.cloud(e.p), insts)
	for _, in := range insts {
		fi := fakeInstance(t, e.fake, in.ID)
		if fi.StateReason != fakeec2.ReasonInstanceInitiatedShutdown {
			t.Errorf("%s: state reason %q, want %s (the VM powered off)", in.Name, fi.StateReason, fakeec2.ReasonInstanceInitiatedShutdown)
		}
	}
}

func TestJobExitCodes(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	vmjobtest.CheckExitCodes(t, e.cloud(e.p))
}

func TestJobLogs(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	p, err := New(context.Background(), Options{
		Regions: []string{testRegion}, Endpoint: e.fake.URL(), Credentials: e.p.opts.Credentials,
		AMIs: e.p.opts.AMIs, LaunchTimeout: testTimeout, PollInterval: 10 * time.Millisecond, LogInterval: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	vmjobtest.CheckLogs(t, e.cloud(p))
}

// TestJobSpotInterruptionWarning: EC2's interruption warning reaches the program as SIGTERM,
// with the time left in the preemption file, while the VM still runs; the node then reports
// no exit status and, once reclaimed, is PREEMPTED.
func TestJobSpotInterruptionWarning(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	c := e.cloud(e.p)
	in, err := e.p.Launch(context.Background(), jobSpecFor("spot", "", vmjobtest.PreemptibleRun, true))
	if err != nil {
		t.Fatal(err)
	}
	vmjobtest.WaitTraining(t, c, in)
	fi := fakeInstance(t, e.fake, in.ID)
	if err := e.fake.PreemptWithNotice(fi.ID, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	if left := vmjobtest.WaitWarned(t, c, in); left < 60 || left > 90 {
		t.Fatalf("%d s left at the warning, want 60-90 (a 90 s notice, polled every %d s)", left, preemptionPoll)
	}
	if got := vmjobtest.Listed(t, e.p, in.ID); got.State != launcher.StateRunning {
		t.Fatalf("node is %s after the warning, want still running until reclaimed", got.State)
	}
	if err := e.fake.Preempt(fi.ID); err != nil {
		t.Fatal(err)
	}
	vmjobtest.WaitFor(t, "preempted", func() bool { return vmjobtest.Listed(t, e.p, in.ID).State == launcher.StatePreempted })
	vmjobtest.CheckPreempted(t, c, in)
}

// TestJobGangNoCapacity: besides failing and leaving nothing listed, a gang beyond capacity
// leaves no instance running in the fake.
func TestJobGangNoCapacity(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	e.fake.SetCapacity(testZoneID, testType, 1)
	vmjobtest.CheckGangBeyondCapacity(t, e.cloud(e.p))
	for _, in := range e.fake.Instances() {
		if in.State == "pending" || in.State == "running" {
			t.Fatalf("node %s of a failed gang is %s", in.ID, in.State)
		}
	}
}

func TestConsoleWindows(t *testing.T) {
	for name, tc := range map[string]struct {
		prev, next, want string
	}{
		"grew":      {prev: "a\nb\n", next: "a\nb\nc\n", want: "c\n"},
		"scrolled":  {prev: "a\nb\n", next: "b\nc\n", want: "c\n"},
		"unchanged": {prev: "a\n", next: "a\n", want: ""},
		"lost":      {prev: "a\n", next: "x\ny\n", want: "x\ny\n"},
		"first":     {prev: "", next: "a\n", want: "a\n"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := newOutput(tc.prev, tc.next); got != tc.want {
				t.Fatalf("newOutput = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestJobCheckpointOnSharedFilesystem: with checkpoint_nfs (the fake's stand-in for an EFS
// mount), a node in another zone finds the first node's checkpoint; without it the directory
// is the VM's own and the node says so.
func TestJobCheckpointOnSharedFilesystem(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	e.p.opts.CheckpointNFS = "fs-0123456789abcdef0.efs.us-east-1.amazonaws.com:/"
	claim := vmjobtest.CheckCheckpointShared(t, e.cloud(e.p), "use1-az2")

	// Without a shared filesystem, each VM's checkpoint is its own.
	e.p.opts.CheckpointNFS = ""
	third := jobSpecFor("ckpt-c", "", vmjobtest.ReadCheckpointRun, false)
	third.Job.CheckpointClaim = claim
	c, err := e.p.Launch(context.Background(), third)
	if err != nil {
		t.Fatal(err)
	}
	if code := vmjobtest.WaitExited(t, e.cloud(e.p), c); code != 1 || !strings.Contains(consoleOf(t, e, c.ID), "does not survive a recovery") {
		t.Errorf("without checkpoint_nfs: exit %d, console:\n%s", code, consoleOf(t, e, c.ID))
	}
}

// consoleOf is an instance's console output as StreamLogs gives it.
func consoleOf(t *testing.T, e env, id string) string {
	t.Helper()
	var b bytes.Buffer
	_ = e.p.StreamLogs(context.Background(), id, launcher.LogOptions{Tail: -1}, &b)
	return b.String()
}

func TestJobBootGolden(t *testing.T) {
	vmjobtest.CheckBootGolden(t, func(nfs string) (string, error) {
		s := jobSpecFor("train", "pip install -r requirements.txt", "python train.py", true)
		s.Job.CheckpointClaim = launcher.CheckpointClaim(vmjobtest.Job)
		return vmnode.JobBoot(InfraName, s, nfs, preemptionWatch)
	})
}
