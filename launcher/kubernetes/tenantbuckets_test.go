package kubernetes

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/credentials"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/buckets"
	"github.com/ferryserve/ferry/launcher/internal/vmjobtest"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// countingBuckets counts the calls made of a bucket client.
type countingBuckets struct {
	nodefiles.Buckets
	calls atomic.Int32
}

func (c *countingBuckets) List(ctx context.Context, u nodefiles.BucketURL) ([]nodefiles.BucketObject, error) {
	c.calls.Add(1)
	return c.Buckets.List(ctx, u)
}

func (c *countingBuckets) Open(ctx context.Context, u nodefiles.BucketURL, key string) (io.ReadCloser, error) {
	c.calls.Add(1)
	return c.Buckets.Open(ctx, u, key)
}

func (c *countingBuckets) DownloadURL(ctx context.Context, u nodefiles.BucketURL, key string) (nodefiles.Download, error) {
	c.calls.Add(1)
	return c.Buckets.DownloadURL(ctx, u, key)
}

// TestTenantBucketFiles: an s3+secret:// source (a FerryService's s3:// source read with the
// tenant's Secret) is never read with the provider's own client: unregistered, the launch fails
// with an error naming the Secret that is not ErrInvalid (a later launch, once the controller
// has read the Secret, succeeds) and leaves no pod; registered, the pod's fetch.sh holds URLs
// signed with the tenant's access key id and the pod reads the objects; mounted (mode MOUNT),
// it is refused.
func TestTenantBucketFiles(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "tb-l4-0", "NVIDIA-L4", 1); err != nil {
		t.Fatal(err)
	}
	b := vmjobtest.NewBuckets(t, "unused")
	own := &countingBuckets{Buckets: b.Client}
	p := newProvider(t, c, Options{Buckets: own})
	testcluster.StartKubelet(t, c, testcluster.KubeletOptions{})
	spec := jobSpec(t, "tenant-files", "L4", `cat "$MODELS/config.json" "$MODELS/shards/0.bin"; echo`)
	spec.FileMounts = map[string]string{"/models": TenantS3Source("tenant", "creds", "s3://models/llama")}
	spec.Envs["MODELS"] = "/models"

	_, err := p.Launch(ctx, spec)
	if err == nil || errors.Is(err, launcher.ErrInvalid) || !strings.Contains(err.Error(), "the credentials of Secret tenant/creds are not loaded (yet)") {
		t.Fatalf("unregistered: Launch = %v; want a retryable error naming the Secret", err)
	}
	if insts, _ := p.List(ctx, map[string]string{launcher.LabelJob: "tenant-files"}); len(insts) != 0 {
		t.Errorf("a failed launch left pods: %v", insts)
	}

	mounted := spec
	mounted.MountModes = map[string]configs.MountMode{"/models": configs.ModeMount}
	if _, err := p.Launch(ctx, mounted); !errors.Is(err, nodefiles.ErrFiles) || !strings.Contains(err.Error(), "write mode: COPY") {
		t.Errorf("mounted: Launch = %v, want ErrFiles saying to copy", err)
	}

	tenant := buckets.New(buckets.Options{S3Endpoint: b.S3.URL(), Credentials: credentials.NewStaticCredentialsProvider("AKIDTENANT", "tenant-secret", "")})
	p.TenantBuckets().Set("tenant/creds", "v1", func() nodefiles.Buckets { return tenant })
	inst, err := p.Launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	files, err := c.Client().CoreV1().Secrets(p.Namespace()).Get(ctx, filesObjectName(inst.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fetch := string(files.Data[filesFetch])
	if strings.Count(fetch, "X-Amz-Credential=AKIDTENANT%2F") != 2 || strings.Contains(fetch, "AKIDFILES") {
		t.Errorf("fetch.sh is not signed with the tenant's key alone:\n%s", fetch)
	}
	ended := waitEnded(t, p, "tenant-files", 1)
	if log := logOf(t, p, ended[0].ID); !strings.Contains(log, "s3-configs3-shard") {
		t.Errorf("the pod did not read the objects; log:\n%s", log)
	}
	if n := own.calls.Load(); n != 0 {
		t.Errorf("the provider's own client was called %d times for a tenant's source", n)
	}
}
