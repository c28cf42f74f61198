package local

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/buckets"
	"github.com/ferryserve/ferry/launcher/buckets/fakes3"
)

// TestMountedBucketLocal: a local instance's MOUNT bucket is a directory under its files root
// kept in step with the bucket while it runs: the bucket's objects are there at start, the
// program's write reaches the bucket while it runs, an object written elsewhere reaches the
// program, and what it writes last is uploaded by Terminate's last round.
func TestMountedBucketLocal(t *testing.T) {
	s3 := fakes3.New()
	t.Cleanup(s3.Close)
	s3.Put("ckpt", "run/step", []byte("1\n"))
	b := buckets.New(buckets.Options{S3Endpoint: s3.URL(), Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", "")})
	p := newProvider(t, Options{Buckets: b})
	p.mounts.interval = 20 * time.Millisecond
	inst, err := p.Launch(context.Background(), launcher.Spec{
		Name:       "mnt",
		FileMounts: map[string]string{"/ckpt": "s3://ckpt/run"},
		MountModes: map[string]configs.MountMode{"/ckpt": configs.ModeMount},
		Run: `d=$FERRY_FILES_ROOT/ckpt
echo "started at step $(cat "$d/step")"
echo 2 > "$d/step"
until [ -f "$d/go" ]; do sleep 0.02; done
echo done > "$d/last"`,
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the run's write to reach the bucket", func() bool { got, _ := s3.Get("ckpt", "run/step"); return string(got) == "2\n" })
	s3.Put("ckpt", "run/go", []byte("from elsewhere"))
	waitFor(t, 10*time.Second, "instance to end", func() bool { return listOne(t, p, nil).State == launcher.StateTerminated })
	if err := p.Terminate(context.Background(), inst.ID); err != nil {
		t.Fatal(err)
	}
	if got, ok := s3.Get("ckpt", "run/last"); !ok || string(got) != "done\n" {
		t.Errorf("the run's last write is %q (%v) in the bucket after Terminate, want done", got, ok)
	}
	log := readFile(t, filepath.Join(p.opts.Dir, logsDir, "mnt.log"))
	if log != "started at step 1\n" {
		t.Errorf("run printed %q, want it to start from the bucket's step", log)
	}
}

// TestMountedBucketLocalTerminate: Terminate of a running instance uploads what it wrote to a
// mounted bucket before its directory goes (no round ran meanwhile).
func TestMountedBucketLocalTerminate(t *testing.T) {
	s3 := fakes3.New()
	t.Cleanup(s3.Close)
	s3.MakeBucket("ckpt")
	b := buckets.New(buckets.Options{S3Endpoint: s3.URL(), Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", "")})
	p := newProvider(t, Options{Buckets: b})
	p.mounts.interval = time.Hour
	inst, err := p.Launch(context.Background(), launcher.Spec{
		Name:       "mnt-kill",
		FileMounts: map[string]string{"/ckpt": "s3://ckpt"},
		MountModes: map[string]configs.MountMode{"/ckpt": configs.ModeMountCached},
		Run:        `echo saved > "$FERRY_FILES_ROOT/ckpt/checkpoint"; exec sleep 600`,
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the run's write", func() bool {
		return readFile(t, filepath.Join(p.opts.Dir, inst.ID, filesDir, "ckpt", "checkpoint")) == "saved\n"
	})
	if err := p.Terminate(context.Background(), inst.ID); err != nil {
		t.Fatal(err)
	}
	if got, ok := s3.Get("ckpt", "checkpoint"); !ok || string(got) != "saved\n" {
		t.Errorf("bucket has %q (%v) after Terminate, want the run's write", got, ok)
	}
}
