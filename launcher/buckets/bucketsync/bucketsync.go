// Package bucketsync keeps a local directory and a bucket prefix in step: a mounted bucket
// (SkyPilot's MOUNT, MOUNT_CACHED) where no FUSE client runs. It is a local instance's mount
// (launcher/local), and the engine of the stand-ins for goofys, gcsfuse and rclone that the
// fake clouds' VMs and the test cluster's pods run (launcher/buckets/fakefuse), which cannot
// load FUSE.
//
// A round (Sync) first pushes what changed in the directory since the last round (a new or
// changed file is uploaded whole, a deleted one is deleted from the bucket), then pulls what
// changed in the bucket (a new or changed object replaces a file that did not change here, a
// deleted object removes a file that did not). A local change wins over a concurrent change in
// the bucket, as the last close wins on a FUSE mount. What a reader sees is a FUSE mount's
// close-to-open consistency, delayed by up to a round: a file written and closed here is in the
// bucket after the next round; an object written elsewhere is here after the next round.
// Symbolic links, devices and empty directories are not synced (buckets hold none), and a round
// never reads or writes outside the directory: every path is opened through an os.Root of it,
// so a symbolic link that a program in the instance puts in place of a subdirectory (pointing at
// the controller's home, say) fails that file's transfer instead of being followed.
package bucketsync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// Store is the bucket side: launcher/buckets.Client.
type Store interface {
	// ListMount lists the objects under u (none is no error; a missing bucket is).
	ListMount(ctx context.Context, u nodefiles.BucketURL) ([]nodefiles.BucketObject, error)
	// Open reads one object.
	Open(ctx context.Context, u nodefiles.BucketURL, key string) (io.ReadCloser, error)
	// Put writes one object and returns its ETag, as ListMount gives it.
	Put(ctx context.Context, u nodefiles.BucketURL, key string, body io.ReadSeeker, size int64) (string, error)
	// Delete removes one object.
	Delete(ctx context.Context, u nodefiles.BucketURL, key string) error
}

// Stats is what a round did.
type Stats struct {
	// Objects is how many files the mount holds after the round.
	Objects int
	// Uploaded, Downloaded and Deleted count the round's transfers (Deleted: either side).
	Uploaded, Downloaded, Deleted int
	// Pending is how many files changed here after the round's push: still to upload.
	Pending int
	// Bytes is the size of the files the mount holds.
	Bytes int64
}

// synced is what a file was when it last matched its object.
type synced struct {
	size  int64
	mtime time.Time
	etag  string
}

// Mirror is one mounted bucket prefix and its directory. Not safe for concurrent use: one
// goroutine runs its rounds.
type Mirror struct {
	// WriteBack, when positive, holds a changed file back until it has not changed for that
	// long (rclone's --vfs-write-back): it is pending meanwhile.
	WriteBack time.Duration
	// Clock tells the time for WriteBack; default time.Now.
	Clock func() time.Time

	store Store
	url   nodefiles.BucketURL
	dir   string
	state map[string]synced // slash path under dir → its last synced form
}

// New mirrors u (a bucket, or a prefix as a directory) at dir, which it creates.
func New(store Store, u nodefiles.BucketURL, dir string) *Mirror {
	u.Prefix = u.DirPrefix()
	return &Mirror{store: store, url: u, dir: dir, state: map[string]synced{}}
}

// URL is the bucket prefix mirrored, as a directory.
func (m *Mirror) URL() nodefiles.BucketURL { return m.url }

// Sync runs one round: push, then pull.
func (m *Mirror) Sync(ctx context.Context) (Stats, error) {
	var st Stats
	if err := os.MkdirAll(m.dir, 0o755); err != nil {
		return st, err
	}
	root, err := os.OpenRoot(m.dir)
	if err != nil {
		return st, err
	}
	defer root.Close()
	if err := m.push(ctx, root, &st); err != nil {
		return st, fmt.Errorf("upload to %s: %w", m.url, err)
	}
	if err := m.pull(ctx, root, &st); err != nil {
		return st, fmt.Errorf("download from %s: %w", m.url, err)
	}
	local, err := walk(root)
	if err != nil {
		return st, err
	}
	for rel, info := range local {
		st.Objects++
		st.Bytes += info.Size()
		if m.changed(rel, info) {
			st.Pending++
		}
	}
	return st, nil
}

// Run runs a round at every tick until ctx ends, telling report after each round. A last
// round, if one is wanted, is the caller's.
func (m *Mirror) Run(ctx context.Context, tick <-chan time.Time, report func(Stats, error)) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			report(m.Sync(ctx))
		}
	}
}

// walk lists the regular files under root by slash path.
func walk(root *os.Root) (map[string]fs.FileInfo, error) {
	files := map[string]fs.FileInfo{}
	err := fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while we walked
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		files[p] = info
		return nil
	})
	return files, err
}

// changed says whether the file at rel differs from what was last synced there.
func (m *Mirror) changed(rel string, info fs.FileInfo) bool {
	s, ok := m.state[rel]
	return !ok || s.size != info.Size() || !s.mtime.Equal(info.ModTime())
}

