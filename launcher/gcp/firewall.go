package gcp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/ferryserve/ferry/launcher"
)

// Who may reach a replica's service port. Each port has two rules on the provider's network,
// both for the VMs tagged ferry-port-PORT:
//
//   - ferry-allow-PORT (priority allowPriority) admits the proxies: Options.IngressCIDRs and
//     Options.IngressTags exactly or, with neither, the controller alone, at the address its
//     host sends from to each replica (launcher.RouteSource), added when a replica runs or is
//     adopted. When that address cannot be told, the rule is not made (GCP reads an ingress
//     rule without sources as 0.0.0.0/0) and the log says so: fail safe.
//   - ferry-deny-PORT (priority denyPriority) denies everyone else, so that allow rules of
//     lower priority do not admit them either: the default network's default-allow-internal
//     (65534), or an operator's rules at gcloud's default priority (1000).
//
// The allow rule's description says which kind of sources it holds, so that once per port in
// each process it is made what it should be: the rule Ferry made before (every private range,
// or 0.0.0.0/0 with a public IP) and configured sources no longer configured are replaced;
// addresses of earlier controllers are kept while none is configured (two controllers may
// share the rule).
const (
	allowPriority = 900
	denyPriority  = 910
	// descLegacy is the rule Ferry made before it narrowed ingress.
	descLegacy     = "Ferry: the service port of Ferry's replicas"
	descConfigured = "Ferry: the service port of Ferry's replicas, from the proxies in config.yaml"
	descController = "Ferry: the service port of Ferry's replicas, from the controller's route source"
	descDeny       = "Ferry: the service port of Ferry's replicas, closed to all but the ferry-allow rule"
)

// A job's nodes carry the network tag jobTag, and one rule, ferry-jobs (priority
// jobsPriority, above the deny rules), admits all TCP, UDP and ICMP from VMs with that tag to
// VMs with that tag: a gang's ranks reach each other on any port (a rendezvous, NCCL's
// sockets), the service port included, on any network, not only on the default network with
// its default-allow-internal. Every job's nodes share it, so two jobs' nodes can reach each
// other too; a tag and rule per gang would keep them apart.
const (
	jobTag       = "ferry-job"
	jobsPriority = 890
	descJobs     = "Ferry: the nodes of a job's gang reach each other"
)

// ensureJobsRule creates the ferry-jobs rule unless it exists (once per process).
func (p *Provider) ensureJobsRule(ctx context.Context) error {
	if p.opts.SkipFirewall {
		return nil
	}
	p.fwMu.Lock()
	defer p.fwMu.Unlock()
	if p.fw.jobs {
		return nil
	}
	name := "ferry-jobs"
	if p.opts.Network != DefaultNetwork {
		name = "ferry-" + p.opts.Network + "-jobs"
	}
	cur, err := p.getFirewall(ctx, name)
	if err != nil {
		return err
	}
	if cur == nil {
		op, err := p.firewalls.Insert(ctx, &computepb.InsertFirewallRequest{Project: p.opts.Project, FirewallResource: &computepb.Firewall{
			Name:        proto.String(name),
			Description: proto.String(descJobs),
			Network:     proto.String("global/networks/" + p.opts.Network),
			Direction:   proto.String("INGRESS"),
			Priority:    proto.Int32(jobsPriority),
			Allowed: []*computepb.Allowed{
				{IPProtocol: proto.String("tcp")}, {IPProtocol: proto.String("udp")}, {IPProtocol: proto.String("icmp")},
			},
			SourceTags: []string{jobTag},
			TargetTags: []string{jobTag},
		}})
		switch {
		case err != nil && !isConflict(err):
			return classify(err, "insert firewall "+name)
		case err == nil:
			if err := p.waitGlobalOp(ctx, op.Proto()); err != nil {
				return fmt.Errorf("gcp: insert firewall %s: %w", name, err)
			}
			p.log.Info("created firewall rule letting the nodes of a job reach each other", zap.String("firewall", name))
		}
	}
	p.fw.jobs = true
	return nil
}

// firewallState is what the provider has done to its firewall rules in this process.
type firewallState struct {
	jobs     bool            // the ferry-jobs rule is in place
	settled  map[int]bool    // port: allow rule made what it should be, deny rule in place
	denied   map[int]bool    // port: deny rule in place
	admitted map[string]bool // "port/source": the controller admitted from source
}

// networkTagRE is a GCE network tag.
var networkTagRE = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

