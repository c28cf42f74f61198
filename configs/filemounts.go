package configs

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// A file_mounts value is a local path or bucket URL (s3://, gs://), or SkyPilot's storage
// mapping {source, name, store, mode, persistent}. A local path is copied at launch. A bucket
// is copied at launch (mode: COPY, and the plain string form) or mounted (MOUNT, the mapping's
// default, and MOUNT_CACHED): the instance sees the bucket at the path and its writes reach
// the bucket (launcher/nodefiles/mounts.go says how on each infra). A mapping may name an existing bucket
// instead of giving its URL: name: BUCKET with store: s3 or gcs. Ferry creates no buckets and
// uploads no local files to one, so a mapping that asks for either is refused here, with what
// to write instead.

// MountMode is SkyPilot's storage mode of a bucket in file_mounts.
type MountMode string

// The storage modes, spelled as SkyPilot spells them.
const (
	// ModeCopy copies the bucket's objects at launch: a read-only snapshot.
	ModeCopy MountMode = "COPY"
	// ModeMount mounts the bucket with FUSE (goofys, gcsfuse): reads stream from it and a
	// closed file is uploaded.
	ModeMount MountMode = "MOUNT"
	// ModeMountCached mounts it with rclone's VFS cache: reads and writes go to the local disk
	// first, and writes are uploaded in the background.
	ModeMountCached MountMode = "MOUNT_CACHED"
)

// fileMountKeys are the fields of SkyPilot's storage mapping that Ferry reads or refuses.
var fileMountKeys = []string{"source", "mode", "name", "store", "persistent", "_force_delete"}

// storeSchemes maps the stores Ferry reads buckets from to their URL schemes; the other
// stores SkyPilot knows are refused by name.
var storeSchemes = map[string]string{"s3": "s3", "gcs": "gs"}

// skypilotStores are the stores SkyPilot accepts that Ferry does not.
var skypilotStores = []string{"azure", "r2", "ibm", "oci", "nebius", "coreweave", "volume", "hf"}

// fileMountSource reads one file_mounts value: the source it copies or mounts from, and its
// mode (ModeCopy for a local source and the plain string form). res is the task's resources:
// a bucket named without a store is on the store of the one cloud they run on (GCS for GCP
// only), else on S3.
func (c *checker) fileMountSource(n *yaml.Node, field string, res Resources) (string, MountMode, bool) {
	if n == nil || n.Kind != yaml.MappingNode {
		s, ok := c.str(n, field)
		return s, ModeCopy, ok
	}
	f, ok := c.fields(n, field, fileMountKeys)
	if !ok {
		return "", "", false
	}
	scheme, ok := c.storeScheme(f, field)
	if !ok {
		return "", "", false
	}
	source, ok := c.mappingSource(n, f, field, scheme, res)
	if !ok {
		return "", "", false
	}
	mode := ModeMount // SkyPilot's default for a storage mapping
	if e, ok := f["mode"]; ok {
		m, ok := c.oneOf(e.value, joinField(field, "mode"), []string{string(ModeCopy), string(ModeMount), string(ModeMountCached)}, "mode", "modes")
		if !ok {
			return "", "", false
		}
		mode = MountMode(m)
	}
	if !isBucketURL(source) {
		return source, ModeCopy, true // a local path is copied whatever the mode
	}
	return source, mode, true
}

// storeScheme reads store: the URL scheme of its buckets, "" when not given.
func (c *checker) storeScheme(f map[string]entry, field string) (string, bool) {
	e, ok := f["store"]
	if !ok {
		return "", true
	}
	store, ok := c.str(e.value, joinField(field, "store"))
	if !ok {
		return "", false
	}
	if scheme, ok := storeSchemes[strings.ToLower(store)]; ok {
		return scheme, true
	}
	if slices.Contains(skypilotStores, strings.ToLower(store)) {
		c.errorf(e.value, joinField(field, "store"), "store %s is not supported by Ferry: it reads buckets from s3 and gcs only; copy the data to one of them", quoteShort(store))
	} else {
		c.errorf(e.value, joinField(field, "store"), "unknown store %s%s", quoteShort(store), suggest(store, []string{"s3", "gcs"}, "stores"))
	}
	return "", false
}

