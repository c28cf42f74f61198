package gcp

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

// LaunchGang launches n VMs of spec in one zone (the placement's, so the nodes are close), all
// or none, with launcher.LaunchEach: concurrent inserts, and if any fails every VM made is
// deleted before the first failed node's error is returned (a capacity error wraps
// launcher.ErrNoCapacity, so the provisioner tries another zone). Inserts are not cancelled
// when another fails: an insert cancelled in flight may still be carried out after the
// rollback looked for it, leaving a VM behind; letting each finish (bounded by LaunchTimeout)
// makes the rollback complete. GCP's bulk insert would be atomic but gives every node the same
// startup script, and each node needs its rank.
//
// A job's gang learns its addresses after launch: once every node runs, each gets them as its
// metaNodeIPs attribute, which the nodes wait for before setup (job.go); if that fails, the
// whole gang is deleted.
func (p *Provider) LaunchGang(ctx context.Context, spec launcher.Spec, n int) ([]launcher.Instance, error) {
	zone, err := p.zoneFor(spec.Placement)
	if err != nil {
		return nil, err
	}
	spec.Placement.Zone = zone
	if flexWanted(spec) {
		return p.launchFlexGang(ctx, spec, n)
	}
	spec, setIPs := vmnode.WithNodeIPsCommand(spec, nodeIPsCommand)
	insts, err := launcher.LaunchEach(ctx, p, spec, n)
	if err == nil && setIPs {
		if err = p.setNodeIPs(ctx, insts); err != nil {
			for _, in := range insts {
				_, name, _ := parseID(in.ID)
				p.deleteQuietly(zone, name)
			}
		}
	}
	if err != nil {
		p.log.Info("gang launch failed; rolled back", zap.Int("nodes", n), zap.String("zone", zone), zap.Error(err))
		return nil, fmt.Errorf("gcp: in %s: %w", zone, err)
	}
	return insts, nil
}