// checkIngress validates Options' sources and returns the CIDR blocks in canonical form.
func checkIngress(opts Options) ([]string, error) {
	var cidrs []string
	for _, c := range opts.IngressCIDRs {
		prefix, err := netip.ParsePrefix(strings.TrimSpace(c))
		if err != nil {
			return nil, fmt.Errorf("gcp: %w: ingress CIDR %q: %v", launcher.ErrInvalid, c, err)
		}
		cidrs = append(cidrs, prefix.Masked().String())
	}
	for _, tag := range opts.IngressTags {
		if !networkTagRE.MatchString(tag) {
			return nil, fmt.Errorf("gcp: %w: ingress tag %q is not a network tag", launcher.ErrInvalid, tag)
		}
	}
	return cidrs, nil
}

// configured reports whether the operator listed the proxies' sources.
func (p *Provider) configured() bool { return len(p.opts.IngressCIDRs)+len(p.opts.IngressTags) > 0 }

func (p *Provider) firewallName(kind string, port int) string {
	if p.opts.Network != DefaultNetwork {
		return "ferry-" + p.opts.Network + "-" + kind + "-" + strconv.Itoa(port)
	}
	return "ferry-" + kind + "-" + strconv.Itoa(port)
}

// ensureFirewall makes port's rules what they should be. vmAddr is the address the proxy
// reaches a replica at, or "" before a launch: then, with no sources configured, only the
// deny rule is made (the controller's address is not known yet).
func (p *Provider) ensureFirewall(ctx context.Context, port int, vmAddr string) error {
	if p.opts.SkipFirewall {
		return nil
	}
	p.fwMu.Lock()
	defer p.fwMu.Unlock()
	if !p.configured() && vmAddr == "" {
		return p.ensureDeny(ctx, port)
	}
	var src string
	if !p.configured() {
		prefix, err := p.routeSource(vmAddr)
		if err != nil {
			p.log.Error("the controller's address is unknown, so it is not admitted to the service port: set gcp.proxy_cidrs or gcp.proxy_tags in config.yaml",
				zap.Int("port", port), zap.Error(err))
		} else {
			src = prefix.String()
		}
	}
	key := strconv.Itoa(port) + "/" + src
	if p.fw.settled[port] && (src == "" || p.fw.admitted[key]) {
		return nil
	}
	// Allow first: replicas never lose their proxies while the deny rule goes up.
	if err := p.ensureAllow(ctx, port, src); err != nil {
		return err
	}
	if err := p.ensureDeny(ctx, port); err != nil {
		return err
	}
	p.fw.settled[port] = true
	if src != "" {
		p.fw.admitted[key] = true
	}
	return nil
}

// getFirewall returns the named rule, nil when there is none.
func (p *Provider) getFirewall(ctx context.Context, name string) (*computepb.Firewall, error) {
	fw, err := p.firewalls.Get(ctx, &computepb.GetFirewallRequest{Project: p.opts.Project, Firewall: name})
	if err != nil {
		if err = classify(err, "get firewall "+name); errors.Is(err, launcher.ErrNotFound) {
			return nil, nil
		}
		return nil, err
	}
	return fw, nil
}

// ensureAllow creates or updates the allow rule for port, with src (the controller's route
// source, or "") among its sources when none are configured.
func (p *Provider) ensureAllow(ctx context.Context, port int, src string) error {
	name := p.firewallName("allow", port)
	cur, err := p.getFirewall(ctx, name)
	if err != nil {
		return err
	}
	want := p.allowRule(name, port, cur, src)
	log := p.log.With(zap.String("firewall", name), zap.Int("port", port))
	switch {
	case len(want.GetSourceRanges())+len(want.GetSourceTags()) == 0:
		if cur == nil {
			return nil
		}
		// Nothing to admit, and an ingress rule without sources would admit the internet.
		op, err := p.firewalls.Delete(ctx, &computepb.DeleteFirewallRequest{Project: p.opts.Project, Firewall: name})
		if err != nil {
			return classify(err, "delete firewall "+name)
		}
		if err := p.waitGlobalOp(ctx, op.Proto()); err != nil {
			return fmt.Errorf("gcp: delete firewall %s: %w", name, err)
		}
		log.Warn("deleted the service port's old allow rule; nothing is admitted until a source is known", zap.Strings("source_ranges", cur.GetSourceRanges()))
	case cur == nil:
		op, err := p.firewalls.Insert(ctx, &computepb.InsertFirewallRequest{Project: p.opts.Project, FirewallResource: want})
		if err != nil && !isConflict(err) {
			return classify(err, "insert firewall "+name)
		}
		if err == nil {
			if err := p.waitGlobalOp(ctx, op.Proto()); err != nil {
				return fmt.Errorf("gcp: insert firewall %s: %w", name, err)
			}
			log.Info("created firewall rule", zap.Strings("source_ranges", want.GetSourceRanges()), zap.Strings("source_tags", want.GetSourceTags()))
		}
	case !sameAllow(cur, want):
		want.Network = cur.Network
		op, err := p.firewalls.Update(ctx, &computepb.UpdateFirewallRequest{Project: p.opts.Project, Firewall: name, FirewallResource: want})
		if err != nil {
			return classify(err, "update firewall "+name)
		}
		if err := p.waitGlobalOp(ctx, op.Proto()); err != nil {
			return fmt.Errorf("gcp: update firewall %s: %w", name, err)
		}
		fields := []zap.Field{zap.Strings("old_source_ranges", cur.GetSourceRanges()), zap.Strings("old_source_tags", cur.GetSourceTags()),
			zap.Strings("source_ranges", want.GetSourceRanges()), zap.Strings("source_tags", want.GetSourceTags())}
		if cur.GetDescription() == descLegacy {
			log.Warn("narrowed the service port's allow rule from what Ferry opened before to the proxies only", fields...)
		} else {
			log.Info("updated the service port's allow rule", fields...)
		}
	}
	return nil
}

