package vmjobtest

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"golang.org/x/oauth2"
	"google.golang.org/api/option"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/buckets"
	"github.com/ferryserve/ferry/launcher/buckets/fakefuse"
)

// mountRun is a job node's run with /ckpt mounted: it reads the checkpoint an earlier node
// left in the bucket, writes the next one and a file in a new directory, and ends. On a fake
// VM the mount point is under FERRY_FILES_ROOT (the VM's disk); on a real one it is /ckpt.
const mountRun = `d="$FERRY_FILES_ROOT/ckpt"
echo "resumed from step $(cat "$d/step")"
echo 2 > "$d/step"
mkdir -p "$d/logs" && echo "step 2 done" > "$d/logs/train.txt"`

// MountEnv points the FUSE stand-ins (fakefuse, which Install puts on the PATH fake VMs
// inherit) at b's fakes, as the real clients would find S3 and GCS from a VM.
func MountEnv(t *testing.T, b Buckets) {
	t.Helper()
	fakefuse.Install(t)
	t.Setenv("AWS_ENDPOINT_URL_S3", b.S3.URL())
	t.Setenv("STORAGE_EMULATOR_HOST", b.GCS.URL())
}

// CheckMount launches a job node that mounts url at /ckpt in mode (MOUNT or MOUNT_CACHED):
// the boot script mounts it with the cloud's FUSE client (the stand-in), the run reads the
// object an earlier run left there and writes over it, and by the time the node has exited
// its writes are in the bucket (the boot script waits for the uploads and unmounts before it
// marks its exit). A second node, on a new VM with an empty disk, reads the first one's
// write. get reads the bucket; checkWrites checks who wrote (the VM's own credentials).
func CheckMount(t *testing.T, c Cloud, url string, mode configs.MountMode, get func(key string) (string, bool), checkWrites func(first launcher.Instance)) {
	t.Helper()
	if mode == configs.ModeMount {
		// No round but the first and the one at unmount: what reaches the bucket went up
		// when the boot script unmounted, as a goofys mount has every closed file uploaded.
		t.Setenv("FAKEFUSE_INTERVAL", "1h")
	}
	s := c.Spec("mount", "", mountRun)
	s.FileMounts = map[string]string{"/ckpt": url}
	s.MountModes = map[string]configs.MountMode{"/ckpt": mode}
	first, err := c.Provider.Launch(Context(t), s)
	if err != nil {
		t.Fatal(err)
	}
	if got := WaitExited(t, c, first); got != 0 {
		t.Fatalf("exit code %d, want 0; console:\n%s", got, c.Console(first))
	}
	console := c.Console(first)
	for _, want := range []string{"ferry: mounting " + url + " at /ckpt (" + string(mode) + ")", "resumed from step 1"} {
		if !strings.Contains(console, want) {
			t.Errorf("console lacks %q:\n%s", want, console)
		}
	}
	if mode == configs.ModeMountCached && !strings.Contains(console, "ferry: waiting for MOUNT_CACHED uploads to finish") {
		t.Errorf("console does not show the flush:\n%s", console)
	}
	// No wait: the node marked its exit only after its mount's last upload.
	if got, ok := get("run/step"); !ok || got != "2\n" {
		t.Errorf("bucket's run/step = %q (%v) when the node exited, want the run's write", got, ok)
	}
	if got, ok := get("run/logs/train.txt"); !ok || got != "step 2 done\n" {
		t.Errorf("bucket's run/logs/train.txt = %q (%v), want the run's write", got, ok)
	}
	checkWrites(first)

	s = c.Spec("mount-again", "", `cat "$FERRY_FILES_ROOT/ckpt/step" | sed 's/^/next node reads step /'`)
	s.FileMounts = map[string]string{"/ckpt": url}
	s.MountModes = map[string]configs.MountMode{"/ckpt": mode}
	second, err := c.Provider.Launch(Context(t), s)
	if err != nil {
		t.Fatal(err)
	}
	if got := WaitExited(t, c, second); got != 0 || !strings.Contains(c.Console(second), "next node reads step 2") {
		t.Errorf("second node: exit %d; console:\n%s", got, c.Console(second))
	}
}

// LendingClient is a bucket client for b's fakes that lends VMs narrowed Google tokens
// (buckets.Client.GCSReadToken), made from rootToken by b's fake GCS acting as Google's
// Security Token Service.
func LendingClient(b Buckets, rootToken string) *buckets.Client {
	sts := &http.Client{Transport: rerouteTo{target: b.GCS.URL()}}
	return buckets.New(buckets.Options{
		S3Endpoint: b.S3.URL(), Credentials: credentials.NewStaticCredentialsProvider("AKIDFILES", "secret", ""),
		GCSEndpoint: b.GCS.URL(), GCSOptions: []option.ClientOption{option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: rootToken}))},
		GCSTokenSource: oauth2.StaticTokenSource(&oauth2.Token{AccessToken: rootToken}), STSClient: sts,
	})
}

// rerouteTo sends every request to target's host, keeping its path: sts.googleapis.com for a
// test.
type rerouteTo struct{ target string }

func (r rerouteTo) RoundTrip(req *http.Request) (*http.Response, error) {
	u, err := url.Parse(r.target)
	if err != nil {
		return nil, err
	}
	req = req.Clone(req.Context())
	req.URL.Scheme, req.URL.Host, req.Host = u.Scheme, u.Host, u.Host
	return http.DefaultTransport.RoundTrip(req)
}
