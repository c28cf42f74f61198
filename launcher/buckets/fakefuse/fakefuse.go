// Package fakefuse stands in for the FUSE clients a VM's boot script and a pod's command run
// for mounted buckets (launcher/nodefiles/mounts.go): goofys and gcsfuse (MOUNT), rclone mount
// (MOUNT_CACHED, and MOUNT of s3:// on ARM), and fusermount/fusermount3 -u to unmount. The
// fake clouds' VMs and the test cluster's pods are processes on the host, which cannot load
// FUSE, so a test puts these on their PATH (Install) and the boot script runs them exactly as
// it runs the real clients on a real VM.
//
// What a stand-in does: it parses the real client's command line (the subset Ferry writes;
// any other flag is an error, so a wrong flag fails the test), reads credentials where the real
// client would on that machine, and keeps the mount point in step with the bucket with
// launcher/buckets/bucketsync in a daemon it starts (goofys, gcsfuse and rclone --daemon return
// once the bucket is mounted): the bucket's objects are there before it returns, a file
// written there reaches the bucket within a round (FAKEFUSE_INTERVAL, default 100ms), an object
// written elsewhere appears within a round, and unmounting (or SIGTERM) makes a last round
// first, as everything closed on a goofys or gcsfuse mount is uploaded already. The rclone
// stand-in of a VFS-cached mount models rclone's write-back instead: a file goes up only once
// it has not changed for --vfs-write-back, it logs "vfs cache: cleaned: ... to upload N,
// uploading 0" after each round as rclone does (which the boot script's flush waits on), and
// an unmount leaves what was not uploaded behind.
//
// What differs from the real clients: writes reach the bucket a round after close, not at
// close (goofys, gcsfuse) or after --vfs-write-back (rclone); nothing is mounted, so the mount
// point is an ordinary directory that holds a full copy (no streaming of large objects, no
// POSIX limits such as goofys's lack of random writes); and a SIGKILLed VM loses what the
// daemon had not uploaded (a real goofys mount loses only files not yet closed).
//
// Credentials: S3 from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY[/AWS_SESSION_TOKEN] when set,
// else the instance profile's role credentials from the instance metadata service
// (FERRY_IMDS_ENDPOINT, else 169.254.169.254), as the AWS SDK's default chain finds them on an
// EC2 VM; GCS from the metadata server's service-account token (FERRY_GCE_METADATA_URL, else
// metadata.google.internal), as Application Default Credentials find it on a GCE VM. The
// endpoints are AWS_ENDPOINT_URL_S3 (goofys's --endpoint wins) and STORAGE_EMULATOR_HOST.
//
// A test binary that imports this package becomes the stand-in when it is run under one of
// the clients' names (Install links them to it): the package's init runs the stand-in and
// exits before the tests start.
package fakefuse

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Names are the commands Install provides.
var Names = []string{"goofys", "gcsfuse", "rclone", "fusermount", "fusermount3"}

func init() {
	switch filepath.Base(os.Args[0]) {
	case "goofys", "gcsfuse", "rclone", "fusermount", "fusermount3":
		os.Exit(Main(os.Args))
	}
}

// Install puts the stand-ins first on PATH (which fake VMs and the kubelet stand-in's pods
// inherit) for the rest of the test, as links to the running test binary, and returns their
// directory. It clears the AWS credential variables, so that a VM's stand-in finds its
// instance profile's credentials as goofys would on EC2, not the test machine's. The test
// must not be parallel.
func Install(t testing.TB) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range Names {
		if err := os.Symlink(self, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("FAKEFUSE_DIR", filepath.Join(dir, "mounts"))
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"} {
		t.Setenv(k, "")
	}
	return dir
}

// Main runs the stand-in named by args[0] and returns its exit status.
func Main(args []string) int {
	name := filepath.Base(args[0])
	if os.Getenv(envDaemon) != "" {
		return runDaemon(name, args[1:])
	}
	var err error
	switch name {
	case "fusermount", "fusermount3":
		err = unmount(args[1:])
	default:
		var m mountArgs
		if m, err = parseMount(name, args[1:]); err == nil {
			err = startDaemon(name, m, args[1:])
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s (fakefuse): %v\n", name, err)
		return 1
	}
	return 0
}
