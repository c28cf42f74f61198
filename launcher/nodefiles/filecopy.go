package nodefiles

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// SyncFilesLocal copies f into an instance that is a directory tree on this machine (a local
// replica, a local job node): the workdir into workdir, each mount under root (absolute
// remote paths) or home (~/ and relative ones, home being inside root), bucket objects read
// through b. progress, when not nil, is told what is copied.
//
// Every write stays beneath workdir or root: they are opened as os.Root, which resolves each
// path one component at a time (openat with O_NOFOLLOW, as openat2's RESOLVE_BENEATH) and
// refuses a symbolic link that leads out. So a link that the workdir or an earlier mount put
// there (link -> ~/.bashrc) cannot make a later copy write outside the instance's directories.
func SyncFilesLocal(ctx context.Context, f Files, b Buckets, workdir, root, home string, progress func(string)) error {
	if progress == nil {
		progress = func(string) {}
	}
	if f.Workdir != "" {
		progress(fmt.Sprintf("workdir %s -> %s", f.Workdir, workdir))
		if err := copyTreeBeneath(f.Workdir, workdir, "."); err != nil {
			return fmt.Errorf("sync workdir: %w", err)
		}
	}
	if len(f.Mounts) == 0 {
		return nil
	}
	homeRel, err := filepath.Rel(root, home)
	if err != nil || !filepath.IsLocal(homeRel) {
		return fmt.Errorf("%w: the home directory %s is not inside the files root %s", ErrFiles, home, root)
	}
	files, err := openBeneath(root)
	if err != nil {
		return err
	}
	defer files.Close()
	for _, m := range f.Mounts {
		if m.Mounted() {
			continue // the provider keeps it in step with the bucket (launcher/local)
		}
		rel, inHome, err := RemotePath(m.Dst)
		if err != nil {
			return err
		}
		if inHome {
			rel = filepath.Join(homeRel, rel)
		}
		if m.Bucket == nil {
			progress(fmt.Sprintf("file_mounts %s: %s", m.Dst, m.Src))
			if err := copyTree(m.Src, files, rel); err != nil {
				return fmt.Errorf("file_mounts.%s: %w", m.Dst, err)
			}
			continue
		}
		if b == nil {
			return fmt.Errorf("%w: file_mounts.%s: no bucket client configured for %s", ErrFiles, m.Dst, m.Src)
		}
		if err := fetchBucketLocal(ctx, b, *m.Bucket, files, rel, progress); err != nil {
			return fmt.Errorf("file_mounts.%s: %w", m.Dst, err)
		}
	}
	return nil
}

// openBeneath creates dir if needed and opens it as the root of the copies written under it.
func openBeneath(dir string) (*os.Root, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return os.OpenRoot(dir)
}

// copyTreeBeneath copies src to dst (a path inside dir) with every write beneath dir.
func copyTreeBeneath(src, dir, dst string) error {
	r, err := openBeneath(dir)
	if err != nil {
		return err
	}
	defer r.Close()
	return copyTree(src, r, dst)
}

// fetchBucketLocal downloads every object under u to dst, a path inside r.
func fetchBucketLocal(ctx context.Context, b Buckets, u BucketURL, r *os.Root, dst string, progress func(string)) error {
	objs, err := b.List(ctx, u)
	if err != nil {
		return err
	}
	var total int64
	for i, o := range objs {
		rel := objectPath(u, o.Key)
		if rel != "" && !filepath.IsLocal(rel) {
			return fmt.Errorf("%w: object %q leaves its mount", ErrFiles, o.Key)
		}
		if err := fetchObject(ctx, b, u, o.Key, r, filepath.Join(dst, rel)); err != nil {
			return err
		}
		total += o.Size
		progress(fmt.Sprintf("%s: %d/%d objects, %d bytes", u, i+1, len(objs), total))
	}
	return nil
}

func fetchObject(ctx context.Context, b Buckets, u BucketURL, key string, r *os.Root, dst string) error {
	in, err := b.Open(ctx, u, key)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := r.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return beneathError(err)
	}
	out, err := r.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return beneathError(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("download %s/%s: %w", u.Bucket, key, err)
	}
	return out.Close()
}

// copyTree copies the file or directory src to dst, a path inside r (dst becomes a copy of
// src; a directory's contents merge into an existing dst). Symbolic links are copied as links,
// and never followed out of r when writing.
func copyTree(src string, r *os.Root, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return beneathError(r.MkdirAll(target, info.Mode().Perm()|0o700))
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := r.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return beneathError(err)
			}
			_ = r.Remove(target)
			return beneathError(r.Symlink(link, target))
		case d.Type().IsRegular():
			return copyFile(p, r, target, info.Mode().Perm())
		}
		return nil // sockets, devices: not files to sync
	})
}

func copyFile(src string, r *os.Root, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := r.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return beneathError(err)
	}
	out, err := r.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm|0o600)
	if err != nil {
		return beneathError(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// beneathError says where a write inside the instance's files failed: os.Root refuses one
// through a symbolic link that leads out ("path escapes from parent"), which a workdir or an
// earlier mount may have put there.
func beneathError(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w (Ferry writes only inside the instance's directories and follows no symbolic link out of them)", err)
}
