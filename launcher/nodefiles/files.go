package nodefiles

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// A task's files reach its instances as SkyPilot's do: `workdir` is copied to ~/sky_workdir,
// where setup and run start, and each `file_mounts` entry puts a local file or directory, or a
// bucket prefix (s3://, gs://), at its remote path (relative and ~/ paths are under the home
// directory). Every infra copies them (SkyPilot's COPY mode), except the buckets a task mounts
// (MOUNT, MOUNT_CACHED: mounts.go):
//
//   - local: copied by the provider into the instance's own directory tree (FERRY_FILES_ROOT),
//     buckets read through the SDKs (Buckets);
//   - VMs: the boot script unpacks local files it carries and fetches each bucket object by a
//     URL the provider made at launch (an S3 presigned GET, a GCS media URL the VM authorises
//     with its metadata token): FilesShell;
//   - Kubernetes: a ConfigMap carries the local files, unpacked by an init container.
//
// Sources are read at launch, not at submit: a file changed in between is seen changed.

// EnvWorkdir is where the task's workdir was synced on the instance: the script cds there
// before setup.
const EnvWorkdir = "FERRY_WORKDIR"

// EnvFilesRoot prefixes the absolute remote paths of file mounts where an instance has no
// filesystem of its own: a local replica's (its directory) and a fake VM's (its disk). It is
// empty on a real VM or pod, where a mount's path is what the task wrote.
const EnvFilesRoot = "FERRY_FILES_ROOT"

// WorkdirName is the workdir's name under the home directory, as SkyPilot names it.
const WorkdirName = "sky_workdir"

// ErrFiles marks a workdir or file mount that cannot be delivered (missing path, missing
// bucket, too big for the infra's channel): the task must change, so it is also ErrInvalid.
var ErrFiles = fmt.Errorf("%w: files", launcher.ErrInvalid)

// FileMount is one file_mounts entry.
type FileMount struct {
	// Dst is the remote path as the task wrote it.
	Dst string
	// Src is a local path (absolute once resolved) or a bucket URL.
	Src string
	// Bucket is set for a bucket URL.
	Bucket *BucketURL
	// Mode is how a bucket reaches the instance: configs.ModeCopy (also every local source),
	// or mounted with FUSE (configs.ModeMount, configs.ModeMountCached: mounts.go).
	Mode configs.MountMode
}

// Mounted says the mount is a bucket mounted, not copied.
func (m FileMount) Mounted() bool {
	return m.Bucket != nil && (m.Mode == configs.ModeMount || m.Mode == configs.ModeMountCached)
}

// BucketURL is a parsed s3:// or gs:// source: a bucket and an object prefix (a single
// object when it names one).
type BucketURL struct {
	Scheme string // "s3" or "gs"
	Bucket string
	Prefix string
}

// String is the URL as written.
func (b BucketURL) String() string { return b.Scheme + "://" + b.Bucket + "/" + b.Prefix }

// BucketObject is one object under a bucket URL: its key and size.
type BucketObject struct {
	Key  string
	Size int64
	// ETag names the object's content (S3's ETag, GCS's MD5 hash): a mounted bucket's sync
	// tells a changed object by it.
	ETag string
}

// Download is how an instance fetches one object without credentials of its own: a URL and,
// for GCS, that the request needs the VM's own token.
type Download struct {
	URL          string
	NeedsGCSAuth bool
}

// Buckets reads bucket URLs for file_mounts. Implemented by launcher/buckets over the AWS and
// Google SDKs; the errors it returns wrap ErrFiles when the bucket or prefix is missing.
type Buckets interface {
	// List returns the objects under u (the one object when u names one).
	List(ctx context.Context, u BucketURL) ([]BucketObject, error)
	// Open reads one object.
	Open(ctx context.Context, u BucketURL, key string) (io.ReadCloser, error)
	// DownloadURL is a URL an instance fetches the object from.
	DownloadURL(ctx context.Context, u BucketURL, key string) (Download, error)
}

