package aws

import (
	"errors"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
	"github.com/ferryserve/ferry/launcher/internal/vmjobtest"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// TestJobMountsS3: an s3:// bucket in mode MOUNT (goofys) and MOUNT_CACHED (rclone) on an EC2
// job node: the VM runs with the mount instance profile, its FUSE client (the stand-in) signs
// with that profile's role credentials from the VM's metadata service, and the node's writes
// are in the bucket when it has exited; a new VM reads them.
func TestJobMountsS3(t *testing.T) {
	for _, mode := range []configs.MountMode{configs.ModeMount, configs.ModeMountCached} {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, fakeec2.Options{}, goodKey)
			b := vmjobtest.NewBuckets(t, "unused")
			vmjobtest.MountEnv(t, b)
			b.S3.Put("ckpt", "run/step", []byte("1\n"))
			e.p.opts.Buckets, e.p.opts.MountInstanceProfile = b.Client, "ferry-mounts"
			get := func(key string) (string, bool) { body, ok := b.S3.Get("ckpt", key); return string(body), ok }
			vmjobtest.CheckMount(t, e.cloud(e.p), "s3://ckpt/run", mode, get, func(first launcher.Instance) {
				id := first.ID[strings.LastIndexByte(first.ID, '/')+1:]
				writes := b.S3.Writes()
				if len(writes) == 0 {
					t.Fatal("no writes")
				}
				for _, w := range writes {
					if w.AccessKey != fakeec2.RoleAccessKey(id) || !w.SessionToken {
						t.Errorf("write %+v not signed by %s's instance profile role", w, id)
					}
				}
				for _, in := range e.fake.Instances() {
					if in.ID == id && in.InstanceProfile != "ferry-mounts" {
						t.Errorf("instance profile %q, want ferry-mounts", in.InstanceProfile)
					}
				}
			})
		})
	}
}

// TestJobMountsRefused: an s3:// mount without a mount instance profile configured, and a
// gs:// mount (an EC2 VM has no Google credentials), fail the launch before any VM exists,
// saying what to do; a VM that mounts nothing gets no instance profile.
func TestJobMountsRefused(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	b := vmjobtest.NewBuckets(t, "unused")
	e.p.opts.Buckets = b.Client
	for name, tc := range map[string]struct{ src, want string }{
		"s3 without a profile": {"s3://models/llama", "aws.mount_instance_profile"},
		"gs on EC2":            {"gs://datasets/train", "mode: COPY"},
	} {
		t.Run(name, func(t *testing.T) {
			s := jobSpecFor("refused", "", "true", false)
			s.FileMounts = map[string]string{"/data": tc.src}
			s.MountModes = map[string]configs.MountMode{"/data": configs.ModeMount}
			_, err := e.p.Launch(vmjobtest.Context(t), s)
			if !errors.Is(err, nodefiles.ErrFiles) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Launch = %v, want ErrFiles saying %q", err, tc.want)
			}
		})
	}
	if n := len(e.fake.Instances()); n != 0 {
		t.Errorf("%d instances after refused launches", n)
	}
	e.p.opts.MountInstanceProfile = "ferry-mounts"
	s := jobSpecFor("no-bucket", "", "true", false)
	s.FileMounts = map[string]string{"/data": "s3://no-such-bucket/ckpt"}
	s.MountModes = map[string]configs.MountMode{"/data": configs.ModeMount}
	if _, err := e.p.Launch(vmjobtest.Context(t), s); !errors.Is(err, nodefiles.ErrFiles) || !strings.Contains(err.Error(), "aws s3 mb s3://no-such-bucket") {
		t.Fatalf("mounting a missing bucket: %v, want ErrFiles saying how to create it", err)
	}
	s = jobSpecFor("copies", "", "true", false)
	s.FileMounts = map[string]string{"/data": "s3://models/llama"}
	if _, err := e.p.Launch(vmjobtest.Context(t), s); err != nil {
		t.Fatal(err)
	}
	if in := e.fake.Instances(); len(in) != 1 || in[0].InstanceProfile != "" {
		t.Errorf("a VM that only copies got instance profile %q", in[0].InstanceProfile)
	}
}

// TestJobCopiesGCS: a gs:// copy on an EC2 VM (which has no Google credentials) is fetched
// with a token the controller lends it: its own Google token narrowed, by Google's Security
// Token Service (the fake GCS stands in), to reading that prefix. The VM reads the objects
// with the narrowed token, never the controller's own.
func TestJobCopiesGCS(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	b := vmjobtest.NewBuckets(t, "controller-token")
	e.p.opts.Buckets = vmjobtest.LendingClient(b, "controller-token")
	s := jobSpecFor("gs-copy", "", `cat "$FERRY_FILES_ROOT/data/part-0.txt"`, false)
	s.FileMounts = map[string]string{"/data": "gs://datasets/train"}
	in, err := e.p.Launch(vmjobtest.Context(t), s)
	if err != nil {
		t.Fatal(err)
	}
	c := e.cloud(e.p)
	if got := vmjobtest.WaitExited(t, c, in); got != 0 || !strings.Contains(c.Console(in), "gcs-part") {
		t.Fatalf("exit %d; console:\n%s", got, c.Console(in))
	}
	readers := b.GCS.Readers()
	if len(readers) != 1 || !strings.HasPrefix(readers[0], "narrowed-") {
		t.Errorf("GCS reads with tokens %q, want one narrowed token (never the controller's own)", readers)
	}
}
