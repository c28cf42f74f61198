package gcp

import (
	"errors"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/gcp/fakecompute"
	"github.com/ferryserve/ferry/launcher/internal/vmjobtest"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// TestJobMountsGCS: a gs:// bucket in mode MOUNT (gcsfuse) and MOUNT_CACHED (rclone) on a
// Compute Engine job node: the VM gets the default service account with the read-write storage
// scope, its FUSE client (the stand-in) writes with that account's metadata token (the only
// one the fake GCS takes), and the node's writes are in the bucket when it has exited; a new
// VM reads them.
func TestJobMountsGCS(t *testing.T) {
	for _, mode := range []configs.MountMode{configs.ModeMount, configs.ModeMountCached} {
		t.Run(string(mode), func(t *testing.T) {
			b := vmjobtest.NewBuckets(t, fakecompute.DefaultServiceAccountToken)
			vmjobtest.MountEnv(t, b)
			b.GCS.Put("ckpt", "run/step", []byte("1\n"))
			e := newEnv(t, fakecompute.Options{}, Options{Buckets: b.Client})
			get := func(key string) (string, bool) { body, ok := b.GCS.Get("ckpt", key); return string(body), ok }
			vmjobtest.CheckMount(t, e.cloud(), "gs://ckpt/run", mode, get, func(first launcher.Instance) {
				if len(b.GCS.Writes()) == 0 {
					t.Error("no writes")
				}
				vm, _, _ := e.fake.Instance(first.Name)
				sa := vm.GetServiceAccounts()
				if len(sa) != 1 || len(sa[0].GetScopes()) != 1 || sa[0].GetScopes()[0] != "https://www.googleapis.com/auth/devstorage.read_write" {
					t.Errorf("service accounts %v, want the default one with the read-write storage scope", sa)
				}
			})
		})
	}
}

// TestJobMountS3Refused: a GCP VM has no AWS credentials to mount s3:// with: the launch
// fails before any VM exists, naming COPY.
func TestJobMountS3Refused(t *testing.T) {
	b := vmjobtest.NewBuckets(t, fakecompute.DefaultServiceAccountToken)
	e := newEnv(t, fakecompute.Options{}, Options{Buckets: b.Client})
	s := jobSpecFor("refused", "", "true", false)
	s.FileMounts = map[string]string{"/data": "s3://models/llama"}
	s.MountModes = map[string]configs.MountMode{"/data": configs.ModeMountCached}
	if _, err := e.prov.Launch(vmjobtest.Context(t), s); !errors.Is(err, nodefiles.ErrFiles) || !strings.Contains(err.Error(), "mode: COPY") {
		t.Fatalf("Launch = %v, want ErrFiles naming mode: COPY", err)
	}
	if n := len(e.fake.VMs()); n != 0 {
		t.Errorf("%d VMs after a refused launch", n)
	}
}
