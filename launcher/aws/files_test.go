package aws

import (
	"errors"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
	"github.com/ferryserve/ferry/launcher/internal/vmjobtest"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// TestJobFiles: a node's user-data carries its workdir and local mounts and fetches its S3
// objects by presigned URL.
func TestJobFiles(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	b := vmjobtest.NewBuckets(t, "unused")
	e.p.opts.Buckets = b.Client
	vmjobtest.CheckFiles(t, e.cloud(e.p), b, false)
}

// TestJobFilesRefused: past 16 KiB of user-data, a missing bucket or path, and gs:// (an EC2
// VM has no Google credentials) fail the launch before any instance exists.
func TestJobFilesRefused(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	b := vmjobtest.NewBuckets(t, "unused")
	e.p.opts.Buckets = b.Client
	vmjobtest.CheckFilesRefused(t, e.cloud(e.p), userDataLimit)
	s := jobSpecFor("gs", "", "true", false)
	s.FileMounts = map[string]string{"/data": "gs://datasets/train"}
	if _, err := e.p.Launch(vmjobtest.Context(t), s); !errors.Is(err, nodefiles.ErrFiles) || !strings.Contains(err.Error(), "s3://") {
		t.Fatalf("gs:// on aws: %v, want ErrFiles naming s3://", err)
	}
}

// TestJobDocker: image_id docker:IMAGE runs setup and run in the container, with the GPUs of a
// GPU instance and without on a CPU one.
func TestJobDocker(t *testing.T) {
	for name, gpu := range map[string]bool{"gpu": true, "cpu": false} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, fakeec2.Options{}, goodKey)
			s := jobSpecFor("docker-"+name, "", "", false)
			if gpu {
				s.Placement.Accelerator, s.Placement.AcceleratorCount = "A10G", 1
			} else {
				s.Placement.InstanceType = "m5.large"
			}
			vmjobtest.CheckDocker(t, e.cloud(e.p), s, gpu)
		})
	}
}
