package fakefuse_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher/buckets/fakefuse"
	"github.com/ferryserve/ferry/launcher/buckets/fakegcs"
	"github.com/ferryserve/ferry/launcher/buckets/fakes3"
)

// run runs a stand-in as a boot script would, by name on PATH.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	return string(out), err
}

// waitFor polls cond (a state of the bucket or the mount point the daemon reaches by itself).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func read(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// TestGoofysWithInstanceProfile: goofys BUCKET:PREFIX DIR, as the boot script writes it, with
// no credentials in the environment: the stand-in signs with the role credentials of the
// instance metadata service, brings the objects there before it returns, uploads what is
// written, and makes a last round when fusermount -u unmounts it.
func TestGoofysWithInstanceProfile(t *testing.T) {
	fakefuse.Install(t)
	s3 := fakes3.New()
	t.Cleanup(s3.Close)
	s3.Put("ckpt", "run/checkpoint.json", []byte(`{"step": 5}`))
	imds := http.NewServeMux()
	imds.HandleFunc("PUT /latest/api/token", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("tok")) })
	imds.HandleFunc("GET /latest/meta-data/iam/security-credentials/", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-aws-ec2-metadata-token") != "tok" {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		if role := strings.TrimPrefix(r.URL.Path, "/latest/meta-data/iam/security-credentials/"); role != "" {
			_, _ = w.Write([]byte(`{"Code":"Success","AccessKeyId":"ASIAROLE","SecretAccessKey":"s","Token":"t","Expiration":"2100-01-01T00:00:00Z"}`))
			return
		}
		_, _ = w.Write([]byte("ferry-mounts\n"))
	})
	srv := httptest.NewServer(imds)
	t.Cleanup(srv.Close)
	t.Setenv("FERRY_IMDS_ENDPOINT", srv.URL)
	t.Setenv("AWS_ENDPOINT_URL_S3", s3.URL())

	dir := t.TempDir()
	if out, err := run(t, "goofys", "-o", "allow_other", "--stat-cache-ttl", "5s", "--type-cache-ttl", "5s", "ckpt:run", dir); err != nil {
		t.Fatalf("goofys: %v\n%s", err, out)
	}
	if got := read(filepath.Join(dir, "checkpoint.json")); got != `{"step": 5}` {
		t.Fatalf("mounted dir holds %q before goofys returned, want the object", got)
	}
	if out, err := run(t, "goofys", "ckpt:run", dir); err == nil {
		t.Errorf("a second mount at the same point succeeded:\n%s", out)
	}
	if err := os.WriteFile(filepath.Join(dir, "checkpoint.json"), []byte(`{"step": 6}`), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the write to reach the bucket", func() bool { b, _ := s3.Get("ckpt", "run/checkpoint.json"); return string(b) == `{"step": 6}` })
	s3.Put("ckpt", "run/other.txt", []byte("from another node"))
	waitFor(t, "another node's object to appear", func() bool { return read(filepath.Join(dir, "other.txt")) == "from another node" })

	if err := os.WriteFile(filepath.Join(dir, "last.txt"), []byte("at unmount"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, "fusermount", "-u", dir); err != nil {
		t.Fatalf("fusermount -u: %v\n%s", err, out)
	}
	if b, ok := s3.Get("ckpt", "run/last.txt"); !ok || string(b) != "at unmount" {
		t.Errorf("a write before unmount is not in the bucket after it: %q %v", b, ok)
	}
	if out, err := run(t, "fusermount", "-u", dir); err == nil || !strings.Contains(out, "not found") {
		t.Errorf("unmounting twice: %v\n%s", err, out)
	}
	for _, w := range s3.Writes() {
		if w.AccessKey != "ASIAROLE" || !w.SessionToken {
			t.Errorf("write %+v not signed with the instance profile's role", w)
		}
	}
}

// TestRcloneCachedLogsItsQueue: rclone mount :gcs:BUCKET/PREFIX DIR --daemon --vfs-cache-mode
// full with the VM's service-account token: its log shows the VFS cache's upload queue empty
// once a write is uploaded, which is what the boot script's flush waits for.
func TestRcloneCachedLogsItsQueue(t *testing.T) {
	fakefuse.Install(t)
	gcs := fakegcs.New(fakegcs.Options{Token: "vm-token"})
	t.Cleanup(gcs.Close)
	gcs.MakeBucket("ckpt")
	meta := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Metadata-Flavor") != "Google" {
			http.Error(w, "no flavor", http.StatusForbidden)
			return
		}
		_, _ = w.Write([]byte(`{"access_token":"vm-token","expires_in":3599,"token_type":"Bearer"}`))
	}))
	t.Cleanup(meta.Close)
	t.Setenv("FERRY_GCE_METADATA_URL", meta.URL)
	t.Setenv("STORAGE_EMULATOR_HOST", gcs.URL())

	dir, log := t.TempDir(), filepath.Join(t.TempDir(), "rclone.log")
	out, err := run(t, "rclone", "mount", ":gcs:ckpt/run", dir, "--gcs-env-auth=true", "--daemon", "--daemon-wait", "10s",
		"--log-file", log, "--log-level", "INFO", "--allow-other", "--vfs-cache-mode", "full", "--vfs-write-back", "1s")
	if err != nil {
		t.Fatalf("rclone: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, "model.bin"), []byte("weights"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the write to reach the bucket", func() bool { b, _ := gcs.Get("ckpt", "run/model.bin"); return string(b) == "weights" })
	waitFor(t, "the log to show nothing left to upload", func() bool {
		lines := strings.Split(strings.TrimSpace(read(log)), "\n")
		return strings.Contains(lines[len(lines)-1], "vfs cache: cleaned: objects 1 (was 1) in use 0, to upload 0, uploading 0")
	})
	if out, err := run(t, "fusermount3", "-u", dir); err != nil {
		t.Fatalf("fusermount3 -u: %v\n%s", err, out)
	}
	if w := gcs.Writes(); len(w) != 1 || w[0].Token != "vm-token" {
		t.Errorf("writes %+v, want one with the VM's token", w)
	}
}

// TestRefusals: what the real clients would refuse, the stand-ins refuse: an unknown flag, a
// missing mount point, a missing bucket, :s3: without env auth.
func TestRefusals(t *testing.T) {
	fakefuse.Install(t)
	s3 := fakes3.New()
	t.Cleanup(s3.Close)
	t.Setenv("AWS_ENDPOINT_URL_S3", s3.URL())
	t.Setenv("AWS_ACCESS_KEY_ID", "AKID")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	dir := t.TempDir()
	for name, args := range map[string][]string{
		"unknown flag":      {"goofys", "--no-such-flag", "b", dir},
		"missing dir":       {"goofys", "b", filepath.Join(dir, "nope")},
		"missing bucket":    {"goofys", "no-such-bucket", dir},
		"s3 without auth":   {"rclone", "mount", ":s3:b", dir, "--daemon"},
		"rclone foreground": {"rclone", "mount", ":s3:b", dir, "--s3-env-auth=true"},
	} {
		t.Run(name, func(t *testing.T) {
			if out, err := run(t, args...); err == nil {
				t.Errorf("%v succeeded:\n%s", args, out)
			}
		})
	}
}
