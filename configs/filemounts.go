package configs

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// A file_mounts value is a local path or bucket URL (s3://, gs://), or SkyPilot's storage
// mapping {source, mode, name, store, persistent}. Ferry copies at launch (SkyPilot's COPY
// mode); it creates no buckets and mounts none with FUSE, so a mapping that asks for either is
// refused here, with what to write instead.

// fileMountKeys are the fields of SkyPilot's storage mapping that Ferry reads or refuses.
var fileMountKeys = []string{"source", "mode", "name", "store", "persistent", "_force_delete"}

// fileMountSource reads one file_mounts value: the source it copies from.
func (c *checker) fileMountSource(n *yaml.Node, field string) (string, bool) {
	if n == nil || n.Kind != yaml.MappingNode {
		return c.str(n, field)
	}
	f, ok := c.fields(n, field, fileMountKeys)
	if !ok {
		return "", false
	}
	src, hasSource := f["source"]
	if !hasSource {
		// {name: BUCKET, store: s3}: an existing bucket (storage.go).
		bucket := c.namedBucket(n, f, field)
		src = entry{value: &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: bucket, Line: n.Line, Column: n.Column}}
		if bucket == "" {
			return "", false
		}
	}
	if src.value.Kind == yaml.SequenceNode {
		c.errorf(src.value, joinField(field, "source"), "a list of sources is uploaded to a new bucket by SkyPilot, which Ferry does not do: mount each path on its own")
		return "", false
	}
	source, ok := c.str(src.value, joinField(field, "source"))
	if !ok {
		return "", false
	}
	isBucket := strings.HasPrefix(source, "s3://") || strings.HasPrefix(source, "gs://")
	if e, ok := f["name"]; ok && !isBucket {
		c.errorf(e.keyNode, joinField(field, "name"), "name with a local source uploads it to a new bucket, which Ferry does not do: drop name (the local files are copied at launch) or upload them yourself and give source: s3://BUCKET/PATH")
		return "", false
	}
	mode := "MOUNT" // SkyPilot's default for a storage mapping
	if e, ok := f["mode"]; ok {
		if mode, ok = c.oneOf(e.value, joinField(field, "mode"), []string{"COPY", "MOUNT", "MOUNT_CACHED"}, "mode", "modes"); !ok {
			return "", false
		}
	}
	if mode != "COPY" && isBucket {
		at := n
		if e, ok := f["mode"]; ok {
			at = e.value
		}
		c.errorf(at, joinField(field, "mode"), "mode %s mounts the bucket with FUSE (writes go back to it), which Ferry does not do: write mode: COPY to copy %s at launch (a read-only snapshot; write results with your own upload)", mode, source)
		return "", false
	}
	return source, true
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
