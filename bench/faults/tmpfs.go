package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// FERRY_HOME on a small tmpfs, so that the disk-full scenario can fill the file system the
// controller writes its store and logs to without touching the machine's disks.

// fillFile is the file that fills the tmpfs.
const fillFile = "disk-filler"

// canMount reports whether this process may mount a tmpfs, and if not why.
func canMount() (bool, string) {
	if os.Geteuid() != 0 {
		return false, fmt.Sprintf("mounting a tmpfs needs root (running as uid %d)", os.Geteuid())
	}
	return true, ""
}

// mountTmpfs mounts a tmpfs of size (as mount(8) takes it: 64m) on dir, owner-only.
func mountTmpfs(dir, size string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size="+size+",mode=0700"); err != nil {
		return fmt.Errorf("mount -t tmpfs -o size=%s tmpfs %s: %w", size, dir, err)
	}
	return nil
}

// unmountTmpfs unmounts dir, retrying while something still uses it (a replica process that
// is being stopped), and detaching it lazily as a last resort so that nothing stays mounted.
func unmountTmpfs(dir string) error {
	var err error
	for range 40 {
		if err = syscall.Unmount(dir, 0); err == nil || errors.Is(err, syscall.EINVAL) {
			return nil // EINVAL: not a mount point (any more)
		}
		if !errors.Is(err, syscall.EBUSY) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if derr := syscall.Unmount(dir, syscall.MNT_DETACH); derr != nil {
		return fmt.Errorf("umount %s: %v; lazy umount: %w", dir, err, derr)
	}
	return fmt.Errorf("umount %s: %v; detached it lazily instead", dir, err)
}

// fillDisk writes zeros into dir/fillFile until the file system is full and returns how many
// bytes it wrote. Running out of space is the point, not an error.
func fillDisk(dir string) (int64, error) {
	f, err := os.OpenFile(filepath.Join(dir, fillFile), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		w, err := f.Write(buf)
		n += int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			// Fill the last partial block too.
			for size := len(buf) / 2; size >= 512; size /= 2 {
				for {
					w, err := f.Write(buf[:size])
					n += int64(w)
					if err != nil {
						break
					}
				}
			}
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// copyLogs copies the logs under home (controller.log, each replica's output.log) to dst,
// keeping their paths, before the tmpfs that holds them is unmounted.
func copyLogs(home, dst string) error {
	return filepath.WalkDir(home, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(d.Name(), ".log") {
			return err
		}
		rel, err := filepath.Rel(home, path)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}

// tornLines counts the lines of a JSON-lines log that are not JSON objects.
func tornLines(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	torn := 0
	for sc.Scan() {
		if line := sc.Bytes(); len(line) > 0 && !json.Valid(line) {
			torn++
		}
	}
	return torn, sc.Err()
}

// freeDisk removes the filler.
func freeDisk(dir string) error {
	err := os.Remove(filepath.Join(dir, fillFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// freeBytes is the space left on the file system of dir.
func freeBytes(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}
