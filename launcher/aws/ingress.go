package aws

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
)

// Who may reach a replica's service port. Every replica runs in one security group per region
// (Options.SecurityGroup) whose ingress rules admit the service ports from the proxies only:
//
//   - the configured sources (Options.IngressCIDRs, Options.IngressSecurityGroups: the
//     controller and its attached proxies), exactly; or, with none configured,
//   - the controller alone, at the address its host sends from to each replica
//     (launcher.RouteSource), added when a replica runs or is adopted. When that address
//     cannot be told, nothing is admitted and the log says so: fail safe, never a private
//     range.
//
// Each rule Ferry adds carries a description saying why, so that narrowing, once per region
// and port in each controller process, knows which rules are Ferry's: the old rule that opened
// the port to all private ranges (descLegacy) and configured sources no longer configured are
// revoked; addresses of earlier controllers are kept while none is configured (two
// controllers may share the group); rules someone else added are left alone and logged.
const (
	descConfigured = "ferry: proxy (config.yaml)"
	descController = "ferry: controller (route source)"
	// descLegacy marks the rule Ferry added before it narrowed ingress: the service port open
	// to 10.0.0.0/8, 172.16.0.0/12 and 192.168.0.0/16.
	descLegacy = "ferry service port"
)

// source is one ingress source: a CIDR block or a security group id.
type source struct{ cidr, group string }

func (s source) String() string { return s.cidr + s.group }

// permission admits s to port, with desc.
func (s source) permission(port int, desc string) types.IpPermission {
	perm := types.IpPermission{IpProtocol: awssdk.String("tcp"), FromPort: awssdk.Int32(int32(port)), ToPort: awssdk.Int32(int32(port))}
	if s.group != "" {
		perm.UserIdGroupPairs = []types.UserIdGroupPair{{GroupId: awssdk.String(s.group), Description: awssdk.String(desc)}}
	} else {
		perm.IpRanges = []types.IpRange{{CidrIp: awssdk.String(s.cidr), Description: awssdk.String(desc)}}
	}
	return perm
}

// configuredSources validates and returns Options' sources, CIDR blocks in canonical form.
func configuredSources(opts Options) ([]source, error) {
	var out []source
	for _, c := range opts.IngressCIDRs {
		prefix, err := netip.ParsePrefix(strings.TrimSpace(c))
		if err != nil {
			return nil, fmt.Errorf("%w: %s: ingress CIDR %q: %v", launcher.ErrInvalid, InfraName, c, err)
		}
		out = append(out, source{cidr: prefix.Masked().String()})
	}
	for _, g := range opts.IngressSecurityGroups {
		if !strings.HasPrefix(g, "sg-") {
			return nil, fmt.Errorf("%w: %s: ingress security group %q is not a group id (sg-...)", launcher.ErrInvalid, InfraName, g)
		}
		out = append(out, source{group: g})
	}
	return out, nil
}

// regionIngress is what the provider has done to one region's security groups in this
// process. Its mutex serialises changes to them, and is held across the calls that make them:
// one per region, so that a region whose endpoint hangs or fails holds up only its own
// launches, never another region's.
type regionIngress struct {
	mu       sync.Mutex
	group    string          // the Ferry security group's id
	admitted map[string]bool // "region/port/source" the controller was admitted from
	narrowed map[string]bool // "region/port" narrowed
	// jobGroup is the job security group's id, made with its rule.
	jobGroup string
}

func newRegionIngress() *regionIngress {
	return &regionIngress{admitted: map[string]bool{}, narrowed: map[string]bool{}}
}

func portKey(region string, port int) string { return region + "/" + strconv.Itoa(port) }

// ensureIngress returns region's security group id, creating the group on first use, and
// makes its rules for port what they should be: the configured sources admitted and old
// rules narrowed (once per process), and, with no source configured and ip the address of a
// replica, the controller's route source to ip admitted. Callers may race: a duplicate rule
// is success.
func (p *Provider) ensureIngress(ctx context.Context, region string, port int, ip string) (string, error) {
	c, err := p.client(region)
	if err != nil {
		return "", err
	}
	ri := p.ingress[region]
	ri.mu.Lock()
	defer ri.mu.Unlock()
	id, err := p.ensureGroup(ctx, c, region)
	if err != nil {
		return "", err
	}
	// Admit before narrowing, so that live replicas never lose their controller meanwhile.
	if len(p.sources) == 0 && ip != "" {
		if err := p.admitController(ctx, c, region, id, port, ip); err != nil {
			return "", err
		}
	}
	if key := portKey(region, port); !ri.narrowed[key] {
		if err := p.narrow(ctx, c, region, id, port); err != nil {
			return "", err
		}
		ri.narrowed[key] = true
	}
	return id, nil
}

