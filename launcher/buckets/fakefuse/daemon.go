package fakefuse

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ferryserve/ferry/launcher/buckets/bucketsync"
)

const (
	// envDaemon marks the stand-in's daemon process.
	envDaemon = "FAKEFUSE_DAEMON"
	// envInterval is the daemon's round interval (a Go duration); default 100ms.
	envInterval = "FAKEFUSE_INTERVAL"
	// envDir is where daemons leave their pid files; default $TMPDIR/fakefuse.
	envDir = "FAKEFUSE_DIR"
	// readyTimeout bounds the wait for a daemon's first round, as rclone's --daemon-wait.
	readyTimeout = time.Minute
)

// pidFile is where the daemon of mount point dir leaves its pid.
func pidFile(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(filepath.Clean(abs)))
	root := os.Getenv(envDir)
	if root == "" {
		root = filepath.Join(os.TempDir(), "fakefuse")
	}
	return filepath.Join(root, hex.EncodeToString(sum[:8])+".pid"), nil
}

// mounted is the pid of the daemon mounted at dir, 0 for none.
func mounted(dir string) int {
	path, err := pidFile(dir)
	if err != nil {
		return 0
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || syscall.Kill(pid, 0) != nil {
		return 0
	}
	return pid
}

// startDaemon starts the daemon that keeps m's mount point in step, and returns once its first
// round brought the bucket's objects there (or failed), as the real clients return once the
// bucket is mounted.
func startDaemon(name string, m mountArgs, args []string) error {
	if info, err := os.Stat(m.dir); err != nil || !info.IsDir() {
		return fmt.Errorf("mountpoint %s: not a directory (%v)", m.dir, err)
	}
	if mounted(m.dir) != 0 {
		return fmt.Errorf("mountpoint %s is already mounted", m.dir)
	}
	if m.foreground {
		return runMount(name, m, nil)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd := exec.Command(self, args...)
	cmd.Args[0] = name
	cmd.Env = append(os.Environ(), envDaemon+"=1")
	cmd.ExtraFiles = []*os.File{w}
	if m.logFile != "" {
		logFile, err := os.OpenFile(m.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			w.Close()
			return err
		}
		defer logFile.Close()
		cmd.Stdout, cmd.Stderr = logFile, logFile
	}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return err
	}
	_ = cmd.Process.Release() // it outlives this command, as a FUSE daemon does
	_ = r.SetReadDeadline(time.Now().Add(readyTimeout))
	msg, _ := io.ReadAll(r)
	if string(msg) != "ok" {
		if len(msg) == 0 {
			msg = []byte("the daemon ended before mounting")
		}
		return errors.New(string(msg))
	}
	return nil
}

// runDaemon is the daemon's process: fd 3 is its readiness pipe.
func runDaemon(name string, args []string) int {
	m, err := parseMount(name, args)
	ready := os.NewFile(3, "ready")
	if err == nil {
		err = runMount(name, m, ready)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s (fakefuse): %v\n", name, err)
		return 1
	}
	return 0
}

// runMount keeps m's mount point in step until SIGTERM (or an unmount), after a first round
// that it reports on ready (nil in the foreground).
func runMount(name string, m mountArgs, ready *os.File) error {
	fail := func(err error) error {
		if ready != nil {
			_, _ = ready.WriteString(err.Error())
			ready.Close()
		}
		return err
	}
	pid, err := pidFile(m.dir)
	if err != nil {
		return fail(err)
	}
	store, err := newStore(m)
	if err != nil {
		return fail(err)
	}
	mirror := bucketsync.New(store, m.url, m.dir)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	st, err := mirror.Sync(ctx)
	if err != nil {
		return fail(fmt.Errorf("mount %s at %s: %w", mirror.URL(), m.dir, err))
	}
	if err := os.MkdirAll(filepath.Dir(pid), 0o755); err != nil {
		return fail(err)
	}
	if err := os.WriteFile(pid, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return fail(err)
	}
	defer os.Remove(pid)
	logRound(name, m, st, nil)
	if ready != nil {
		_, _ = ready.WriteString("ok")
		ready.Close()
	}
	interval := 100 * time.Millisecond
	if d, err := time.ParseDuration(os.Getenv(envInterval)); err == nil && d > 0 {
		interval = d
	}
	mirror.WriteBack = m.writeBack
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	mirror.Run(ctx, ticker.C, func(st bucketsync.Stats, err error) { logRound(name, m, st, err) })
	if m.cached {
		// rclone leaves what it has not uploaded in its cache for the next mount: the boot
		// script must wait for the uploads before it unmounts.
		return nil
	}
	// goofys and gcsfuse uploaded every closed file at its close.
	final, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyTimeout)
	defer cancel()
	st, err = mirror.Sync(final)
	logRound(name, m, st, err)
	return err
}

// logRound logs a round as the client would: rclone's VFS cache line (which the boot script's
// flush reads) after each round of a cached mount, and errors for all.
func logRound(name string, m mountArgs, st bucketsync.Stats, err error) {
	now := time.Now().Format("2006/01/02 15:04:05")
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s ERROR : %s: %v\n", now, name, err)
		st.Pending++ // what failed is still to upload
	}
	if m.cached {
		fmt.Fprintf(os.Stderr, "%s INFO  : vfs cache: cleaned: objects %d (was %d) in use 0, to upload %d, uploading 0, total size %d (was %d)\n",
			now, st.Objects, st.Objects, st.Pending, st.Bytes, st.Bytes)
	}
}

// unmount is fusermount -u [-z] [-q] MOUNTPOINT: the daemon makes its last round and ends.
func unmount(args []string) error {
	var dir string
	unmounting := false
	for _, a := range args {
		switch a {
		case "-u":
			unmounting = true
		case "-z", "-q", "-uz", "-zu":
			unmounting = unmounting || strings.Contains(a, "u")
		default:
			if strings.HasPrefix(a, "-") {
				return fmt.Errorf("unknown option %s", a)
			}
			dir = a
		}
	}
	if !unmounting || dir == "" {
		return errors.New("usage: fusermount -u [-z] MOUNTPOINT (the stand-in only unmounts)")
	}
	pid := mounted(dir)
	if pid == 0 {
		return fmt.Errorf("entry for %s not found in /etc/mtab", dir)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return err
	}
	path, _ := pidFile(dir)
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s: the mount did not end within %v", dir, readyTimeout)
}
