package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher/buckets/bucketsync"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// A local instance's mounted bucket (MOUNT, MOUNT_CACHED) is a directory under its files root,
// like a copied one ($FERRY_FILES_ROOT/data for /data), that the provider keeps in step with
// the bucket while the instance runs (launcher/buckets/bucketsync), with the controller's
// credentials: the bucket's objects are there when the program starts, a file it writes
// reaches the bucket within a round (mountInterval), an object written elsewhere appears
// within a round, and when the program ends, or the instance is terminated, a last round
// uploads what it wrote since. No FUSE mount is made: nothing streams, the directory holds a
// full copy, and MOUNT_CACHED is the same as MOUNT. A controller that restarts does not take
// up the mounts of the instances it adopts: their later writes stay in their directories.

// mountInterval is how often a local mount makes a round.
const mountInterval = time.Second

// finalRoundTimeout bounds the last round of a local mount.
const finalRoundTimeout = time.Minute

// localMounts are the mounts the provider keeps in step, by instance id. The zero value is
// ready.
type localMounts struct {
	// interval overrides mountInterval (tests).
	interval time.Duration

	mu   sync.Mutex
	byID map[string]*localMount
}

// localMount is one instance's mounts' goroutine.
type localMount struct {
	stopOnce sync.Once
	stop     chan struct{} // closed to ask for the last round
	done     chan struct{} // closed once the last round is over
}

// startMounts mounts f's mounted buckets of instance id (directory dir) under root and home,
// as SyncFilesLocal places copies: a first round brings the buckets' objects, then a goroutine
// keeps them in step until the instance's process ends or Terminate calls stopMounts.
func (p *Provider) startMounts(ctx context.Context, id, dir string, f nodefiles.Files, root, home string) error {
	var mirrors []*bucketsync.Mirror
	for _, m := range f.Mounts {
		if !m.Mounted() {
			continue
		}
		store, ok := p.opts.Buckets.(bucketsync.Store)
		if !ok {
			return fmt.Errorf("%w: file_mounts.%s: the bucket client cannot write to %s", nodefiles.ErrFiles, m.Dst, m.Src)
		}
		rel, inHome, err := m.Remote()
		if err != nil {
			return err
		}
		at := filepath.Join(root, rel)
		if inHome {
			at = filepath.Join(home, rel)
		}
		mirror := bucketsync.New(store, *m.Bucket, at)
		if _, err := mirror.Sync(ctx); err != nil {
			return fmt.Errorf("file_mounts.%s: %w", m.Dst, err)
		}
		p.log.Info("mounted bucket", zap.String("instance", id), zap.String("mount", m.Dst), zap.String("bucket", m.Src), zap.String("mode", string(m.Mode)))
		mirrors = append(mirrors, mirror)
	}
	if len(mirrors) == 0 {
		return nil
	}
	lm := &localMount{stop: make(chan struct{}), done: make(chan struct{})}
	p.mounts.mu.Lock()
	if p.mounts.byID == nil {
		p.mounts.byID = map[string]*localMount{}
	}
	p.mounts.byID[id] = lm
	interval := p.mounts.interval
	p.mounts.mu.Unlock()
	if interval <= 0 {
		interval = mountInterval
	}
	go p.keepMounts(id, dir, mirrors, lm, interval)
	return nil
}

// keepMounts runs the rounds of one instance's mounts until its process ends, Terminate asks
// (a last round each time), or its directory is gone (a launch that failed: no round).
func (p *Provider) keepMounts(id, dir string, mirrors []*bucketsync.Mirror, lm *localMount, interval time.Duration) {
	defer close(lm.done)
	defer func() {
		if r := recover(); r != nil {
			p.log.Error("local mount panicked", zap.String("instance", id), zap.Any("panic", r))
		}
	}()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	round := func(ctx context.Context) {
		for _, m := range mirrors {
			if _, err := m.Sync(ctx); err != nil {
				p.log.Warn("sync a mounted bucket", zap.String("instance", id), zap.String("bucket", m.URL().String()), zap.Error(err))
			}
		}
	}
	for {
		select {
		case <-lm.stop:
		case <-ticker.C:
			if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
				p.forgetMounts(id, lm)
				return
			}
			if !p.exited(id) {
				ctx, cancel := context.WithTimeout(context.Background(), finalRoundTimeout)
				round(ctx)
				cancel()
				continue
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), finalRoundTimeout)
		round(ctx)
		cancel()
		p.forgetMounts(id, lm)
		return
	}
}

// exited says whether the process this provider started for instance id has ended.
func (p *Provider) exited(id string) bool {
	p.mu.Lock()
	c := p.children[id]
	p.mu.Unlock()
	if c == nil {
		return false // not started yet
	}
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (p *Provider) forgetMounts(id string, lm *localMount) {
	p.mounts.mu.Lock()
	defer p.mounts.mu.Unlock()
	if p.mounts.byID[id] == lm {
		delete(p.mounts.byID, id)
	}
}

// stopMounts makes the last round of instance id's mounts and waits for it, before Terminate
// removes their directories.
func (p *Provider) stopMounts(id string) {
	p.mounts.mu.Lock()
	lm := p.mounts.byID[id]
	p.mounts.mu.Unlock()
	if lm == nil {
		return
	}
	lm.stopOnce.Do(func() { close(lm.stop) })
	select {
	case <-lm.done:
	case <-time.After(finalRoundTimeout + time.Second):
		p.log.Warn("the last round of a local mount did not end", zap.String("instance", id))
	}
}
