package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// A local instance has no filesystem of its own, so its files are copies in its own
// directories (and its mounted buckets directories kept in step with them: mounts.go): the task's workdir is copied into the instance's working directory (where run
// starts, EnvWorkdir), and file mounts go under the instance's files root (EnvFilesRoot, in its
// directory under Dir): /data lands at $FERRY_FILES_ROOT/data and ~/x at
// $FERRY_FILES_ROOT$HOME/x. A program reads them through those variables; nothing is written
// at a mount's own path on this machine. Both are removed with the instance.

// filesDir is the files root's name in an instance's directory.
const filesDir = "files"

// syncFiles copies spec's workdir into work and its mounts under dir's files root, logging
// progress; a missing path or bucket fails the launch with nodefiles.ErrFiles.
func (p *Provider) syncFiles(ctx context.Context, spec launcher.Spec, dir, work string) error {
	files, err := nodefiles.SpecFiles(spec)
	if err != nil {
		return err
	}
	if files.Empty() {
		return nil
	}
	if n, err := files.LocalBytes(); err == nil {
		p.log.Info("syncing files", zap.String("name", spec.Name), zap.Int64("local_bytes", n), zap.Int("mounts", len(files.Mounts)))
	}
	root := filepath.Join(dir, filesDir)
	home := filepath.Join(root, os.Getenv("HOME"))
	progress := func(msg string) { p.log.Info("sync", zap.String("name", spec.Name), zap.String("files", msg)) }
	if err := nodefiles.SyncFilesLocal(ctx, files, p.opts.Buckets, work, root, home, progress); err != nil {
		return fmt.Errorf("%s: %w", spec.Name, err)
	}
	if err := p.startMounts(ctx, filepath.Base(dir), dir, files, root, home); err != nil {
		return fmt.Errorf("%s: %w", spec.Name, err)
	}
	return nil
}

// filesEnv tells the program where its files are.
func filesEnv(spec launcher.Spec, dir, work string) []string {
	var env []string
	if spec.Workdir != "" {
		env = append(env, nodefiles.EnvWorkdir+"="+work)
	}
	if len(spec.FileMounts) > 0 {
		env = append(env, nodefiles.EnvFilesRoot+"="+filepath.Join(dir, filesDir))
	}
	return env
}
