package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/nodefiles"
	"github.com/ferryserve/ferry/launcher/optimizer"
)

// printFiles shows what the task's workdir and file_mounts will copy, and refuses, before
// anything is launched, files that no candidate infra can deliver (too big for every channel,
// gs:// where no infra has Google credentials). Candidates that cannot carry them are named:
// a launch skips them.
func printFiles(out io.Writer, task *configs.Task, cands []optimizer.Candidate) error {
	files, err := nodefiles.SpecFiles(launcher.Spec{Workdir: task.Workdir, FileMounts: task.FileMounts, MountModes: task.MountModes})
	if err != nil {
		return err
	}
	if files.Empty() {
		return nil
	}
	local, err := files.LocalBytes()
	if err != nil {
		return err
	}
	// Packing stops past the largest channel's limit: beyond it only local can take them.
	packedLen, packedSize := 0, ""
	switch packed, err := nodefiles.PackLocal(files, nodefiles.KubernetesFilesLimit, ""); {
	case errors.Is(err, nodefiles.ErrFiles):
		packedLen, packedSize = nodefiles.KubernetesFilesLimit+1, "over "+sizeOf(nodefiles.KubernetesFilesLimit)
	case err != nil:
		return err
	default:
		packedLen, packedSize = len(packed), sizeOf(int64(len(packed)))
	}
	fmt.Fprintf(out, "Files (copied at each launch unless mounted; local ones %s, %s packed):\n", sizeOf(local), packedSize)
	if files.Workdir != "" {
		fmt.Fprintf(out, "  ~/%s <- %s\n", nodefiles.WorkdirName, files.Workdir)
	}
	for _, m := range files.Mounts {
		note := ""
		switch {
		case m.Mounted():
			note = fmt.Sprintf(" (mounted, %s: reads and writes reach the bucket)", m.Mode)
		case m.Bucket != nil:
			note = " (listed at launch)"
		}
		fmt.Fprintf(out, "  %s <- %s%s\n", m.Dst, m.Src, note)
	}
	kinds := map[string]bool{}
	for _, c := range cands {
		kind, _, _ := strings.Cut(c.Placement.Infra, "/")
		kinds[kind] = true
	}
	var refused []error
	for _, kind := range slices.Sorted(maps.Keys(kinds)) {
		if err := nodefiles.FilesFit(files, kind, packedLen); err != nil {
			fmt.Fprintf(out, "  %s cannot take them and is skipped: %v\n", kind, err)
			refused = append(refused, fmt.Errorf("%s: %w", kind, err))
		}
	}
	fmt.Fprintln(out)
	if len(refused) > 0 && len(refused) == len(kinds) {
		return fmt.Errorf("no candidate infra can take the task's files: %w", errors.Join(refused...))
	}
	return nil
}

// sizeOf is n bytes for people.
func sizeOf(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}
