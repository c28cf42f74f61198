package aws

import (
	"context"
	"fmt"
	"strings"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

// LaunchGang launches n instances of spec in one cluster placement group (one zone, low
// latency between nodes), all or none: if any node fails to run, or fails to reach running,
// every node is terminated and the group deleted. Each node gets its rank in its name, labels
// and environment (launcher.EnvNodeRank, launcher.EnvNumNodes), so nodes are launched by one
// RunInstances call each: one call with MinCount=n would be atomic in EC2 but gives every node
// the same user-data.
//
// A job's gang learns its addresses after launch: the nodes wait for them before setup, and
// LaunchGang tags every node with them, rank 0 first, once all run (job.go). A gang that EC2
// cannot fit in the zone (a capacity error on any node) is rolled back and the error wraps
// launcher.ErrNoCapacity, so the provisioner tries the next zone or region.
//
// After a successful gang the placement group stays (it costs nothing; the account limit is
// 500): deleting it when the gang's last node is terminated is not done yet.
func (p *Provider) LaunchGang(ctx context.Context, spec launcher.Spec, n int) ([]launcher.Instance, error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: a gang needs at least one node, got %d", launcher.ErrInvalid, n)
	}
	if spec.Job != nil && n > maxGang && len(spec.Job.NodeIPs) == 0 {
		return nil, fmt.Errorf("%w: %s: a job's gang is at most %d nodes (its addresses go in one tag)", launcher.ErrInvalid, InfraName, maxGang)
	}
	if n == 1 {
		inst, err := p.Launch(ctx, launcher.GangNode(spec, 0, 1))
		if err != nil {
			return nil, err
		}
		return []launcher.Instance{inst}, nil
	}
	spec, tagIPs := vmnode.WithNodeIPsCommand(spec, nodeIPsCommand)
	lp, err := p.plan(ctx, spec, true)
	if err != nil {
		return nil, err
	}
	c := p.clients[lp.region]
	if lp.reservation == nil {
		if err := p.createPlacementGroup(ctx, c, &lp, spec.Name); err != nil {
			return nil, err
		}
	}
	var ids []string
	fail := func(err error) ([]launcher.Instance, error) {
		if ctx.Err() == nil || len(ids) == 0 {
			p.cleanUp(err, func() { p.rollBack(lp.region, lp.placementGroup, ids) })
		}
		return nil, fmt.Errorf("gang of %d in %s: %w", n, lp.zone, err)
	}
	for rank := range n {
		id, err := p.run(ctx, lp, launcher.GangNode(spec, rank, n))
		if err != nil {
			return fail(err)
		}
		ids = append(ids, id)
	}
	insts, err := p.waitRunning(ctx, lp.region, ids)
	if err == nil {
		err = p.admitInstances(ctx, lp, insts)
	}
	if err == nil && tagIPs {
		err = p.tagNodes(ctx, lp.region, insts)
	}
	if err != nil {
		return fail(err)
	}
	lp.setWindow(insts)
	p.log.Info("gang running", zap.String("name", spec.Name), zap.Int("nodes", n), zap.String("placement_group", lp.placementGroup))
	return insts, nil
}

// createPlacementGroup makes the gang's cluster placement group. A gang in a capacity block
// goes without one: the block's instances are already placed close together ("Work with
// Capacity Blocks": "there is no need to use a cluster placement group").
func (p *Provider) createPlacementGroup(ctx context.Context, c *ec2.Client, lp *launchPlan, name string) error {
	lp.placementGroup = placementGroupName(name)
	_, err := c.CreatePlacementGroup(ctx, &ec2.CreatePlacementGroupInput{
		GroupName: awssdk.String(lp.placementGroup),
		Strategy:  types.PlacementStrategyCluster,
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypePlacementGroup,
			Tags: []types.Tag{{Key: awssdk.String(launcher.LabelOwner), Value: awssdk.String("true")}}}},
	})
	if err != nil {
		return classify(err, "create placement group "+lp.placementGroup)
	}
	return nil
}

// rollBack terminates a failed gang's nodes, waits (bounded) until they are terminated so the
// placement group is no longer in use, and deletes the group.
func (p *Provider) rollBack(region, group string, ids []string) {
	p.terminateQuietly(region, ids)
	if group == "" {
		return // a gang in a capacity block has no placement group
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	c := p.clients[region]
	wait := p.opts.PollInterval
	for len(ids) > 0 {
		out, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: ids})
		if err == nil && allTerminated(out) {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			p.log.Warn("placement group of a failed gang left behind: its nodes did not terminate in time", zap.String("group", group))
			return
		case <-t.C:
		}
		wait = min(wait*3/2, maxPollInterval)
	}
	if _, err := c.DeletePlacementGroup(ctx, &ec2.DeletePlacementGroupInput{GroupName: awssdk.String(group)}); err != nil {
		p.log.Warn("delete placement group of a failed gang", zap.String("group", group), zap.Error(err))
	}
}

func allTerminated(out *ec2.DescribeInstancesOutput) bool {
	for _, r := range out.Reservations {
		for _, in := range r.Instances {
			if in.State == nil || in.State.Name != types.InstanceStateNameTerminated {
				return false
			}
		}
	}
	return true
}

// placementGroupName is "ferry-NAME-RANDOM", within EC2's 255 characters.
func placementGroupName(name string) string {
	var b strings.Builder
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	base := b.String()
	if len(base) > 200 {
		base = base[:200]
	}
	return "ferry-" + base + "-" + randomHex(6)
}
