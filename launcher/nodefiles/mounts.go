package nodefiles

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// A bucket that a task mounts (SkyPilot's MOUNT and MOUNT_CACHED) is mounted where the task
// runs with the FUSE client SkyPilot uses, installed at boot when the image lacks it, with the
// machine's own credentials for the bucket's cloud:
//
//   - MOUNT, s3://: goofys (rclone mount on ARM, where goofys has no build), which streams
//     reads and uploads a file when it is closed; MOUNT, gs://: gcsfuse, the same for GCS.
//   - MOUNT_CACHED: rclone mount with its VFS cache (--vfs-cache-mode full): reads and writes
//     go to the local disk, writes are uploaded a second after their last close
//     (--vfs-write-back 1s). When a job node's run ends, the boot script waits until rclone's
//     log says nothing is left to upload (as SkyPilot does), then unmounts.
//
// Credentials: an AWS VM runs with the IAM instance profile the provider is configured with
// (aws: mount_instance_profile), whose role must read and write the buckets; a GCP VM with the
// project's default service account and the read-write storage scope. A VM cannot mount the
// other cloud's buckets (it has no credentials for them): MountFits refuses, naming COPY. A
// pod mounts inside its own container, which then runs privileged (FUSE needs /dev/fuse and
// CAP_SYS_ADMIN), with the credentials in its environment (launcher/kubernetes/mounts.go). A
// local instance's mount is a directory kept in sync with the bucket (launcher/local).
//
// The FUSE client's versions are SkyPilot's: goofys 0.24.0 (its maintained fork), gcsfuse
// 2.2.0, rclone v1.68.2; their flags are SkyPilot's too (sky/data/mounting_utils.py).

// Versions and downloads of the FUSE clients a boot script installs when they are missing.
const (
	goofysURL      = "https://github.com/aylei/goofys/releases/download/0.24.0-aylei-upstream/goofys"
	gcsfuseVersion = "2.2.0"
	rcloneVersion  = "v1.68.2"
)

// MountFits says whether infra kind ("local", "kubernetes", "aws", "gcp") can mount m: a VM
// only its own cloud's buckets.
func MountFits(m FileMount, kind string) error {
	switch {
	case kind == "aws" && m.Bucket.Scheme == "gs":
		return fmt.Errorf("%w: file_mounts.%s: %s (mode %s): an EC2 VM has no Google credentials to mount gs:// with; write mode: COPY (fetched at launch with your Google credentials) or keep the data in s3://", ErrFiles, m.Dst, m.Src, m.Mode)
	case kind == "gcp" && m.Bucket.Scheme == "s3":
		return fmt.Errorf("%w: file_mounts.%s: %s (mode %s): a GCP VM has no AWS credentials to mount s3:// with; write mode: COPY (fetched by presigned URLs) or keep the data in gs://", ErrFiles, m.Dst, m.Src, m.Mode)
	}
	return nil
}

// mountFuncs are the shell functions the mount commands use: installing a missing client
// (as root, or through sudo), the CPU architecture's name in release files, unmounting.
const mountFuncs = `# mounts: buckets mounted with FUSE (SkyPilot's MOUNT and MOUNT_CACHED)
ferry_mounts="${FERRY_MOUNTS_DIR:-${FERRY_STATE_DIR:-/var/lib/ferry}/mounts}"
mkdir -p "$ferry_mounts"
ferry_sudo() { if [ "$(id -u)" = 0 ] || ! command -v sudo >/dev/null; then "$@"; else sudo -n "$@"; fi; }
ferry_arch() { case "$(uname -m)" in aarch64|arm64) echo arm64 ;; *) echo amd64 ;; esac; }
ferry_install() {
  command -v "$1" >/dev/null && return 0
  echo "ferry: installing $1"
  if ! command -v fusermount >/dev/null && ! command -v fusermount3 >/dev/null; then
    { command -v apt-get >/dev/null && ferry_sudo apt-get update -qq && ferry_sudo apt-get install -y -qq fuse3; } ||
      { command -v yum >/dev/null && ferry_sudo yum install -y -q fuse3; } || { echo "ferry: cannot install fuse3" >&2; return 1; }
  fi
  command -v fusermount3 >/dev/null || ferry_sudo ln -sf "$(command -v fusermount)" /usr/local/bin/fusermount3
  case "$1" in
  goofys) ferry_sudo curl -fsSL --retry 3 -o /usr/local/bin/goofys ` + goofysURL + ` && ferry_sudo chmod 755 /usr/local/bin/goofys ;;
  gcsfuse) curl -fsSL --retry 3 -o /tmp/ferry-gcsfuse.deb "https://github.com/GoogleCloudPlatform/gcsfuse/releases/download/v` + gcsfuseVersion + `/gcsfuse_` + gcsfuseVersion + `_$(ferry_arch).deb" && ferry_sudo dpkg -i /tmp/ferry-gcsfuse.deb ;;
  rclone) curl -fsSL --retry 3 -o /tmp/ferry-rclone.deb "https://downloads.rclone.org/` + rcloneVersion + `/rclone-` + rcloneVersion + `-linux-$(ferry_arch).deb" && ferry_sudo dpkg -i /tmp/ferry-rclone.deb ;;
  esac
}
ferry_unmount() { fusermount -u "$1" 2>/dev/null || fusermount3 -u "$1" 2>/dev/null || ferry_sudo umount "$1"; }
`

