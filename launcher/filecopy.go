package launcher

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
// remote paths) or home (~/ and relative ones), bucket objects read through b. progress, when
// not nil, is told what is copied.
func SyncFilesLocal(ctx context.Context, f Files, b Buckets, workdir, root, home string, progress func(string)) error {
	if progress == nil {
		progress = func(string) {}
	}
	if f.Workdir != "" {
		progress(fmt.Sprintf("workdir %s -> %s", f.Workdir, workdir))
		if err := copyTree(f.Workdir, workdir); err != nil {
			return fmt.Errorf("sync workdir: %w", err)
		}
	}
	for _, m := range f.Mounts {
		if m.Mounted() {
			continue // the provider keeps it in step with the bucket (launcher/local)
		}
		rel, inHome, err := remotePath(m.Dst)
		if err != nil {
			return err
		}
		dst := filepath.Join(root, rel)
		if inHome {
			dst = filepath.Join(home, rel)
		}
		if m.Bucket == nil {
			progress(fmt.Sprintf("file_mounts %s: %s", m.Dst, m.Src))
			if err := copyTree(m.Src, dst); err != nil {
				return fmt.Errorf("file_mounts.%s: %w", m.Dst, err)
			}
			continue
		}
		if b == nil {
			return fmt.Errorf("%w: file_mounts.%s: no bucket client configured for %s", ErrFiles, m.Dst, m.Src)
		}
		if err := fetchBucketLocal(ctx, b, *m.Bucket, dst, progress); err != nil {
			return fmt.Errorf("file_mounts.%s: %w", m.Dst, err)
		}
	}
	return nil
}

// fetchBucketLocal downloads every object under u to dst.
func fetchBucketLocal(ctx context.Context, b Buckets, u BucketURL, dst string, progress func(string)) error {
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
		if err := fetchObject(ctx, b, u, o.Key, filepath.Join(dst, rel)); err != nil {
			return err
		}
		total += o.Size
		progress(fmt.Sprintf("%s: %d/%d objects, %d bytes", u, i+1, len(objs), total))
	}
	return nil
}

func fetchObject(ctx context.Context, b Buckets, u BucketURL, key, dst string) error {
	r, err := b.Open(ctx, u, key)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, r); err != nil {
		out.Close()
		return fmt.Errorf("download %s/%s: %w", u.Bucket, key, err)
	}
	return out.Close()
}

// copyTree copies the file or directory src to dst (dst becomes a copy of src; a directory's
// contents merge into an existing dst). Symbolic links are copied as links.
func copyTree(src, dst string) error {
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
			return os.MkdirAll(target, info.Mode().Perm()|0o700)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			_ = os.Remove(target)
			return os.Symlink(link, target)
		case d.Type().IsRegular():
			return copyFile(p, target, info.Mode().Perm())
		}
		return nil // sockets, devices: not files to sync
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm|0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
