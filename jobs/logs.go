package jobs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/ferryserve/ferry/launcher"
)

// copyNodeLog writes instance id's whole output to w, from a local file where its infra keeps
// one, else through the infra's API.
func copyNodeLog(ctx context.Context, p Provider, id string, w io.Writer) error {
	if ls, ok := p.(launcher.LogSource); ok {
		if path, err := ls.LogPath(id); err == nil {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(w, f)
			return err
		}
	}
	if ls, ok := p.(launcher.LogStreamer); ok {
		return ls.StreamLogs(ctx, id, launcher.LogOptions{Tail: -1}, w)
	}
	return fmt.Errorf("%w: no log for %s", launcher.ErrNotFound, id)
}

// Logs writes node rank's output of job ref to w: the live node's while the job has a gang
// (following it with follow until that gang ends), else the last gang's archived log. When the
// job recovers while followed, it moves on to the new gang's node.
func (m *Manager) Logs(ctx context.Context, ref string, rank int, follow bool, w io.Writer) error {
	j, err := m.Find(ref)
	if err != nil {
		return err
	}
	n := j.Task.NumNodes
	if rank < 0 || rank >= max(n, 1) {
		return fmt.Errorf("%w: job %d has nodes 0–%d, not %d", ErrInvalid, j.ID, max(n, 1)-1, rank)
	}
	written := 0 // the attempt whose log was written last
	for {
		j, err = m.Get(j.ID)
		if err != nil {
			return err
		}
		if node, ok := nodeOf(j, rank); ok && j.Attempt > written {
			written = j.Attempt
			if err := m.liveLog(ctx, j, node, follow, w); err != nil {
				// The node is gone while the job still lists it (its pod deleted as the job
				// ended, before the job forgot it): its log is archived from before it was stopped.
				if !errors.Is(err, launcher.ErrNotFound) {
					return err
				}
				if _, aerr := m.archivedLog(ctx, j, rank, w); aerr != nil {
					return err
				}
			}
		} else if written == 0 && len(j.Nodes) == 0 {
			// No gang runs: the latest one's archive, if any has run.
			a, err := m.archivedLog(ctx, j, rank, w)
			switch {
			case err == nil:
				written = a
			case !follow:
				return err
			}
		}
		if !follow || j.State.Terminal() {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-m.Wait():
		case <-time.After(time.Second):
		}
	}
}

func nodeOf(j Job, rank int) (Node, bool) {
	for _, n := range j.Nodes {
		if n.Rank == rank {
			return n, true
		}
	}
	return Node{}, false
}

// archiveFrom writes attempt's archived log of rank from byte offset on, if it holds more.
func (m *Manager) archiveFrom(id int64, attempt, rank int, offset int64, w io.Writer) {
	f, err := os.Open(m.LogFile(id, attempt, rank))
	if err != nil {
		return
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err == nil {
		_, _ = io.Copy(w, f)
	}
}

// archivedLog writes the latest archived log of rank and returns its attempt; an archive
// still being written (its node is being stopped) is waited for, within ctx.
func (m *Manager) archivedLog(ctx context.Context, j Job, rank int, w io.Writer) (int, error) {
	for a := j.Attempt; a >= 1; a-- {
		path := m.LogFile(j.ID, a, rank)
		m.awaitArchive(ctx, path)
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		defer f.Close()
		_, err = io.Copy(w, f)
		return a, err
	}
	return 0, fmt.Errorf("%w: job %d has no log for node %d yet", ErrNotFound, j.ID, rank)
}

// liveLog writes a running node's output; with follow, until the node leaves the job's gang.
func (m *Manager) liveLog(ctx context.Context, j Job, node Node, follow bool, w io.Writer) error {
	if !follow {
		return copyNodeLog(ctx, m.cfg.Provider, node.InstanceID, w)
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Stop following once the node is no longer the job's (ended, recovered elsewhere).
	go func() {
		for {
			cur, err := m.Get(j.ID)
			if err != nil || cur.Attempt != j.Attempt || len(cur.Nodes) == 0 {
				time.Sleep(500 * time.Millisecond) // the last lines reach the file first
				cancel()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-m.Wait():
			case <-time.After(time.Second):
			}
		}
	}()
	if ls, ok := m.cfg.Provider.(launcher.LogSource); ok {
		if path, err := ls.LogPath(node.InstanceID); err == nil {
			return followFile(ctx, path, w)
		}
	}
	if ls, ok := m.cfg.Provider.(launcher.LogStreamer); ok {
		// A node that has not started yet (a pod still Pending) has no log to follow yet.
		cw := &launcher.CountingWriter{W: w}
		err := launcher.StreamLogsRetrying(ctx, ls, node.InstanceID, launcher.LogOptions{Tail: -1, Follow: true}, cw, time.Second)
		if err != nil && !errors.Is(err, launcher.ErrNotFound) { // ErrNotFound: the node went
			return err
		}
		// A polled log (a VM's console) lags its program by a poll, and the stream stops when
		// the node is stopped: the rest is in the node's archive, complete once the node has
		// left the job (the watcher above). Print what the stream did not.
		<-ctx.Done()
		if parent.Err() == nil {
			m.archiveFrom(j.ID, j.Attempt, node.Rank, cw.N, w)
		}
		return nil
	}
	return fmt.Errorf("%w: no log for %s", launcher.ErrNotFound, node.InstanceID)
}

// followFile copies path to w and then what is appended, until ctx ends. A file moved away
// (local keeps a terminated node's log under another name) ends the copy at what was read.
func followFile(ctx context.Context, path string, w io.Writer) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	flusher, _ := w.(interface{ Flush() })
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := io.Copy(w, f); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		select {
		case <-ctx.Done():
			_, _ = io.Copy(w, f)
			return nil
		case <-tick.C:
		}
	}
}

// labelsFor are a node's labels: Ferry's, the job's id and the attempt.
func labelsFor(id int64, attempt int) map[string]string {
	return map[string]string{
		launcher.LabelOwner:   "true",
		launcher.LabelJob:     strconv.FormatInt(id, 10),
		launcher.LabelAttempt: strconv.Itoa(attempt),
	}
}