// mappingSource is a storage mapping's source: its source field, or the bucket its name
// names on store scheme (or the default store for res).
func (c *checker) mappingSource(n *yaml.Node, f map[string]entry, field, scheme string, res Resources) (string, bool) {
	name, hasName := f["name"]
	src, hasSource := f["source"]
	if !hasSource && !hasName {
		c.errorf(n, field, "a storage mapping without source or name asks for a new bucket, which Ferry does not create: create it and write name: BUCKET with store: s3 or gcs, or source: s3://BUCKET/PATH (or gs://)")
		return "", false
	}
	var bucket string
	if hasName {
		var ok bool
		if bucket, ok = c.str(name.value, joinField(field, "name")); !ok {
			return "", false
		}
		if bucket == "" || strings.ContainsAny(bucket, "/:") {
			c.errorf(name.value, joinField(field, "name"), "%s is not a bucket name: name is an existing bucket's name (write a URL as source: s3://BUCKET/PATH)", quoteShort(bucket))
			return "", false
		}
	}
	if !hasSource {
		how := ""
		if scheme == "" {
			scheme = defaultStore(res)
			how = storeHow(res, scheme)
		}
		url := scheme + "://" + bucket
		c.notef(name.value, field, "reads the existing bucket %s%s; Ferry creates no bucket, so a launch fails if it does not exist", url, how)
		return url, true
	}
	if src.value.Kind == yaml.SequenceNode {
		c.errorf(src.value, joinField(field, "source"), "a list of sources is uploaded to a new bucket by SkyPilot, which Ferry does not do: mount each path on its own")
		return "", false
	}
	source, ok := c.str(src.value, joinField(field, "source"))
	if !ok {
		return "", false
	}
	if !isBucketURL(source) {
		if hasName {
			c.errorf(name.keyNode, joinField(field, "name"), "name with a local source uploads it to a new bucket, which Ferry does not do: drop name (the local files are copied at launch) or upload them yourself and give source: s3://BUCKET/PATH")
			return "", false
		}
		return source, true
	}
	srcScheme, rest, _ := strings.Cut(source, "://")
	srcBucket, _, _ := strings.Cut(rest, "/")
	if hasName && bucket != srcBucket {
		c.errorf(name.value, joinField(field, "name"), "name %s is not the bucket of source %s: drop name, or make them agree", quoteShort(bucket), quoteShort(source))
		return "", false
	}
	if scheme != "" && scheme != srcScheme {
		c.errorf(f["store"].value, joinField(field, "store"), "store does not match source %s: drop store, or make them agree", quoteShort(source))
		return "", false
	}
	return source, true
}

// storeHow says, for the plan's note, why a bucket named without a store is on scheme's store.
func storeHow(res Resources, scheme string) string {
	if scheme == "gs" {
		return " (store gcs: the task runs on gcp only, as SkyPilot picks the cloud's own store)"
	}
	for _, c := range res.Candidates() {
		if c.Cloud != "aws" {
			return " (no store given: S3, one bucket wherever the task runs; write store: gcs for GCS)"
		}
	}
	return " (store s3: the task runs on aws only, as SkyPilot picks the cloud's own store)"
}

// isBucketURL says whether a file_mounts source is a bucket Ferry reads.
func isBucketURL(s string) bool {
	return strings.HasPrefix(s, "s3://") || strings.HasPrefix(s, "gs://")
}

// defaultStore is the scheme of a bucket named without a store: GCS when every candidate
// runs on GCP, else S3. SkyPilot takes the store of the cloud it launches on (and creates the
// bucket there); Ferry names one bucket for every launch, so a job that recovers on another
// cloud finds its checkpoints, and write store: gcs to choose GCS.
func defaultStore(res Resources) string {
	cands := res.Candidates()
	for _, c := range cands {
		if c.Cloud != "gcp" {
			return "s3"
		}
	}
	return "gs"
}