// push uploads new and changed files and deletes the objects of deleted ones.
func (m *Mirror) push(ctx context.Context, root *os.Root, st *Stats) error {
	local, err := walk(root)
	if err != nil {
		return err
	}
	now := time.Now()
	if m.Clock != nil {
		now = m.Clock()
	}
	for _, rel := range slices.Sorted(maps.Keys(local)) {
		info := local[rel]
		if m.WriteBack > 0 && now.Sub(info.ModTime()) < m.WriteBack {
			continue // still held back: pending
		}
		if m.changed(rel, info) {
			if err := m.upload(ctx, root, rel, info); err != nil {
				return err
			}
			st.Uploaded++
		}
	}
	for _, rel := range slices.Sorted(maps.Keys(m.state)) {
		if _, ok := local[rel]; !ok {
			if err := m.store.Delete(ctx, m.url, m.url.Prefix+rel); err != nil {
				return err
			}
			delete(m.state, rel)
			st.Deleted++
		}
	}
	return nil
}

// upload writes one file to its object. The state keeps the file's form from before the
// read: a write during the upload shows as a change, uploaded again next round.
func (m *Mirror) upload(ctx context.Context, root *os.Root, rel string, info fs.FileInfo) error {
	f, err := root.Open(filepath.FromSlash(rel))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // removed since the walk: the next round deletes its object
	}
	if err != nil {
		return err
	}
	defer f.Close()
	etag, err := m.store.Put(ctx, m.url, m.url.Prefix+rel, f, info.Size())
	if err != nil {
		return err
	}
	m.state[rel] = synced{size: info.Size(), mtime: info.ModTime(), etag: etag}
	return nil
}

// pull downloads new and changed objects over files that did not change here, and removes
// the files of deleted objects that did not.
func (m *Mirror) pull(ctx context.Context, root *os.Root, st *Stats) error {
	objs, err := m.store.ListMount(ctx, m.url)
	if err != nil {
		return err
	}
	remote := map[string]nodefiles.BucketObject{}
	for _, o := range objs {
		rel := strings.TrimPrefix(o.Key, m.url.Prefix)
		if rel == "" || !filepath.IsLocal(filepath.FromSlash(rel)) {
			continue // the prefix itself, or a key that would leave the directory
		}
		remote[rel] = o
	}
	var skipped []error
	for _, rel := range slices.Sorted(maps.Keys(remote)) {
		o := remote[rel]
		if s, ok := m.state[rel]; ok && s.etag == o.ETag {
			continue
		}
		if _, err := root.Lstat(filepath.FromSlash(rel)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			// Its place in the directory cannot be reached from inside it (a symbolic link
			// out of it on the way): the other files still sync, and the round reports it.
			skipped = append(skipped, fmt.Errorf("%s: %w", rel, err))
			continue
		}
		if m.localChange(root, rel) {
			continue // written here since the push: it goes up next round
		}
		if err := m.download(ctx, root, rel, o); err != nil {
			var pe *fs.PathError
			if !errors.As(err, &pe) {
				return err // the bucket's side: the round stops
			}
			// This file's place in the directory (a symbolic link out of it, a file where a
			// directory goes): the others still sync, and the round reports it.
			skipped = append(skipped, fmt.Errorf("%s: %w", rel, err))
			continue
		}
		st.Downloaded++
	}
	for _, rel := range slices.Sorted(maps.Keys(m.state)) {
		if _, ok := remote[rel]; ok || m.localChange(root, rel) {
			continue
		}
		if err := root.Remove(filepath.FromSlash(rel)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		delete(m.state, rel)
		st.Deleted++
	}
	return errors.Join(skipped...)
}

// localChange says whether the file at rel changed since its last sync (a file there that was
// never synced is a change; none where none was synced is not).
func (m *Mirror) localChange(root *os.Root, rel string) bool {
	info, err := root.Stat(filepath.FromSlash(rel))
	if err != nil {
		_, was := m.state[rel]
		return !was && !errors.Is(err, fs.ErrNotExist)
	}
	return m.changed(rel, info)
}

// download replaces the file at rel with object o, whole (a reader never sees half of it).
func (m *Mirror) download(ctx context.Context, root *os.Root, rel string, o nodefiles.BucketObject) error {
	path := filepath.FromSlash(rel)
	if err := root.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	r, err := m.store.Open(ctx, m.url, o.Key)
	if err != nil {
		return err
	}
	defer r.Close()
	tmpName := filepath.Join(filepath.Dir(path), fmt.Sprintf(".bucketsync-%d-%d", os.Getpid(), time.Now().UnixNano()))
	tmp, err := root.OpenFile(tmpName, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(tmp, r); err != nil {
		tmp.Close()
		root.Remove(tmpName)
		return err
	}
	if err := tmp.Close(); err != nil {
		root.Remove(tmpName)
		return err
	}
	if err := root.Rename(tmpName, path); err != nil {
		root.Remove(tmpName)
		return err
	}
	info, err := root.Stat(path)
	if err != nil {
		return err
	}
	m.state[rel] = synced{size: info.Size(), mtime: info.ModTime(), etag: o.ETag}
	return nil
}