// allowRule is the allow rule port should have, given the current one (nil when none).
func (p *Provider) allowRule(name string, port int, cur *computepb.Firewall, src string) *computepb.Firewall {
	fw := &computepb.Firewall{
		Name:       proto.String(name),
		Network:    proto.String("global/networks/" + p.opts.Network),
		Direction:  proto.String("INGRESS"),
		Priority:   proto.Int32(allowPriority),
		Allowed:    []*computepb.Allowed{{IPProtocol: proto.String("tcp"), Ports: []string{strconv.Itoa(port)}}},
		TargetTags: []string{portTag(port)},
	}
	if p.configured() {
		fw.Description = proto.String(descConfigured)
		fw.SourceRanges = slices.Clone(p.ingressCIDRs)
		fw.SourceTags = slices.Clone(p.opts.IngressTags)
		return fw
	}
	fw.Description = proto.String(descController)
	var ranges []string
	if cur.GetDescription() == descController {
		ranges = slices.Clone(cur.GetSourceRanges())
	}
	if src != "" && !slices.Contains(ranges, src) {
		ranges = append(ranges, src)
	}
	slices.Sort(ranges)
	fw.SourceRanges = ranges
	return fw
}

// sameAllow reports whether the current rule already is want, as far as Ferry sets it.
func sameAllow(cur, want *computepb.Firewall) bool {
	sorted := func(s []string) []string { return slices.Sorted(slices.Values(s)) }
	return cur.GetDescription() == want.GetDescription() && cur.GetPriority() == want.GetPriority() &&
		slices.Equal(sorted(cur.GetSourceRanges()), sorted(want.GetSourceRanges())) &&
		slices.Equal(sorted(cur.GetSourceTags()), sorted(want.GetSourceTags())) &&
		slices.Equal(cur.GetTargetTags(), want.GetTargetTags())
}

// ensureDeny creates port's deny rule unless it exists.
func (p *Provider) ensureDeny(ctx context.Context, port int) error {
	if p.fw.denied[port] {
		return nil
	}
	name := p.firewallName("deny", port)
	cur, err := p.getFirewall(ctx, name)
	if err != nil {
		return err
	}
	if cur == nil {
		op, err := p.firewalls.Insert(ctx, &computepb.InsertFirewallRequest{Project: p.opts.Project, FirewallResource: &computepb.Firewall{
			Name:         proto.String(name),
			Description:  proto.String(descDeny),
			Network:      proto.String("global/networks/" + p.opts.Network),
			Direction:    proto.String("INGRESS"),
			Priority:     proto.Int32(denyPriority),
			Denied:       []*computepb.Denied{{IPProtocol: proto.String("tcp"), Ports: []string{strconv.Itoa(port)}}},
			SourceRanges: []string{"0.0.0.0/0"},
			TargetTags:   []string{portTag(port)},
		}})
		switch {
		case err != nil && !isConflict(err):
			return classify(err, "insert firewall "+name)
		case err == nil:
			if err := p.waitGlobalOp(ctx, op.Proto()); err != nil {
				return fmt.Errorf("gcp: insert firewall %s: %w", name, err)
			}
			p.log.Info("created firewall rule closing the service port to all but the proxies", zap.String("firewall", name), zap.Int("port", port))
		}
	}
	p.fw.denied[port] = true
	return nil
}

// adoptFirewall runs ensureFirewall for the ports of VMs an earlier controller launched, once
// per port in this process (launcher.IngressAdoption).
func (p *Provider) adoptFirewall(ctx context.Context, insts []launcher.Instance) {
	p.adoption.Adopt(insts, func(_ launcher.Instance, port int) (string, bool) {
		return strconv.Itoa(port), true
	}, func(_ launcher.Instance, host string, port int) error {
		return p.ensureFirewall(ctx, port, host)
	}, func(_ launcher.Instance, port int, err error) {
		p.log.Warn("could not set the service port's firewall rules for adopted VMs; retrying later", zap.Int("port", port), zap.Error(err))
	})
}