// ParseBucketURL parses s3://bucket/prefix and gs://bucket/prefix; ok is false for anything
// that is not a bucket URL (a local path).
func ParseBucketURL(s string) (BucketURL, bool, error) {
	scheme, rest, found := strings.Cut(s, "://")
	if !found {
		return BucketURL{}, false, nil
	}
	if scheme != "s3" && scheme != "gs" {
		return BucketURL{}, true, fmt.Errorf("%w: %q: only s3:// and gs:// buckets are supported (r2://, cos://, https:// are not)", ErrFiles, s)
	}
	bucket, prefix, _ := strings.Cut(rest, "/")
	if bucket == "" {
		return BucketURL{}, true, fmt.Errorf("%w: %q has no bucket name", ErrFiles, s)
	}
	if _, err := url.Parse(s); err != nil {
		return BucketURL{}, true, fmt.Errorf("%w: %q: %v", ErrFiles, s, err)
	}
	return BucketURL{Scheme: scheme, Bucket: bucket, Prefix: prefix}, true, nil
}

// ParseFileMounts turns a task's file_mounts into mounts sorted by remote path (parents before
// children, so a later mount lands inside an earlier one as on SkyPilot). Local sources must
// be absolute: the CLI resolves them against its working directory.
func ParseFileMounts(m map[string]string) ([]FileMount, error) {
	var mounts []FileMount
	var errs []error
	for _, dst := range slices.Sorted(maps.Keys(m)) {
		src := m[dst]
		fm := FileMount{Dst: dst, Src: src, Mode: configs.ModeCopy}
		if b, isURL, err := ParseBucketURL(src); err != nil {
			errs = append(errs, fmt.Errorf("file_mounts.%s: %w", dst, err))
			continue
		} else if isURL {
			fm.Bucket = &b
		} else if !filepath.IsAbs(src) {
			errs = append(errs, fmt.Errorf("%w: file_mounts.%s: local path %q is relative; the CLI makes paths absolute, submit through it", ErrFiles, dst, src))
			continue
		}
		if _, _, err := RemotePath(dst); err != nil {
			errs = append(errs, fmt.Errorf("file_mounts.%s: %w", dst, err))
			continue
		}
		mounts = append(mounts, fm)
	}
	return mounts, errors.Join(errs...)
}

// Remote splits the mount's remote path: inHome says it is under the home directory, rel is
// the clean path below home or below /.
func (m FileMount) Remote() (rel string, inHome bool, err error) { return RemotePath(m.Dst) }

// RemotePath splits a mount's remote path: home says it is under the home directory, rel is
// the clean path below home or below /.
func RemotePath(dst string) (rel string, home bool, err error) {
	switch {
	case dst == "~" || dst == "/":
		return "", false, fmt.Errorf("%w: %q: a mount cannot replace the home or root directory", ErrFiles, dst)
	case strings.HasPrefix(dst, "~/"):
		rel, home = dst[2:], true
	case strings.HasPrefix(dst, "/"):
		rel = dst[1:]
	default:
		rel, home = dst, true // SkyPilot: relative remote paths are under the home directory
	}
	rel = path.Clean(rel)
	if rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false, fmt.Errorf("%w: %q leaves its directory", ErrFiles, dst)
	}
	return rel, home, nil
}

// localSize is the bytes of regular files under p (p itself when a file), failing with a
// clear error when p is missing.
func localSize(p string) (int64, error) {
	var total int64
	err := filepath.WalkDir(p, func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			total += info.Size()
		}
		return nil
	})
	if errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("%w: local path %s does not exist", ErrFiles, p)
	}
	return total, err
}

// Files is an instance's workdir and file mounts, checked.
type Files struct {
	// Workdir is the local directory synced to ~/sky_workdir, or "".
	Workdir string
	Mounts  []FileMount
}

// SpecFiles checks spec's workdir and file mounts: local sources exist (a workdir is a
// directory), bucket URLs parse. It reads no bucket.
func SpecFiles(spec launcher.Spec) (Files, error) {
	mounts, err := ParseFileMounts(spec.FileMounts)
	errs := []error{err}
	for i, m := range mounts {
		if mode, ok := spec.MountModes[m.Dst]; ok && m.Bucket != nil {
			mounts[i].Mode = mode
		}
	}
	f := Files{Workdir: spec.Workdir, Mounts: mounts}
	if f.Workdir != "" {
		switch info, err := os.Stat(f.Workdir); {
		case !filepath.IsAbs(f.Workdir):
			errs = append(errs, fmt.Errorf("%w: workdir %q is relative; the CLI makes it absolute, submit through it", ErrFiles, f.Workdir))
		case errors.Is(err, os.ErrNotExist):
			errs = append(errs, fmt.Errorf("%w: workdir %s does not exist", ErrFiles, f.Workdir))
		case err != nil:
			errs = append(errs, fmt.Errorf("%w: workdir: %v", ErrFiles, err))
		case !info.IsDir():
			errs = append(errs, fmt.Errorf("%w: workdir %s is not a directory", ErrFiles, f.Workdir))
		}
	}
	for _, m := range mounts {
		if m.Bucket == nil {
			if _, err := os.Lstat(m.Src); err != nil {
				errs = append(errs, fmt.Errorf("%w: file_mounts.%s: local path %s does not exist", ErrFiles, m.Dst, m.Src))
			}
		}
	}
	return f, errors.Join(errs...)
}