// ensureGroup returns the id of region's Ferry security group, creating it on first use.
// Callers hold the region's ingress lock.
func (p *Provider) ensureGroup(ctx context.Context, c *ec2.Client, region string) (string, error) {
	if id := p.ingress[region].group; id != "" {
		return id, nil
	}
	id, err := p.findOrCreateGroup(ctx, c, region, p.opts.SecurityGroup, "Ferry replicas: service ports, from the proxies only")
	if err != nil {
		return "", err
	}
	p.ingress[region].group = id
	return id, nil
}

// descGang is the rule of the job security group that lets its members reach each other.
const descGang = "ferry: nodes of a job's gang reach each other"

// ensureJobGroup returns the id of region's job security group (Options.JobSecurityGroup),
// creating it on first use with one rule: all traffic from its own members. A job's nodes run
// in it besides the Ferry group, so that a gang's ranks reach each other on any port (a
// rendezvous, NCCL's sockets) while replicas stay reachable from the proxies only. Every job's
// nodes in the region share it, so the nodes of two jobs can reach each other too; a group
// per gang would keep them apart, at the cost of a group to delete per gang. Callers hold
// the region's ingress lock.
func (p *Provider) ensureJobGroup(ctx context.Context, c *ec2.Client, region string) (string, error) {
	if id := p.ingress[region].jobGroup; id != "" {
		return id, nil
	}
	id, err := p.findOrCreateGroup(ctx, c, region, p.opts.JobSecurityGroup, "Ferry job nodes: all traffic between the nodes of a gang")
	if err != nil {
		return "", err
	}
	_, err = c.AuthorizeSecurityGroupIngress(ctx, &ec2.AuthorizeSecurityGroupIngressInput{
		GroupId: awssdk.String(id),
		IpPermissions: []types.IpPermission{{
			IpProtocol: awssdk.String("-1"), FromPort: awssdk.Int32(-1), ToPort: awssdk.Int32(-1),
			UserIdGroupPairs: []types.UserIdGroupPair{{GroupId: awssdk.String(id), Description: awssdk.String(descGang)}},
		}},
	})
	if err != nil && errorCode(err) != "InvalidPermission.Duplicate" {
		return "", classify(err, "let the nodes in security group "+id+" reach each other")
	}
	p.ingress[region].jobGroup = id
	return id, nil
}

// findOrCreateGroup returns the id of the security group name, creating it when it is not
// there. Callers hold the region's ingress lock.
func (p *Provider) findOrCreateGroup(ctx context.Context, c *ec2.Client, region, name, description string) (string, error) {
	found, err := c.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{
		Filters: []types.Filter{{Name: awssdk.String("group-name"), Values: []string{name}}},
	})
	if err != nil {
		return "", classify(err, "describe security group "+name)
	}
	var id string
	if len(found.SecurityGroups) > 0 {
		id = awssdk.ToString(found.SecurityGroups[0].GroupId)
	} else {
		created, err := c.CreateSecurityGroup(ctx, &ec2.CreateSecurityGroupInput{
			GroupName:   awssdk.String(name),
			Description: awssdk.String(description),
			TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeSecurityGroup,
				Tags: []types.Tag{{Key: awssdk.String(launcher.LabelOwner), Value: awssdk.String("true")}}}},
		})
		if err != nil {
			return "", classify(err, "create security group "+name)
		}
		id = awssdk.ToString(created.GroupId)
		p.log.Info("created security group", zap.String("region", region), zap.String("group", name), zap.String("id", id))
	}
	return id, nil
}

// admitController admits the address this host sends from to ip. When it cannot be told, the
// port stays closed to the controller, and the log says what to configure. Callers hold the
// region's ingress lock.
func (p *Provider) admitController(ctx context.Context, c *ec2.Client, region, groupID string, port int, ip string) error {
	prefix, err := p.routeSource(ip)
	if err != nil {
		p.log.Error("the controller's address is unknown, so the service port admits no one: set aws.proxy_cidrs or aws.proxy_security_groups in config.yaml",
			zap.String("region", region), zap.String("security_group", groupID), zap.Int("port", port), zap.Error(err))
		return nil
	}
	src := source{cidr: prefix.String()}
	key := portKey(region, port) + "/" + src.String()
	if p.ingress[region].admitted[key] {
		return nil
	}
	if err := p.authorize(ctx, c, groupID, port, src, descController); err != nil {
		return err
	}
	p.ingress[region].admitted[key] = true
	p.log.Info("admitted the controller to the service port (no proxy sources configured)", zap.String("region", region),
		zap.String("security_group", groupID), zap.Int("port", port), zap.String("source", src.String()))
	return nil
}

