package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"golang.org/x/oauth2"
	"google.golang.org/api/option"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/buckets"
	"github.com/ferryserve/ferry/launcher/buckets/fakegcs"
	"github.com/ferryserve/ferry/launcher/buckets/fakes3"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// TestFileMountsLocal runs a task whose file_mounts are a local directory, a local file, an
// S3 prefix and a GCS object, and checks the run reads each where its remote path says.
func TestFileMountsLocal(t *testing.T) {
	s3 := fakes3.New()
	t.Cleanup(s3.Close)
	gcs := fakegcs.New(fakegcs.Options{Token: "tok"})
	t.Cleanup(gcs.Close)
	s3.Put("models", "llama/config.json", []byte("from-s3"))
	s3.Put("models", "llama/sub/w.bin", []byte("weights"))
	gcs.Put("ds", "train.txt", []byte("from-gcs"))
	b := buckets.New(buckets.Options{
		S3Endpoint: s3.URL(), Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
		GCSEndpoint: gcs.URL(), GCSOptions: []option.ClientOption{option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: "tok"}))},
	})
	src := t.TempDir()
	writeFiles(t, src, map[string]string{"conf/a.yaml": "a: 1", "notes.txt": "local-file"})
	p := newProvider(t, Options{Buckets: b})
	inst, err := p.Launch(context.Background(), launcher.Spec{
		Name: "fm",
		FileMounts: map[string]string{
			"/etc/app":       filepath.Join(src, "conf"),
			"~/notes.txt":    filepath.Join(src, "notes.txt"),
			"/models/llama":  "s3://models/llama",
			"data/train.txt": "gs://ds/train.txt",
		},
		Run: `r=$FERRY_FILES_ROOT; cat "$r/etc/app/a.yaml" "$r$HOME/notes.txt" "$r/models/llama/config.json" "$r/models/llama/sub/w.bin" "$r$HOME/data/train.txt"`,
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "instance to end", func() bool { return listOne(t, p, nil).State == launcher.StateTerminated })
	out := readFile(t, filepath.Join(p.opts.Dir, inst.ID, logFile))
	if want := "a: 1local-filefrom-s3weightsfrom-gcs"; out != want {
		t.Errorf("run printed %q, want %q", out, want)
	}
}

// TestFileMountsLocalErrors: a missing local path and a missing bucket fail the launch with
// ErrFiles (the task must change), and leave nothing behind.
func TestFileMountsLocalErrors(t *testing.T) {
	s3 := fakes3.New()
	t.Cleanup(s3.Close)
	b := buckets.New(buckets.Options{S3Endpoint: s3.URL(), Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", "")})
	p := newProvider(t, Options{Buckets: b})
	for name, mounts := range map[string]map[string]string{
		"missing local path": {"/data": "/nonexistent/ferry-test-path"},
		"missing bucket":     {"/data": "s3://no-such-bucket/x"},
		"unsupported scheme": {"/data": "r2://bucket/x"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := p.Launch(context.Background(), launcher.Spec{Name: "bad", FileMounts: mounts, Run: "true"})
			if !errors.Is(err, nodefiles.ErrFiles) || !errors.Is(err, launcher.ErrInvalid) {
				t.Fatalf("Launch = %v, want ErrFiles", err)
			}
			if insts, _ := p.List(context.Background(), nil); len(insts) != 0 {
				t.Errorf("instances left after a failed launch: %v", insts)
			}
			if left, _ := os.ReadDir(p.opts.WorkRoot); len(left) != 0 {
				t.Errorf("working directories left: %v", left)
			}
		})
	}
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
