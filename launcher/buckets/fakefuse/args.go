package fakefuse

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// mountArgs is what a mount command asks for.
type mountArgs struct {
	// url is the bucket and prefix mounted.
	url nodefiles.BucketURL
	// dir is the mount point.
	dir string
	// logFile is --log-file ("" for none).
	logFile string
	// endpoint is goofys's --endpoint.
	endpoint string
	// cached says the mount keeps rclone's VFS cache (it logs its upload queue, holds writes
	// back for writeBack, and leaves what is not uploaded at unmount in its cache).
	cached    bool
	writeBack time.Duration
	// foreground is goofys -f and gcsfuse --foreground: no daemon.
	foreground bool
}

// flagSpec lists a client's flags: those that take a value and those that do not. A flag
// given as --name=value takes a value either way.
type flagSpec struct {
	valued, bare []string
}

// The flags of each client that Ferry's boot script writes, and the few a user meets in
// SkyPilot's own mount commands.
var (
	goofysFlags = flagSpec{
		valued: []string{"-o", "--stat-cache-ttl", "--type-cache-ttl", "--log-file", "--endpoint", "--dir-mode", "--file-mode", "--region"},
		bare:   []string{"-f", "--subdomain"},
	}
	gcsfuseFlags = flagSpec{
		valued: []string{"-o", "--log-file", "--stat-cache-capacity", "--stat-cache-ttl", "--type-cache-ttl", "--rename-dir-limit", "--only-dir", "--dir-mode", "--file-mode"},
		bare:   []string{"--implicit-dirs", "--debug_fuse_errors", "--foreground"},
	}
	rcloneFlags = flagSpec{
		valued: []string{"--daemon-wait", "--log-file", "--log-level", "--vfs-cache-mode", "--dir-cache-time", "--vfs-cache-poll-interval",
			"--vfs-write-back", "--vfs-cache-max-size", "--cache-dir", "--transfers", "--s3-env-auth", "--s3-provider", "--s3-endpoint",
			"--gcs-env-auth", "--gcs-bucket-policy-only", "--config"},
		bare: []string{"--daemon", "--allow-other", "--allow-non-empty", "--vfs-fast-fingerprint"},
	}
)

// parseFlags splits args into flag values (last wins) and positional arguments.
func parseFlags(spec flagSpec, args []string) (map[string]string, []string, error) {
	flags := map[string]string{}
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		name, value, hasValue := strings.Cut(a, "=")
		switch {
		case slices.Contains(spec.valued, name) && hasValue:
			flags[name] = value
		case slices.Contains(spec.valued, name):
			if i+1 >= len(args) {
				return nil, nil, fmt.Errorf("flag %s needs a value", name)
			}
			i++
			flags[name] = args[i]
		case slices.Contains(spec.bare, name) && !hasValue:
			flags[name] = "true"
		default:
			return nil, nil, fmt.Errorf("unknown flag %s", a)
		}
	}
	return flags, pos, nil
}

// parseMount reads a mount command line: goofys [flags] BUCKET[:PREFIX] DIR, gcsfuse [flags]
// BUCKET DIR (--only-dir PREFIX), rclone mount :s3:BUCKET/PREFIX DIR [flags] (or :gcs:).
func parseMount(name string, args []string) (mountArgs, error) {
	var m mountArgs
	switch name {
	case "goofys":
		flags, pos, err := parseFlags(goofysFlags, args)
		if err != nil {
			return m, err
		}
		if len(pos) != 2 {
			return m, errors.New("usage: goofys [flags] BUCKET[:PREFIX] MOUNTPOINT")
		}
		bucket, prefix, _ := strings.Cut(pos[0], ":")
		m = mountArgs{url: nodefiles.BucketURL{Scheme: "s3", Bucket: bucket, Prefix: prefix}, dir: pos[1],
			logFile: flags["--log-file"], endpoint: flags["--endpoint"], foreground: flags["-f"] != ""}
	case "gcsfuse":
		flags, pos, err := parseFlags(gcsfuseFlags, args)
		if err != nil {
			return m, err
		}
		if len(pos) != 2 {
			return m, errors.New("usage: gcsfuse [flags] BUCKET MOUNTPOINT")
		}
		m = mountArgs{url: nodefiles.BucketURL{Scheme: "gs", Bucket: pos[0], Prefix: flags["--only-dir"]}, dir: pos[1],
			logFile: flags["--log-file"], foreground: flags["--foreground"] != ""}
	case "rclone":
		return parseRclone(args)
	default:
		return m, fmt.Errorf("%s is not a mount command", name)
	}
	if m.url.Bucket == "" {
		return m, errors.New("no bucket")
	}
	return m, nil
}

// parseRclone reads rclone mount REMOTE MOUNTPOINT [flags]: an on-the-fly remote, :s3: with
// --s3-env-auth=true or :gcs: with --gcs-env-auth=true (credentials from the machine, not a
// config file).
func parseRclone(args []string) (mountArgs, error) {
	var m mountArgs
	flags, pos, err := parseFlags(rcloneFlags, args)
	if err != nil {
		return m, err
	}
	if len(pos) != 3 || pos[0] != "mount" {
		return m, errors.New("usage: rclone mount REMOTE:PATH MOUNTPOINT [flags] (the only rclone command the stand-in has)")
	}
	if flags["--daemon"] == "" {
		return m, errors.New("the stand-in mounts only with --daemon, as the boot script does")
	}
	remote, path, ok := strings.Cut(strings.TrimPrefix(pos[1], ":"), ":")
	if !ok || !strings.HasPrefix(pos[1], ":") {
		return m, fmt.Errorf("remote %q: want an on-the-fly remote, :s3:BUCKET/PATH or :gcs:BUCKET/PATH", pos[1])
	}
	scheme := map[string]string{"s3": "s3", "gcs": "gs"}[remote]
	switch {
	case scheme == "":
		return m, fmt.Errorf("remote %q: the stand-in knows only the s3 and gcs backends (:s3:BUCKET/PATH, :gcs:BUCKET/PATH)", pos[1])
	case scheme == "s3" && flags["--s3-env-auth"] != "true":
		return m, errors.New(":s3: without --s3-env-auth=true reads no credentials from the machine")
	case scheme == "gs" && flags["--gcs-env-auth"] != "true":
		return m, errors.New(":gcs: without --gcs-env-auth=true reads no credentials from the machine")
	}
	bucket, prefix, _ := strings.Cut(path, "/")
	m = mountArgs{url: nodefiles.BucketURL{Scheme: scheme, Bucket: bucket, Prefix: prefix}, dir: pos[2], logFile: flags["--log-file"],
		endpoint: flags["--s3-endpoint"], cached: flags["--vfs-cache-mode"] == "full" || flags["--vfs-cache-mode"] == "writes"}
	if m.cached {
		m.writeBack = 5 * time.Second // rclone's default
		if wb, ok := flags["--vfs-write-back"]; ok {
			if m.writeBack, err = time.ParseDuration(wb); err != nil {
				return m, fmt.Errorf("--vfs-write-back: %v", err)
			}
		}
	}
	if bucket == "" {
		return m, errors.New("no bucket")
	}
	return m, nil
}