// Empty says there is nothing to sync.
func (f Files) Empty() bool { return f.Workdir == "" && len(f.Mounts) == 0 }

// LocalBytes is the size of the local files to sync: what an upload carries before
// compression.
func (f Files) LocalBytes() (int64, error) {
	var total int64
	srcs := []string{}
	if f.Workdir != "" {
		srcs = append(srcs, f.Workdir)
	}
	for _, m := range f.Mounts {
		if m.Bucket == nil {
			srcs = append(srcs, m.Src)
		}
	}
	for _, s := range srcs {
		n, err := localSize(s)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// objectPath is where an object listed under u lands, relative to its mount's path: "" for
// the one object u names.
func objectPath(u BucketURL, key string) string {
	if key == u.Prefix {
		return ""
	}
	return strings.TrimPrefix(strings.TrimPrefix(key, u.Prefix), "/")
}

// KeyPath is where the object key listed under b lands, relative to its mount's path: "" for
// the one object b names.
func (b BucketURL) KeyPath(key string) string { return objectPath(b, key) }

// DirPrefix is the prefix a bucket URL's directory lists under: "data" lists "data/...", not
// "database".
func (b BucketURL) DirPrefix() string {
	if b.Prefix == "" || strings.HasSuffix(b.Prefix, "/") {
		return b.Prefix
	}
	return b.Prefix + "/"
}

// Channel limits on packed local files (tar.gz, before base64 where the channel is text).
const (
	// AWSUserDataLimit is EC2's bound on user-data; the script around the files counts too.
	AWSUserDataLimit = 16 * 1024
	// GCPMetadataLimit is GCE's bound on one metadata value (the startup script).
	GCPMetadataLimit = 256 * 1024
	// KubernetesFilesLimit is what a pod's files Secret holds for packed files: 1 MiB less
	// room for the download list.
	KubernetesFilesLimit = 1<<20 - 64<<10
)

// FilesFit says whether infra kind ("local", "kubernetes", "aws", "gcp") can deliver f, whose
// local files pack to packed bytes (PackLocal): the launch's checks that need no bucket, for
// --dry-run. A VM's boot script adds its own size and a URL per bucket object, so a pass here
// is not a promise there; a failure is.
func FilesFit(f Files, kind string, packed int) error {
	for _, m := range f.Mounts {
		if err := mountFits(m, kind); err != nil {
			return err
		}
	}
	limit, what := 0, ""
	switch kind {
	case "aws":
		limit, what = AWSUserDataLimit, "EC2's 16 KiB of user-data"
	case "gcp":
		limit, what = GCPMetadataLimit, "GCE's 256 KiB startup script"
	case "kubernetes":
		limit, what = KubernetesFilesLimit, "a Kubernetes Secret (1 MiB)"
	default:
		return nil
	}
	if kind != "kubernetes" {
		packed = (packed + 2) / 3 * 4 // base64 in the script
	}
	if packed > limit {
		return fmt.Errorf("%w: the workdir and local file_mounts pack to %d KiB, more than %s can carry; put them in a bucket (s3://) and mount that instead", ErrFiles, (packed+1023)/1024, what)
	}
	return nil
}

// mountFits says whether infra kind can deliver bucket mount m: copy it (gs:// needs Google
// credentials where the instance fetches it) or mount it (FUSE with the machine's own
// credentials for the bucket's cloud: mounts.go).
func mountFits(m FileMount, kind string) error {
	switch {
	case m.Bucket == nil:
		return nil
	case m.Mounted():
		return MountFits(m, kind)
	case m.Bucket.Scheme == "gs" && kind == "kubernetes":
		return fmt.Errorf("%w: file_mounts.%s: %s: a pod has no Google credentials Ferry can count on to fetch it with; copy the data to s3:// or mount it (mode: MOUNT)", ErrFiles, m.Dst, m.Src)
	}
	return nil
}
