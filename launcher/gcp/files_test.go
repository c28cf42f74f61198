package gcp

import (
	"testing"

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