func (p *Provider) authorize(ctx context.Context, c *ec2.Client, groupID string, port int, src source, desc string) error {
	_, err := c.AuthorizeSecurityGroupIngress(ctx, &ec2.AuthorizeSecurityGroupIngressInput{
		GroupId: awssdk.String(groupID), IpPermissions: []types.IpPermission{src.permission(port, desc)},
	})
	if err != nil && errorCode(err) != "InvalidPermission.Duplicate" {
		return classify(err, fmt.Sprintf("admit %s to port %d in security group %s", src, port, groupID))
	}
	return nil
}

// narrow makes port's rules in the group the configured sources (admitted first), revoking
// the rules Ferry added that no longer belong. Callers hold the region's ingress lock.
func (p *Provider) narrow(ctx context.Context, c *ec2.Client, region, groupID string, port int) error {
	out, err := c.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{GroupIds: []string{groupID}})
	if err != nil {
		return classify(err, "describe security group "+groupID)
	}
	have := rulesOn(out.SecurityGroups, port)
	for _, src := range p.sources {
		if _, ok := have[src]; !ok {
			if err := p.authorize(ctx, c, groupID, port, src, descConfigured); err != nil {
				return err
			}
		}
	}
	var revoked, earlier, foreign []string
	for _, src := range slices.SortedFunc(maps.Keys(have), func(a, b source) int { return strings.Compare(a.String(), b.String()) }) {
		switch desc := have[src]; {
		case slices.Contains(p.sources, src):
		case desc == descLegacy, desc == descConfigured, desc == descController && len(p.sources) > 0:
			_, err := c.RevokeSecurityGroupIngress(ctx, &ec2.RevokeSecurityGroupIngressInput{
				GroupId: awssdk.String(groupID), IpPermissions: []types.IpPermission{src.permission(port, desc)},
			})
			if err != nil && errorCode(err) != "InvalidPermission.NotFound" {
				return classify(err, fmt.Sprintf("revoke %s from port %d in security group %s", src, port, groupID))
			}
			revoked = append(revoked, src.String())
		case desc == descController:
			earlier = append(earlier, src.String())
		default:
			foreign = append(foreign, src.String())
		}
	}
	p.logNarrowed(region, groupID, port, revoked, earlier, foreign)
	return nil
}

func (p *Provider) logNarrowed(region, groupID string, port int, revoked, earlier, foreign []string) {
	log := p.log.With(zap.String("region", region), zap.String("security_group", groupID), zap.Int("port", port))
	if len(p.sources) > 0 {
		sources := make([]string, len(p.sources))
		for i, s := range p.sources {
			sources[i] = s.String()
		}
		log.Info("the service port admits the configured proxy sources", zap.Strings("sources", sources))
	}
	if len(revoked) > 0 {
		log.Warn("narrowed the service port: revoked rules Ferry had added that admit more than the proxies", zap.Strings("revoked", revoked))
	}
	if len(earlier) > 0 {
		log.Info("the service port still admits addresses earlier controllers ran at; revoke those no longer in use by hand", zap.Strings("sources", earlier))
	}
	if len(foreign) > 0 {
		log.Warn("the service port admits sources Ferry did not add; left as they are", zap.Strings("sources", foreign))
	}
}

// rulesOn is the group's sources for tcp port exactly, with their descriptions.
func rulesOn(groups []types.SecurityGroup, port int) map[source]string {
	out := map[source]string{}
	for _, g := range groups {
		for _, perm := range g.IpPermissions {
			if awssdk.ToString(perm.IpProtocol) != "tcp" || awssdk.ToInt32(perm.FromPort) != int32(port) || awssdk.ToInt32(perm.ToPort) != int32(port) {
				continue
			}
			for _, r := range perm.IpRanges {
				out[source{cidr: awssdk.ToString(r.CidrIp)}] = awssdk.ToString(r.Description)
			}
			for _, pair := range perm.UserIdGroupPairs {
				out[source{group: awssdk.ToString(pair.GroupId)}] = awssdk.ToString(pair.Description)
			}
		}
	}
	return out
}

// adoptIngress runs ensureIngress for the ports of instances an earlier controller launched,
// once per region and port in this process (launcher.IngressAdoption).
func (p *Provider) adoptIngress(ctx context.Context, insts []launcher.Instance) {
	p.adoption.Adopt(insts, func(in launcher.Instance, port int) (string, bool) {
		return portKey(in.Region, port), p.ingress[in.Region] != nil
	}, func(in launcher.Instance, host string, port int) error {
		_, err := p.ensureIngress(ctx, in.Region, port, host)
		return err
	}, func(in launcher.Instance, port int, err error) {
		p.log.Warn("could not set the service port's ingress for adopted instances; retrying later", zap.String("region", in.Region), zap.Int("port", port), zap.Error(err))
	})
}