// mountCommand is the shell that mounts m (the i-th mount) at dir, a shell word: the client
// installed if missing, then mounted in the background, logging under $ferry_mounts. It fails
// as a command when the mount fails.
func mountCommand(m FileMount, i int, dir string) string {
	log := `"$ferry_mounts"/` + strconv.Itoa(i) + ".log"
	prefix := strings.TrimSuffix(m.Bucket.Prefix, "/")
	rclonePath := m.Bucket.Bucket
	if prefix != "" {
		rclonePath += "/" + prefix
	}
	remote, auth := ":s3:"+rclonePath, "--s3-env-auth=true --s3-provider=AWS"
	if m.Bucket.Scheme == "gs" {
		remote, auth = ":gcs:"+rclonePath, "--gcs-env-auth=true --gcs-bucket-policy-only=true"
	}
	rclone := "ferry_install rclone && rclone mount " + ShellQuote(remote) + " " + dir + " " + auth +
		" --daemon --daemon-wait 10s --allow-other --log-file " + log + " --log-level INFO"
	switch {
	case m.Mode == configs.ModeMountCached:
		return rclone + " --vfs-cache-mode full --dir-cache-time 10s --vfs-cache-poll-interval 10s --vfs-write-back 1s" +
			" --vfs-cache-max-size 10G --cache-dir \"$ferry_mounts\"/cache-" + strconv.Itoa(i) + " --vfs-fast-fingerprint"
	case m.Bucket.Scheme == "gs":
		onlyDir := ""
		if prefix != "" {
			onlyDir = " --only-dir " + ShellQuote(prefix)
		}
		return "ferry_install gcsfuse && gcsfuse --log-file " + log + " -o allow_other --implicit-dirs --stat-cache-capacity 4096" +
			" --stat-cache-ttl 5s --type-cache-ttl 5s --rename-dir-limit 10000" + onlyDir + " " + ShellQuote(m.Bucket.Bucket) + " " + dir
	}
	source := m.Bucket.Bucket
	if prefix != "" {
		source += ":" + prefix
	}
	goofys := "ferry_install goofys && goofys -o allow_other --stat-cache-ttl 5s --type-cache-ttl 5s --log-file " + log + " " + ShellQuote(source) + " " + dir
	// goofys has no ARM build; SkyPilot mounts with rclone there.
	return `if [ "$(ferry_arch)" = arm64 ]; then ` + rclone + "; else " + goofys + "; fi"
}

