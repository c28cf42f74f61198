package e2e

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher/buckets/fakefuse"
	"github.com/ferryserve/ferry/launcher/buckets/fakes3"
)

// mountJob is a spot training job whose checkpoints go to a bucket mounted at /checkpoint,
// its file_mounts spelled as SkyPilot's examples/spot/resnet.yaml spells them (an existing
// bucket by name, mode MOUNT; no store: the task runs on AWS, so S3). On a fake VM the mount
// point is under $FERRY_FILES_ROOT (the VM's own disk); on a real VM that is empty.
const mountJob = `name: mount-train
resources:
  cloud: aws
  accelerators: T4:1
  use_spot: true
  job_recovery: EAGER_NEXT_REGION
file_mounts:
  /checkpoint:
    name: ferry-e2e-checkpoints
    mode: MOUNT
setup: mkdir -p "$FERRY_FILES_ROOT/checkpoint/mount-train"
run: |
  ferry train-sim --steps=200 --step-time=50ms --checkpoint-every=5 --checkpoint-dir="$FERRY_FILES_ROOT/checkpoint/mount-train"
`

// On the fake clouds, a managed spot job with a MOUNT checkpoint bucket: its VM runs with the
// mount instance profile and mounts the bucket with goofys (the stand-in, signing with the
// profile's role credentials from the VM's metadata service); EC2's interruption warning makes
// the run checkpoint and the boot script unmount; the job recovers on a new VM, with an empty
// disk and no shared filesystem, which mounts the bucket again and resumes from the checkpoint
// there, and succeeds.
func TestJobMountCheckpointResumesAfterPreemption(t *testing.T) {
	fakefuse.Install(t)
	s3 := fakes3.New()
	t.Cleanup(s3.Close)
	s3.MakeBucket("ferry-e2e-checkpoints")
	t.Setenv("AWS_ENDPOINT_URL_S3", s3.URL()) // the controller's S3 and the VMs' goofys
	clouds := startFakeClouds(t)
	e := newEnv(t)
	e.extraEnv = append(append([]string{}, awsEnv...), "FERRY_JOB_WATCH_INTERVAL=200ms")
	cfg := strings.Replace(clouds.config(), "  amis: {us-east-1: ami-0fe771}\n",
		"  amis: {us-east-1: ami-0fe771}\n  mount_instance_profile: ferry-mounts\n", 1)
	writeFile(t, filepath.Join(e.home, "config.yaml"), cfg)
	file := filepath.Join(t.TempDir(), "mount.yaml")
	writeFile(t, file, mountJob)

	plan := e.mustRun("jobs", "launch", "--dry-run", file)
	if !strings.Contains(plan, "/checkpoint <- s3://ferry-e2e-checkpoints (mounted, MOUNT") {
		t.Fatalf("--dry-run does not show the mount:\n%s", plan)
	}
	id := e.launchDetached(file)
	j := e.waitJob(id, 2*time.Minute, "runs", func(j jobView) bool { return j.State == "RUNNING" && len(j.Nodes) == 1 })
	eventually(t, time.Minute, "training under way", func() (bool, string) {
		log, _, _ := e.run("jobs", "logs", strconv.FormatInt(id, 10))
		return strings.Contains(log, "step 30/200"), lastLines(log, 2)
	})
	victim := j.Nodes[0].InstanceID
	if err := clouds.ec2.PreemptWithNotice(victim[strings.LastIndex(victim, "/")+1:], 15*time.Second); err != nil {
		t.Fatal(err)
	}
	rec := e.waitJob(id, 2*time.Minute, "recovered", func(j jobView) bool { return j.State == "RUNNING" && j.Attempt == 2 })
	if rec.Recoveries != 1 {
		t.Errorf("want one recovery: %+v", rec)
	}
	e.waitJob(id, 3*time.Minute, "succeeds", func(j jobView) bool { return j.State == "SUCCEEDED" && len(j.Nodes) == 0 })
	log := e.mustRun("jobs", "logs", strconv.FormatInt(id, 10))
	for _, want := range []string{"ferry: mounting s3://ferry-e2e-checkpoints at /checkpoint (MOUNT)", "resuming from checkpoint at step", "training done: 200 steps"} {
		if !strings.Contains(log, want) {
			t.Errorf("job log lacks %q:\n%s", want, lastLines(log, 30))
		}
	}
	if _, ok := s3.Get("ferry-e2e-checkpoints", "mount-train/checkpoint.json"); !ok {
		t.Error("no checkpoint in the bucket")
	}
	writes := s3.Writes()
	if len(writes) == 0 {
		t.Fatal("nothing was written to the bucket")
	}
	for _, w := range writes {
		if !strings.HasPrefix(w.AccessKey, "ASIAFAKE") || !w.SessionToken {
			t.Errorf("write %+v not signed by a VM's instance profile role", w)
		}
	}
}
