package nodefiles

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
)

// TestMountCommand: each mode and store mounts with SkyPilot's client and flags.
func TestMountCommand(t *testing.T) {
	tests := map[string]struct {
		src  string
		mode configs.MountMode
		want []string
	}{
		"s3 MOUNT": {"s3://b/ckpt/", configs.ModeMount, []string{
			"goofys -o allow_other --stat-cache-ttl 5s --type-cache-ttl 5s --log-file \"$ferry_mounts\"/0.log 'b:ckpt' DIR",
			// goofys has no ARM build: rclone there, as SkyPilot does.
			`if [ "$(ferry_arch)" = arm64 ]; then ferry_install rclone && rclone mount ':s3:b/ckpt' DIR --s3-env-auth=true`,
		}},
		"gs MOUNT": {"gs://b/ckpt", configs.ModeMount, []string{
			"gcsfuse --log-file \"$ferry_mounts\"/0.log -o allow_other --implicit-dirs --stat-cache-capacity 4096 --stat-cache-ttl 5s --type-cache-ttl 5s --rename-dir-limit 10000 --only-dir 'ckpt' 'b' DIR",
		}},
		"s3 MOUNT_CACHED": {"s3://b", configs.ModeMountCached, []string{
			"rclone mount ':s3:b' DIR --s3-env-auth=true --s3-provider=AWS --daemon --daemon-wait 10s --allow-other",
			"--vfs-cache-mode full --dir-cache-time 10s --vfs-cache-poll-interval 10s --vfs-write-back 1s --vfs-cache-max-size 10G",
		}},
		"gs MOUNT_CACHED": {"gs://b/x", configs.ModeMountCached, []string{"rclone mount ':gcs:b/x' DIR --gcs-env-auth=true --gcs-bucket-policy-only=true"}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			u, _, err := ParseBucketURL(tt.src)
			if err != nil {
				t.Fatal(err)
			}
			got := mountCommand(FileMount{Dst: "/ckpt", Src: tt.src, Bucket: &u, Mode: tt.mode}, 0, "DIR")
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("mount command lacks\n  %s\nin\n  %s", w, got)
				}
			}
		})
	}
}

// runMountsEnd runs ferry_mounts_end for one MOUNT_CACHED mount whose rclone log is log, with
// ferry_unmount recording its calls and each poll's sleep noted in polls, in the background,
// and returns its output when it ends.
func runMountsEnd(t *testing.T, log, polls string, env ...string) <-chan string {
	t.Helper()
	script := "sleep() { echo polled >> " + ShellQuote(polls) + "; command sleep \"$@\"; }\n" +
		mountsEnd([]string{"/mnt/a"}, []string{log}) + "ferry_unmount() { echo \"unmounted $1\"; }\nferry_mounts_end\n"
	cmd := exec.Command("bash", "-c", script)
	cmd.Env = append(os.Environ(), env...)
	out := make(chan string, 1)
	go func() {
		b, _ := cmd.CombinedOutput()
		out <- string(b)
	}()
	return out
}

func appendLine(t *testing.T, path, line string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		t.Fatal(err)
	}
}

// TestMountsEndWaitsForUploads: the end of a job node waits for a cleaned line logged after it
// began that shows nothing left to upload (an older one that says so does not count), then
// unmounts.
func TestMountsEndWaitsForUploads(t *testing.T) {
	dir := t.TempDir()
	log, polls := filepath.Join(dir, "0.log"), filepath.Join(dir, "polls")
	appendLine(t, log, "INFO  : vfs cache: cleaned: objects 1 (was 1) in use 0, to upload 0, uploading 0, total size 1 (was 1)")
	done := runMountsEnd(t, log, polls)
	waitPolls(t, polls, 1)
	appendLine(t, log, "INFO  : vfs cache: cleaned: objects 2 (was 2) in use 0, to upload 1, uploading 0, total size 2 (was 2)")
	waitPolls(t, polls, 3) // it has read the new line at least once since
	select {
	case out := <-done:
		t.Fatalf("ended while an upload was queued:\n%s", out)
	default:
	}
	appendLine(t, log, "INFO  : vfs cache: cleaned: objects 2 (was 2) in use 0, to upload 0, uploading 0, total size 2 (was 2)")
	out := <-done
	if !strings.Contains(out, "waiting for MOUNT_CACHED uploads") || !strings.HasSuffix(out, "unmounted /mnt/a\n") {
		t.Errorf("output:\n%s", out)
	}
}

// TestMountsEndGivesUpOnASilentRclone: an rclone that stops logging (it died) is given up on
// after FERRY_MOUNT_FLUSH_QUIET seconds, with a warning, and the mounts are unmounted.
func TestMountsEndGivesUpOnASilentRclone(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "0.log")
	appendLine(t, log, "INFO  : vfs cache: cleaned: objects 1 (was 1) in use 0, to upload 1, uploading 0, total size 1 (was 1)")
	out := <-runMountsEnd(t, log, filepath.Join(dir, "polls"), "FERRY_MOUNT_FLUSH_QUIET=2")
	if !strings.Contains(out, "rclone logged nothing for a minute") || !strings.HasSuffix(out, "unmounted /mnt/a\n") {
		t.Errorf("output:\n%s", out)
	}
}

// waitPolls waits until the flush has polled n times (its sleeps, noted in polls).
func waitPolls(t *testing.T, polls string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(polls)
		if strings.Count(string(b), "polled") >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the flush did not poll %d times", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
