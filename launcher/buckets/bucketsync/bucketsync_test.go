package bucketsync_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/oauth2"
	"google.golang.org/api/option"

	"github.com/ferryserve/ferry/launcher/buckets"
	"github.com/ferryserve/ferry/launcher/buckets/bucketsync"
	"github.com/ferryserve/ferry/launcher/buckets/fakegcs"
	"github.com/ferryserve/ferry/launcher/buckets/fakes3"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// bucket is one fake bucket seen through the real client: what a test writes and reads
// there stands for another machine's writes.
type bucket struct {
	client *buckets.Client
	url    nodefiles.BucketURL
	get    func(key string) ([]byte, bool)
}

func (b bucket) put(t *testing.T, key, body string) {
	t.Helper()
	if _, err := b.client.Put(context.Background(), b.url, key, bytes.NewReader([]byte(body)), int64(len(body))); err != nil {
		t.Fatal(err)
	}
}

func newBuckets(t *testing.T) map[string]bucket {
	s3 := fakes3.New()
	t.Cleanup(s3.Close)
	gcs := fakegcs.New(fakegcs.Options{Token: "tok"})
	t.Cleanup(gcs.Close)
	s3.MakeBucket("ckpt")
	gcs.MakeBucket("ckpt")
	c := buckets.New(buckets.Options{
		S3Endpoint: s3.URL(), Credentials: credentials.NewStaticCredentialsProvider("AKID", "SECRET", ""),
		GCSEndpoint: gcs.URL(), GCSOptions: []option.ClientOption{option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: "tok"}))},
	})
	return map[string]bucket{
		"s3": {client: c, url: nodefiles.BucketURL{Scheme: "s3", Bucket: "ckpt", Prefix: "run"}, get: func(k string) ([]byte, bool) { return s3.Get("ckpt", k) }},
		"gs": {client: c, url: nodefiles.BucketURL{Scheme: "gs", Bucket: "ckpt", Prefix: "run"}, get: func(k string) ([]byte, bool) { return gcs.Get("ckpt", k) }},
	}
}

