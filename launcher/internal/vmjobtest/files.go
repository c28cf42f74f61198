package vmjobtest

import (
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"golang.org/x/oauth2"
	"google.golang.org/api/option"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/buckets"
	"github.com/ferryserve/ferry/launcher/buckets/fakegcs"
	"github.com/ferryserve/ferry/launcher/buckets/fakes3"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// Buckets are the fake S3 and GCS a VM cloud's provider reads file_mounts from, holding the
// objects CheckFiles mounts.
type Buckets struct {
	S3  *fakes3.Server
	GCS *fakegcs.Server
	// Client is what the provider's Options.Buckets should be.
	Client nodefiles.Buckets
}

// NewBuckets starts the fakes; the fake GCS accepts only gcsToken (the token the cloud's
// fake metadata server gives a VM).
func NewBuckets(t *testing.T, gcsToken string) Buckets {
	t.Helper()
	s3 := fakes3.New()
	t.Cleanup(s3.Close)
	gcs := fakegcs.New(fakegcs.Options{Token: gcsToken})
	t.Cleanup(gcs.Close)
	s3.Put("models", "llama/config.json", []byte("s3-config"))
	s3.Put("models", "llama/shards/0.bin", []byte("s3-shard"))
	gcs.Put("datasets", "train/part-0.txt", []byte("gcs-part"))
	return Buckets{S3: s3, GCS: gcs, Client: buckets.New(buckets.Options{
		S3Endpoint: s3.URL(), Credentials: credentials.NewStaticCredentialsProvider("AKIDFILES", "secret", ""),
		GCSEndpoint: gcs.URL(), GCSOptions: []option.ClientOption{option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: gcsToken}))},
	})}
}

// CheckFiles launches a job node with a workdir, a local directory and file, an S3 prefix
// and (withGCS) a GCS prefix mounted, and checks that setup and run start in the synced
// workdir and read every file at its remote path (under FERRY_FILES_ROOT, the fake VM's disk),
// the bucket objects fetched by the VM itself: presigned S3 GETs, GCS media with the VM's
// token.
func CheckFiles(t *testing.T, c Cloud, b Buckets, withGCS bool) {
	t.Helper()
	work, local := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(work, "train.py"), "print('train')")
	writeFile(t, filepath.Join(local, "conf", "a.yaml"), "a: 1")
	writeFile(t, filepath.Join(local, "notes.txt"), "notes")
	s := c.Spec("files", "test -f train.py && echo setup-in-workdir", `r=$FERRY_FILES_ROOT
cat train.py; echo
cat "$r/etc/app/a.yaml" "$r$HOME/notes.txt" "$r/models/config.json" "$r/models/shards/0.bin"; echo
[ -z "$WANT_GCS" ] || cat "$r$HOME/data/part-0.txt"`)
	s.Workdir = work
	s.FileMounts = map[string]string{
		"/etc/app":    filepath.Join(local, "conf"),
		"~/notes.txt": filepath.Join(local, "notes.txt"),
		"/models":     "s3://models/llama",
	}
	s.Envs = map[string]string{"WANT_GCS": ""}
	if withGCS {
		s.FileMounts["data"] = "gs://datasets/train"
		s.Envs["WANT_GCS"] = "1"
	}
	in, err := c.Provider.Launch(Context(t), s)
	if err != nil {
		t.Fatal(err)
	}
	if got := WaitExited(t, c, in); got != 0 {
		t.Fatalf("exit code %d, want 0; console:\n%s", got, c.Console(in))
	}
	want := []string{"setup-in-workdir", "print('train')", "a: 1notess3-configs3-shard"}
	if withGCS {
		want = append(want, "gcs-part")
	}
	console := c.Console(in)
	for _, w := range want {
		if !strings.Contains(console, w) {
			t.Errorf("console lacks %q:\n%s", w, console)
		}
	}
	if b.S3.Presigned() != 2 {
		t.Errorf("%d presigned S3 GETs, want 2 (one per object, made by the VM)", b.S3.Presigned())
	}
	if withGCS && b.GCS.Downloads() != 1 {
		t.Errorf("%d GCS media downloads, want 1", b.GCS.Downloads())
	}
}

// CheckFilesRefused: what the boot script cannot carry or fetch fails the launch with
// nodefiles.ErrFiles before any VM exists: a workdir past the cloud's boot payload limit, a
// missing bucket, a missing local path.
func CheckFilesRefused(t *testing.T, c Cloud, payloadLimit int) {
	t.Helper()
	big := t.TempDir()
	noise := make([]byte, payloadLimit) // random bytes do not compress
	_, _ = rand.Read(noise)
	writeFile(t, filepath.Join(big, "blob"), string(noise))
	for name, mutate := range map[string]func(*launcher.Spec){
		"workdir too big":    func(s *launcher.Spec) { s.Workdir = big },
		"missing bucket":     func(s *launcher.Spec) { s.FileMounts = map[string]string{"/m": "s3://no-such-bucket/x"} },
		"missing local path": func(s *launcher.Spec) { s.FileMounts = map[string]string{"/m": "/nonexistent/ferry"} },
	} {
		t.Run(name, func(t *testing.T) {
			s := c.Spec("refused", "", "true")
			mutate(&s)
			_, err := c.Provider.Launch(Context(t), s)
			if !errors.Is(err, nodefiles.ErrFiles) {
				t.Fatalf("Launch = %v, want ErrFiles", err)
			}
			if name == "workdir too big" && !strings.Contains(err.Error(), "bucket") {
				t.Errorf("error %q does not say to use a bucket", err)
			}
		})
	}
	insts, err := c.Provider.List(Context(t), map[string]string{launcher.LabelJob: Job})
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range insts {
		if in.Name == "refused" || strings.HasPrefix(in.Name, "refused") {
			t.Errorf("a refused launch left %s", in.ID)
		}
	}
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}
