package gcp

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/gcp/fakecompute"
	"github.com/ferryserve/ferry/launcher/internal/vmjobtest"
)

// TestJobFiles: a node's startup script carries its workdir and local mounts, fetches its S3
// objects by presigned URL and its GCS objects with the token of the service account the VM
// was given, from its metadata server.
func TestJobFiles(t *testing.T) {
	b := vmjobtest.NewBuckets(t, fakecompute.DefaultServiceAccountToken)
	e := newEnv(t, fakecompute.Options{}, Options{Buckets: b.Client})
	vmjobtest.CheckFiles(t, e.cloud(), b, true)
}

// TestJobFilesRefused: past GCE's 256 KiB metadata value, a missing bucket or path fail the
// launch before any VM exists.
func TestJobFilesRefused(t *testing.T) {
	b := vmjobtest.NewBuckets(t, fakecompute.DefaultServiceAccountToken)
	e := newEnv(t, fakecompute.Options{}, Options{Buckets: b.Client})
	vmjobtest.CheckFilesRefused(t, e.cloud(), metadataValueLimit)
}

// TestJobDocker: image_id docker:IMAGE, once refused on GCP, runs setup and run in the
// container.
func TestJobDocker(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	vmjobtest.CheckDocker(t, e.cloud(), jobSpecFor("docker", "", "", false), false)
}

// TestJobFilesFetchFails: a node whose GCS download is refused (the bucket does not accept its
// service account's token) ends as a failed setup, with its exit marker, instead of waiting.
func TestJobFilesFetchFails(t *testing.T) {
	b := vmjobtest.NewBuckets(t, "a-token-the-vm-does-not-have")
	e := newEnv(t, fakecompute.Options{}, Options{Buckets: b.Client})
	c := e.cloud()
	s := c.Spec("denied", "", "echo never")
	s.FileMounts = map[string]string{"/data": "gs://datasets/train"}
	in, err := c.Provider.Launch(vmjobtest.Context(t), s)
	if err != nil {
		t.Fatal(err)
	}
	if got := vmjobtest.WaitExited(t, c, in); got != launcher.ExitSetupFailed {
		t.Fatalf("exit code %d, want %d; console:\n%s", got, launcher.ExitSetupFailed, c.Console(in))
	}
	if console := c.Console(in); !strings.Contains(console, "ferry: files: fetch gs://datasets/train failed") || strings.Contains(console, "never") {
		t.Errorf("console:\n%s\nwant the failed fetch named and no run", console)
	}
}

// TestReplicaFiles: a service replica's VM (not a job's) gets its workdir too.
func TestReplicaFiles(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "app.txt"), []byte("replica-workdir"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := spec("svc-files", launcher.Placement{InstanceType: "n1-standard-4"})
	s.Workdir = work
	s.Run = "cat app.txt; echo; exec sleep 300"
	in, err := e.prov.Launch(testCtx(t), s)
	if err != nil {
		t.Fatal(err)
	}
	vmjobtest.WaitFor(t, "the replica to print its workdir's file", func() bool {
		return strings.Contains(e.fake.SerialOutput(in.Zone, in.Name), "replica-workdir")
	})
	if err := e.prov.Terminate(testCtx(t), in.ID); err != nil {
		t.Fatal(err)
	}
}
