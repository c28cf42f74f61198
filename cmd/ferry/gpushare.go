package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/ferryserve/ferry/internal/infra"
	"github.com/ferryserve/ferry/launcher/kubernetes"
)

// sharedCapacity is the part of a context show-gpus asks for its sharing nodes.
type sharedCapacity interface {
	Infra() string
	SharedCapacity(ctx context.Context) ([]kubernetes.NodeShare, error)
}

var _ sharedCapacity = (*kubernetes.Provider)(nil)

// writeSharedGPUs prints, per context whose nodes share GPUs (HAMi), each node's GPUs and the
// memory and cores still free; contexts without sharing nodes print nothing. name filters by
// GPU name as the rest of show-gpus does.
func writeSharedGPUs(ctx context.Context, out io.Writer, kubes []sharedCapacity, name string) {
	for _, k := range kubes {
		cctx, cancel := context.WithTimeout(ctx, askTimeout)
		shares, err := k.SharedCapacity(cctx)
		cancel()
		if err != nil {
			fmt.Fprintf(out, "  %s: shared GPUs: %v\n", k.Infra(), err)
			continue
		}
		var rows []kubernetes.NodeShare
		for _, s := range shares {
			if name == "" || strings.Contains(strings.ToLower(s.Accelerator), strings.ToLower(name)) {
				rows = append(rows, s)
			}
		}
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(out, "Shared GPUs on %s (HAMi: fractions and gpu_share fit here)\n", k.Infra())
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  NODE\tGPU\tGPUS\tMEMORY FREE\tCORES FREE\tPODS")
		for _, s := range rows {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%d / %d MiB\t%d / %d%%\t%d\n",
				s.Node, s.Accelerator, s.GPUs, s.MemoryFree, s.MemoryMiB, s.CoresFree, s.Cores, s.Pods)
		}
		_ = tw.Flush()
	}
}

func kubeCapacities(set *infra.Set) []sharedCapacity {
	out := make([]sharedCapacity, len(set.Kube))
	for i, k := range set.Kube {
		out[i] = k
	}
	return out
}