// ResolveFiles makes the task's workdir and local file_mounts sources absolute, against cwd
// (the directory the CLI runs in, as SkyPilot resolves them) and home (for ~/), and checks that
// each exists (a workdir must be a directory): at --dry-run, before anything is launched. The
// controller copies from these paths at launch, so it must run on the machine that holds them.
func ResolveFiles(t *Task, cwd, home string) error {
	var errs []error
	abs := func(p string) string {
		if p == "~" || strings.HasPrefix(p, "~/") {
			return filepath.Join(home, strings.TrimPrefix(p, "~"))
		}
		if filepath.IsAbs(p) {
			return filepath.Clean(p)
		}
		return filepath.Join(cwd, p)
	}
	if t.Workdir != "" {
		t.Workdir = abs(t.Workdir)
		switch info, err := os.Stat(t.Workdir); {
		case err != nil:
			errs = append(errs, fmt.Errorf("workdir: %s does not exist or cannot be read (%v)", t.Workdir, errors.Unwrap(err)))
		case !info.IsDir():
			errs = append(errs, fmt.Errorf("workdir: %s is not a directory (mount a single file with file_mounts)", t.Workdir))
		}
	}
	for _, dst := range slices.Sorted(maps.Keys(t.FileMounts)) {
		src := t.FileMounts[dst]
		if strings.Contains(src, "://") {
			continue // a bucket: the launch lists it; a bad scheme is the launcher's error
		}
		t.FileMounts[dst] = abs(src)
		if _, err := os.Stat(t.FileMounts[dst]); err != nil {
			errs = append(errs, fmt.Errorf("file_mounts.%s: local path %s does not exist or cannot be read (%v)", dst, t.FileMounts[dst], errors.Unwrap(err)))
		}
	}
	return errors.Join(errs...)
}

// addFileMount records one mount: its source, and its mode when it is not copied.
func (t *Task) addFileMount(dst, src string, mode MountMode) {
	if t.FileMounts == nil {
		t.FileMounts = map[string]string{}
	}
	t.FileMounts[dst] = src
	if mode == ModeMount || mode == ModeMountCached {
		if t.MountModes == nil {
			t.MountModes = map[string]MountMode{}
		}
		t.MountModes[dst] = mode
	}
}

// ModeOf is the storage mode of the mount at dst: ModeCopy unless it is a mounted bucket.
func (t *Task) ModeOf(dst string) MountMode {
	if m, ok := t.MountModes[dst]; ok {
		return m
	}
	return ModeCopy
}

// resolvedFileMounts is file_mounts as ResolvedYAML writes it: a copied mount as its source,
// a mounted bucket as SkyPilot's mapping {source, mode}.
func (t Task) resolvedFileMounts() map[string]*yaml.Node {
	out := make(map[string]*yaml.Node, len(t.FileMounts))
	for dst, src := range t.FileMounts {
		out[dst] = text(src)
		if mode := t.ModeOf(dst); mode != ModeCopy {
			out[dst] = &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
				keyNode("source"), text(src), keyNode("mode"), text(string(mode))}}
		}
	}
	return out
}

// instanceProfileRE is IAM's rule for an instance profile's name.
var instanceProfileRE = regexp.MustCompile(`^[\w+=,.@-]{1,128}$`)

// instanceProfile reads aws.mount_instance_profile: an IAM instance profile's name.
func (c *checker) instanceProfile(n *yaml.Node, field string) string {
	v, ok := c.str(n, field)
	if !ok {
		return ""
	}
	if !instanceProfileRE.MatchString(v) {
		c.errorf(n, field, "%s is not an instance profile name (1-128 letters, digits and +=,.@_-; the name, not the ARN)", quoteShort(v))
		return ""
	}
	return v
}

// cloudStorage reads a cloud section's storage keys: checkpoint_nfs, mount_instance_profile.
func (c *checker) cloudStorage(f map[string]entry, field string, cc *CloudConfig) {
	if e, ok := f["checkpoint_nfs"]; ok {
		cc.CheckpointNFS = c.nfsShare(e.value, joinField(field, "checkpoint_nfs"))
	}
	if e, ok := f["mount_instance_profile"]; ok {
		cc.MountInstanceProfile = c.instanceProfile(e.value, joinField(field, "mount_instance_profile"))
	}
}

// fileMounts reads a task's file_mounts, n: remote path → a local path, a bucket URI, or a
// mapping with its source and mode.
func (c *checker) fileMounts(t *Task, n *yaml.Node) {
	ps, _ := c.pairs(n, "file_mounts")
	for _, p := range ps {
		field := joinField("file_mounts", p.key)
		if p.key == "" {
			c.errorf(p.keyNode, "file_mounts", "a mount needs a remote path as its key")
			continue
		}
		if src, mode, ok := c.fileMountSource(p.value, field, t.Resources); ok {
			if src == "" {
				c.errorf(p.value, field, "a mount needs a local path or bucket URI")
				continue
			}
			t.addFileMount(p.key, src, mode)
		}
	}
}
