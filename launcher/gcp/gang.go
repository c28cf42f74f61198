package gcp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
)

// LaunchGang launches n VMs of spec in one zone (the placement's, so the nodes are close),
// all or none: the nodes launch concurrently and, if any fails, every VM made is deleted
// before the error (the first failed node's, keeping its type for failover) is returned.
// A failure does not cancel the other nodes' launches: an insert cancelled in flight may
// still be carried out after the rollback looked for it, leaving a VM behind; letting each
// launch finish (bounded by LaunchTimeout) makes the rollback complete. Node RANK is named launcher.GangName(spec.Name, RANK, n) and gets
// its rank in the ferry.node-rank label and SKYPILOT_NODE_RANK / SKYPILOT_NUM_NODES.
func (p *Provider) LaunchGang(ctx context.Context, spec launcher.Spec, n int) ([]launcher.Instance, error) {
	if n < 1 {
		return nil, fmt.Errorf("gcp: %w: a gang needs at least one node, got %d", launcher.ErrInvalid, n)
	}
	zone, err := p.zoneFor(spec.Placement)
	if err != nil {
		return nil, err
	}
	spec.Placement.Zone = zone
	out := make([]launcher.Instance, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for rank := range n {
		wg.Go(func() {
			out[rank], errs[rank] = p.Launch(ctx, gangNode(spec, rank, n))
		})
	}
	wg.Wait()
	first := errors.Join(errs...)
	if first == nil {
		return out, nil
	}
	for _, err := range errs {
		if err != nil {
			first = err // the first node's error, keeping its type for failover
			break
		}
	}
	cleanup, stop := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer stop()
	var left []error
	for rank, inst := range out {
		if errs[rank] == nil {
			if err := p.delete(cleanup, zone, inst.Name); err != nil {
				left = append(left, fmt.Errorf("terminate %s: %w", inst.ID, err))
			}
		}
	}
	p.log.Info("gang launch failed; rolled back", zap.Int("nodes", n), zap.String("zone", zone), zap.Error(first))
	if len(left) > 0 {
		return nil, fmt.Errorf("gcp: gang of %d in %s failed: %w; cleanup: %w", n, zone, first, errors.Join(left...))
	}
	return nil, fmt.Errorf("gcp: gang of %d in %s failed: %w", n, zone, first)
}

// gangNode is spec for node rank of n (launcher.LaunchGang's naming, labels and environment).
func gangNode(spec launcher.Spec, rank, n int) launcher.Spec {
	s := spec
	s.Name = launcher.GangName(spec.Name, rank, n)
	s.Labels = maps.Clone(spec.Labels)
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	s.Labels[launcher.LabelNodeRank] = strconv.Itoa(rank)
	s.Envs = maps.Clone(spec.Envs)
	if s.Envs == nil {
		s.Envs = map[string]string{}
	}
	s.Envs[launcher.EnvNodeRank] = strconv.Itoa(rank)
	s.Envs[launcher.EnvNumNodes] = strconv.Itoa(n)
	return s
}