// mountsEnd defines ferry_mounts_end, which a job node runs after its run: it waits until
// every MOUNT_CACHED mount's rclone has uploaded what was written (a cleaned line logged after
// the wait began that says nothing is queued or uploading; rclone logs one every
// --vfs-cache-poll-interval, 10 s), giving up on an rclone that logged nothing for a minute
// (it died: what it had not uploaded stays in its cache), then unmounts every mount, deepest
// first.
func mountsEnd(dirs []string, cachedLogs []string) string {
	var b strings.Builder
	b.WriteString("ferry_mounts_end() {\n")
	for _, log := range cachedLogs {
		b.WriteString(`  ferry_seen=$(grep -c "vfs cache: cleaned:" ` + log + ` 2>/dev/null)
  ferry_last=$ferry_seen ferry_quiet=0
  echo "ferry: waiting for MOUNT_CACHED uploads to finish"
  while :; do
    ferry_now=$(grep -c "vfs cache: cleaned:" ` + log + ` 2>/dev/null)
    if [ "${ferry_now:-0}" -gt "${ferry_seen:-0}" ] && grep "vfs cache: cleaned:" ` + log + ` | tail -n 1 | grep -q "in use 0, to upload 0, uploading 0"; then
      break
    fi
    if [ "${ferry_now:-0}" = "${ferry_last:-0}" ]; then ferry_quiet=$((ferry_quiet + 1)); else ferry_quiet=0 ferry_last=$ferry_now; fi
    if [ "$ferry_quiet" -ge "${FERRY_MOUNT_FLUSH_QUIET:-60}" ]; then
      echo "ferry: rclone logged nothing for a minute: its uploads may be incomplete" >&2
      break
    fi
    sleep 1
  done
`)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		b.WriteString("  ferry_unmount " + dirs[i] + " || echo \"ferry: unmounting " + strings.ReplaceAll(dirs[i], `"`, ``) + " failed\" >&2\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// mountsShell is the mount section of a VM's boot script: mount each of f's mounted buckets
// at its path (under the files root on a fake VM), failing the boot with ferry_files_fail
// when one cannot be mounted, and define ferry_mounts_end. "" when nothing is mounted.
func mountsShell(f Files) (string, error) {
	return MountScript(f, func(_ int, m FileMount) (string, error) {
		rel, inHome, err := RemotePath(m.Dst)
		if err != nil {
			return "", err
		}
		if inHome {
			return `"$ferry_files$ferry_home"/` + ShellQuote(rel), nil
		}
		return `"$ferry_files"/` + ShellQuote(rel), nil
	}, "ferry_files_fail")
}

// MountScript is the shell that mounts f's mounted buckets, the i-th at the shell word dir
// gives for it, with the FUSE client SkyPilot uses; when one cannot be mounted it runs fail,
// a shell command, with what failed as its argument. It defines ferry_mounts_end, which waits
// for MOUNT_CACHED uploads and unmounts (to run when the task ends). "" when nothing is
// mounted.
func MountScript(f Files, dir func(i int, m FileMount) (string, error), fail string) (string, error) {
	var b strings.Builder
	var dirs, cachedLogs []string
	for i, m := range f.Mounts {
		if !m.Mounted() {
			continue
		}
		if len(dirs) == 0 {
			b.WriteString(mountFuncs)
		}
		dir, err := dir(i, m)
		if err != nil {
			return "", err
		}
		b.WriteString("echo " + ShellQuote(fmt.Sprintf("ferry: mounting %s at %s (%s)", m.Src, m.Dst, m.Mode)) + "\n")
		b.WriteString("mkdir -p " + dir + " && { " + mountCommand(m, i, dir) + "; } || " + fail + " " + ShellQuote("mount "+m.Src) + "\n")
		dirs = append(dirs, dir)
		if m.Mode == configs.ModeMountCached {
			cachedLogs = append(cachedLogs, `"$ferry_mounts"/`+strconv.Itoa(i)+".log")
		}
	}
	if len(dirs) == 0 {
		return "", nil
	}
	b.WriteString(mountsEnd(dirs, cachedLogs))
	return b.String(), nil
}

// MountsEndCall is the line of a job node's boot script, after its run, that waits for its
// mounted buckets' uploads and unmounts them (ferry_mounts_end); "" without mounts.
func MountsEndCall(spec launcher.Spec) string {
	if len(spec.MountModes) == 0 {
		return ""
	}
	return `[ "$(type -t ferry_mounts_end)" != function ] || ferry_mounts_end` + "\n"
}

// GCSReader is what a bucket client offers when it can lend a VM without Google credentials a
// short-lived token that reads the gs:// objects a task copies: the controller's own
// credentials, narrowed to read those buckets where Google allows it (launcher/buckets).
type GCSReader interface {
	// GCSReadToken is a bearer token that reads the objects under us, valid for a while.
	GCSReadToken(ctx context.Context, us []BucketURL) (string, error)
}

// bucketChecker is what CheckMounts needs of a bucket client: launcher/buckets.Client.
type bucketChecker interface {
	// CheckBucket says whether u's bucket exists and these credentials may list u, reading
	// at most one object: a mounted bucket may hold any number.
	CheckBucket(ctx context.Context, u BucketURL) error
}

// CheckMounts checks, with the controller's credentials, that every bucket f mounts exists,
// so that a missing one fails the launch with what to do rather than the instance's boot.
// Ferry creates no buckets. A client that cannot check checks nothing.
func CheckMounts(ctx context.Context, f Files, b Buckets) error {
	l, ok := b.(bucketChecker)
	if !ok {
		return nil
	}
	for _, m := range f.Mounts {
		if !m.Mounted() {
			continue
		}
		u := *m.Bucket
		u.Prefix = u.DirPrefix()
		if err := l.CheckBucket(ctx, u); err != nil {
			create := "aws s3 mb s3://" + u.Bucket
			if u.Scheme == "gs" {
				create = "gcloud storage buckets create gs://" + u.Bucket
			}
			return fmt.Errorf("file_mounts.%s: %w (Ferry mounts existing buckets and creates none: %s)", m.Dst, err, create)
		}
	}
	return nil
}