func write(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

func sync(t *testing.T, m *bucketsync.Mirror) bucketsync.Stats {
	t.Helper()
	st, err := m.Sync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestMirror: a mount starts with the bucket's objects; a file written here reaches the
// bucket, an object written elsewhere reaches here, deletions go both ways, a key outside the
// prefix is left alone, and when both sides changed one file, this side wins.
func TestMirror(t *testing.T) {
	for scheme, b := range newBuckets(t) {
		t.Run(scheme, func(t *testing.T) {
			b.put(t, "run/checkpoint.json", `{"step": 10}`)
			b.put(t, "run/logs/a.txt", "a")
			b.put(t, "runner/other.txt", "not under run/")
			dir := filepath.Join(t.TempDir(), "mnt")
			m := bucketsync.New(b.client, b.url, dir)

			st := sync(t, m)
			if st.Downloaded != 2 || read(filepath.Join(dir, "checkpoint.json")) != `{"step": 10}` || read(filepath.Join(dir, "logs/a.txt")) != "a" {
				t.Fatalf("first round %+v; dir: %q %q", st, read(filepath.Join(dir, "checkpoint.json")), read(filepath.Join(dir, "logs/a.txt")))
			}
			if _, err := os.Stat(filepath.Join(dir, "..", "runner")); err == nil {
				t.Errorf("a key outside the prefix was mirrored")
			}

			write(t, filepath.Join(dir, "checkpoint.json"), `{"step": 20}`)
			write(t, filepath.Join(dir, "sub/new.bin"), "new")
			if err := os.Remove(filepath.Join(dir, "logs/a.txt")); err != nil {
				t.Fatal(err)
			}
			st = sync(t, m)
			if diff := cmp.Diff(bucketsync.Stats{Objects: 2, Uploaded: 2, Deleted: 1, Bytes: int64(len(`{"step": 20}`) + 3)}, st); diff != "" {
				t.Errorf("push round (-want +got):\n%s", diff)
			}
			if got, _ := b.get("run/checkpoint.json"); string(got) != `{"step": 20}` {
				t.Errorf("bucket has %q, want the local write", got)
			}
			if got, ok := b.get("run/sub/new.bin"); !ok || string(got) != "new" {
				t.Errorf("new file not uploaded: %q %v", got, ok)
			}
			if _, ok := b.get("run/logs/a.txt"); ok {
				t.Errorf("deleted file still in the bucket")
			}

			b.put(t, "run/checkpoint.json", `{"step": 30}`)
			b.put(t, "run/from-elsewhere.txt", "elsewhere")
			if err := b.client.Delete(context.Background(), b.url, "run/sub/new.bin"); err != nil {
				t.Fatal(err)
			}
			st = sync(t, m)
			if st.Downloaded != 2 || st.Deleted != 1 || st.Uploaded != 0 {
				t.Errorf("pull round %+v, want 2 downloads, 1 deletion, no upload", st)
			}
			if read(filepath.Join(dir, "checkpoint.json")) != `{"step": 30}` || read(filepath.Join(dir, "from-elsewhere.txt")) != "elsewhere" {
				t.Errorf("remote writes not here: %q %q", read(filepath.Join(dir, "checkpoint.json")), read(filepath.Join(dir, "from-elsewhere.txt")))
			}
			if _, err := os.Stat(filepath.Join(dir, "sub/new.bin")); !os.IsNotExist(err) {
				t.Errorf("remote deletion not here: %v", err)
			}

			// Both sides change one file between rounds: this side's write wins.
			b.put(t, "run/checkpoint.json", `{"step": 40, "elsewhere": true}`)
			write(t, filepath.Join(dir, "checkpoint.json"), `{"step": 41}`)
			sync(t, m)
			if got, _ := b.get("run/checkpoint.json"); string(got) != `{"step": 41}` || read(filepath.Join(dir, "checkpoint.json")) != `{"step": 41}` {
				t.Errorf("conflict: bucket %q, here %q; want this side's write on both", got, read(filepath.Join(dir, "checkpoint.json")))
			}

			// A new mirror (a recovered job's new machine) starts from what the bucket holds.
			fresh := filepath.Join(t.TempDir(), "mnt")
			sync(t, bucketsync.New(b.client, b.url, fresh))
			if read(filepath.Join(fresh, "checkpoint.json")) != `{"step": 41}` {
				t.Errorf("a new mount reads %q, want the last write", read(filepath.Join(fresh, "checkpoint.json")))
			}
		})
	}
}

// writingStore writes a file into the mount while the round lists the bucket: a program
// writing during the round.
type writingStore struct {
	*buckets.Client
	path string
}

func (w writingStore) ListMount(ctx context.Context, u nodefiles.BucketURL) ([]nodefiles.BucketObject, error) {
	if err := os.WriteFile(w.path, []byte("written during the round"), 0o644); err != nil {
		return nil, err
	}
	return w.Client.ListMount(ctx, u)
}

// TestPendingAndRun: a file written during a round is pending after it (MOUNT_CACHED's "to
// upload"), and goes up at the next tick.
func TestPendingAndRun(t *testing.T) {
	b := newBuckets(t)["s3"]
	dir := t.TempDir()
	b.put(t, "run/late.txt", "an older object")
	m := bucketsync.New(writingStore{b.client, filepath.Join(dir, "late.txt")}, b.url, dir)
	if st := sync(t, m); st.Pending != 1 || st.Downloaded != 0 {
		t.Fatalf("round %+v, want 1 pending and the object not downloaded over it", st)
	}
	if got := read(filepath.Join(dir, "late.txt")); got != "written during the round" {
		t.Fatalf("the write during the round was replaced by %q", got)
	}
	if got, _ := b.get("run/late.txt"); string(got) != "an older object" {
		t.Fatal("uploaded before a round pushed it")
	}
	ctx, cancel := context.WithCancel(context.Background())
	tick := make(chan time.Time)
	rounds := make(chan bucketsync.Stats, 2)
	done := make(chan struct{})
	go func() {
		m.Run(ctx, tick, func(st bucketsync.Stats, err error) {
			if err != nil {
				t.Error(err)
			}
			rounds <- st
		})
		close(done)
	}()
	tick <- time.Now()
	if st := <-rounds; st.Uploaded != 1 {
		t.Errorf("tick round %+v, want the pending file uploaded", st)
	}
	cancel()
	<-done
	if got, ok := b.get("run/late.txt"); !ok || string(got) != "written during the round" {
		t.Errorf("bucket has %q %v", got, ok)
	}
}

// TestWriteBack: with a write-back delay, a file goes up only once it has not changed for
// that long, and is pending until then (rclone's --vfs-write-back).
func TestWriteBack(t *testing.T) {
	b := newBuckets(t)["gs"]
	dir := t.TempDir()
	m := bucketsync.New(b.client, b.url, dir)
	now := time.Now()
	m.WriteBack, m.Clock = time.Second, func() time.Time { return now }
	write(t, filepath.Join(dir, "model.bin"), "weights")
	if err := os.Chtimes(filepath.Join(dir, "model.bin"), now, now.Add(-500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if st := sync(t, m); st.Uploaded != 0 || st.Pending != 1 {
		t.Fatalf("round half a second after the write: %+v, want it pending", st)
	}
	now = now.Add(600 * time.Millisecond)
	if st := sync(t, m); st.Uploaded != 1 || st.Pending != 0 {
		t.Fatalf("round past the write-back delay: %+v, want it uploaded", st)
	}
	if got, _ := b.get("run/model.bin"); string(got) != "weights" {
		t.Errorf("bucket has %q", got)
	}
}

// TestSymlinkOutOfTheMountIsNotFollowed: a program in the instance that puts a symbolic link out
// of the directory in place of a subdirectory (at the controller's home, say) gets neither the
// bucket's objects written there nor the files there uploaded; the mount's other files still
// sync, and the round reports the one it skipped.
func TestSymlinkOutOfTheMountIsNotFollowed(t *testing.T) {
	b := newBuckets(t)["s3"]
	b.put(t, "run/keys/authorized_keys", "attacker's key")
	b.put(t, "run/ok.txt", "fine")
	outside := t.TempDir()
	write(t, filepath.Join(outside, "secret"), "the controller's secret")
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "keys")); err != nil {
		t.Fatal(err)
	}
	m := bucketsync.New(b.client, b.url, dir)
	st, err := m.Sync(context.Background())
	if err == nil || !strings.Contains(err.Error(), "keys/authorized_keys") {
		t.Errorf("round error %v, want one naming the skipped file", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "authorized_keys")); !os.IsNotExist(err) {
		t.Errorf("an object was written through the link, out of the mount (%v)", err)
	}
	if read(filepath.Join(dir, "ok.txt")) != "fine" || st.Downloaded != 1 {
		t.Errorf("the mount's other object: %q, %+v", read(filepath.Join(dir, "ok.txt")), st)
	}
	if _, ok := b.get("run/keys/secret"); ok {
		t.Errorf("a file out of the mount was uploaded through the link")
	}

	// Swapped in after the first round, for a file the mirror already holds: still confined.
	write(t, filepath.Join(dir, "sub/own.txt"), "own")
	if _, err := m.Sync(context.Background()); err == nil {
		t.Fatalf("the skipped file is still reported each round: want an error")
	}
	if err := os.RemoveAll(filepath.Join(dir, "sub")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "sub")); err != nil {
		t.Fatal(err)
	}
	b.put(t, "run/sub/own.txt", "changed elsewhere")
	_, _ = m.Sync(context.Background())
	if read(filepath.Join(outside, "own.txt")) != "<open "+filepath.Join(outside, "own.txt")+": no such file or directory>" {
		t.Errorf("an object was written through a link swapped in later: %q", read(filepath.Join(outside, "own.txt")))
	}
}
