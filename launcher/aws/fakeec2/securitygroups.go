package fakeec2

import (
	"net/netip"
	"slices"
	"strconv"
)

// ingressRule is one source admitted to a port range, as EC2 keeps a security group's rules:
// one per protocol, port range and source (a CIDR block or another security group), each with
// its own description. DescribeSecurityGroups groups them back into IpPermissions.
type ingressRule struct {
	protocol    string
	from, to    int
	cidr        string
	groupID     string
	description string
}

// sameRule is EC2's identity of a rule: the description does not count.
func (r ingressRule) sameRule(o ingressRule) bool {
	return r.protocol == o.protocol && r.from == o.from && r.to == o.to && r.cidr == o.cidr && r.groupID == o.groupID
}

// IngressRule is one ingress rule of a security group, for tests.
type IngressRule struct {
	Protocol         string
	FromPort, ToPort int
	// CIDR is the source address range, or GroupID the source security group.
	CIDR, GroupID string
	Description   string
}

func findGroup(reg *region, ok func(*securityGroup) bool) *securityGroup {
	for _, g := range reg.groups {
		if ok(g) {
			return g
		}
	}
	return nil
}

func (s *Server) createSecurityGroup(m meta, reg *region, p params) (any, *APIError) {
	name, desc := p.get("GroupName"), p.get("GroupDescription")
	if name == "" {
		return nil, apiErr("MissingParameter", "The request must contain the parameter GroupName")
	}
	if desc == "" {
		return nil, apiErr("MissingParameter", "The request must contain the parameter GroupDescription")
	}
	if reg.groups[name] != nil {
		return nil, apiErr("InvalidGroup.Duplicate", "The security group '%s' already exists for VPC 'vpc-fake'", name)
	}
	tags, aerr := p.tags("security-group")
	if aerr != nil {
		return nil, aerr
	}
	g := &securityGroup{id: newID("sg-"), name: name, description: desc, tags: tags}
	reg.groups[name] = g
	return &createSecurityGroupResponse{meta: m, Return: true, GroupID: g.id}, nil
}

func (s *Server) describeSecurityGroups(m meta, reg *region, p params) (any, *APIError) {
	names, ids := p.list("GroupName"), p.list("GroupId")
	filters := p.filters()
	for _, n := range names {
		if reg.groups[n] == nil {
			return nil, apiErr("InvalidGroup.NotFound", "The security group '%s' does not exist in default VPC 'vpc-fake'", n)
		}
	}
	for _, id := range ids {
		if findGroup(reg, func(g *securityGroup) bool { return g.id == id }) == nil {
			return nil, apiErr("InvalidGroup.NotFound", "The security group '%s' does not exist", id)
		}
	}
	for name := range filters {
		if name != "group-name" && name != "group-id" {
			return nil, apiErr("InvalidParameterValue", "The filter '%s' is invalid", name)
		}
	}
	out := &describeSecurityGroupsResponse{meta: m}
	keys := make([]string, 0, len(reg.groups))
	for k := range reg.groups {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		g := reg.groups[k]
		if len(names) > 0 && !slices.Contains(names, g.name) || len(ids) > 0 && !slices.Contains(ids, g.id) {
			continue
		}
		if v, ok := filters["group-name"]; ok && !slices.Contains(v, g.name) {
			continue
		}
		if v, ok := filters["group-id"]; ok && !slices.Contains(v, g.id) {
			continue
		}
		out.Groups = append(out.Groups, xmlSecurityGroup{
			OwnerID: ownerID, GroupID: g.id, GroupName: g.name, GroupDescription: g.description, VpcID: "vpc-fake",
			IPPermissions: permissions(g.rules), TagSet: tagSet(g.tags),
		})
	}
	return out, nil
}

// permissions groups rules into IpPermissions, one per protocol and port range, in the order
// the ranges were first opened.
func permissions(rules []ingressRule) []xmlIPPermission {
	var out []xmlIPPermission
	for _, r := range rules {
		i := slices.IndexFunc(out, func(p xmlIPPermission) bool {
			return p.IPProtocol == r.protocol && p.FromPort == r.from && p.ToPort == r.to
		})
		if i < 0 {
			out = append(out, xmlIPPermission{IPProtocol: r.protocol, FromPort: r.from, ToPort: r.to})
			i = len(out) - 1
		}
		if r.cidr != "" {
			out[i].IPRanges = append(out[i].IPRanges, xmlIPRange{CidrIP: r.cidr, Description: r.description})
		} else {
			out[i].Groups = append(out[i].Groups, xmlUserIDGroupPair{GroupID: r.groupID, UserID: ownerID, Description: r.description})
		}
	}
	return out
}

// requestGroup is the group an ingress request names, by GroupId or GroupName.
func requestGroup(reg *region, p params) (*securityGroup, *APIError) {
	var g *securityGroup
	if id := p.get("GroupId"); id != "" {
		g = findGroup(reg, func(g *securityGroup) bool { return g.id == id })
	} else {
		g = reg.groups[p.get("GroupName")]
	}
	if g == nil {
		return nil, apiErr("InvalidGroup.NotFound", "The security group does not exist")
	}
	return g, nil
}

// ingressRules reads IpPermissions.N.{IpProtocol,FromPort,ToPort}, each with its sources in
// IpRanges.M.{CidrIp,Description} and Groups.M.{GroupId,Description} (the SDK's
// UserIdGroupPairs), one rule per source. A source group must exist in the region.
func ingressRules(reg *region, p params) ([]ingressRule, *APIError) {
	var rules []ingressRule
	for i := 1; i <= p.indices("IpPermissions"); i++ {
		pre := "IpPermissions." + strconv.Itoa(i)
		proto := p.get(pre + ".IpProtocol")
		from, err1 := strconv.Atoi(p.get(pre + ".FromPort"))
		to, err2 := strconv.Atoi(p.get(pre + ".ToPort"))
		if proto == "-1" {
			// All traffic: EC2 ignores the ports.
			from, to, err1, err2 = -1, -1, nil, nil
		}
		if err1 != nil || err2 != nil || proto == "" {
			return nil, apiErr("InvalidParameterValue", "Invalid IpPermissions: protocol and ports are required")
		}
		if p.indices(pre+".Ipv6Ranges") > 0 || p.indices(pre+".PrefixListIds") > 0 {
			return nil, apiErr("InvalidParameterValue", "fakeec2 models IpRanges and Groups sources only")
		}
		base := ingressRule{protocol: proto, from: from, to: to}
		n := len(rules)
		for j := 1; j <= p.indices(pre+".IpRanges"); j++ {
			rp := pre + ".IpRanges." + strconv.Itoa(j)
			r := base
			r.cidr, r.description = p.get(rp+".CidrIp"), p.get(rp+".Description")
			if _, err := netip.ParsePrefix(r.cidr); err != nil {
				return nil, apiErr("InvalidParameterValue", "CIDR block %s is malformed", r.cidr)
			}
			rules = append(rules, r)
		}
		for j := 1; j <= p.indices(pre+".Groups"); j++ {
			gp := pre + ".Groups." + strconv.Itoa(j)
			r := base
			r.groupID, r.description = p.get(gp+".GroupId"), p.get(gp+".Description")
			if findGroup(reg, func(g *securityGroup) bool { return g.id == r.groupID }) == nil {
				return nil, apiErr("InvalidGroup.NotFound", "The security group '%s' does not exist", r.groupID)
			}
			rules = append(rules, r)
		}
		if len(rules) == n {
			return nil, apiErr("MissingParameter", "IpPermissions.%d needs a source: IpRanges or Groups", i)
		}
	}
	if len(rules) == 0 {
		return nil, apiErr("MissingParameter", "The request must contain the parameter IpPermissions")
	}
	return rules, nil
}

// authorizeSecurityGroupIngress adds the request's rules, or none of them when one exists
// already (InvalidPermission.Duplicate), as EC2 does.
func (s *Server) authorizeSecurityGroupIngress(m meta, reg *region, p params) (any, *APIError) {
	g, aerr := requestGroup(reg, p)
	if aerr != nil {
		return nil, aerr
	}
	rules, aerr := ingressRules(reg, p)
	if aerr != nil {
		return nil, aerr
	}
	for _, r := range rules {
		if slices.ContainsFunc(g.rules, r.sameRule) {
			return nil, apiErr("InvalidPermission.Duplicate", "the specified rule \"peer: %s%s, %s, from port: %d, to port: %d, ALLOW\" already exists", r.cidr, r.groupID, r.protocol, r.from, r.to)
		}
	}
	g.rules = append(g.rules, rules...)
	return &returnResponse{XMLName: xmlName("AuthorizeSecurityGroupIngressResponse"), meta: m, Return: true}, nil
}

// revokeSecurityGroupIngress removes the request's rules (descriptions do not count), or none
// of them when one does not exist (InvalidPermission.NotFound).
func (s *Server) revokeSecurityGroupIngress(m meta, reg *region, p params) (any, *APIError) {
	g, aerr := requestGroup(reg, p)
	if aerr != nil {
		return nil, aerr
	}
	rules, aerr := ingressRules(reg, p)
	if aerr != nil {
		return nil, aerr
	}
	for _, r := range rules {
		if !slices.ContainsFunc(g.rules, r.sameRule) {
			return nil, apiErr("InvalidPermission.NotFound", "The specified rule does not exist in this security group.")
		}
	}
	g.rules = slices.DeleteFunc(g.rules, func(have ingressRule) bool { return slices.ContainsFunc(rules, have.sameRule) })
	return &returnResponse{XMLName: xmlName("RevokeSecurityGroupIngressResponse"), meta: m, Return: true}, nil
}

// SecurityGroupRules returns the ports region's group name admits anyone to, each once, in
// the order they were first opened, for tests.
func (s *Server) SecurityGroupRules(regionName, name string) []int {
	var ports []int
	for _, r := range s.IngressRules(regionName, name) {
		if !slices.Contains(ports, r.FromPort) {
			ports = append(ports, r.FromPort)
		}
	}
	return ports
}

// IngressRules returns the ingress rules of region's group name, one per source, for tests.
func (s *Server) IngressRules(regionName, name string) []IngressRule {
	s.mu.Lock()
	defer s.mu.Unlock()
	reg := s.regions[regionName]
	if reg == nil || reg.groups[name] == nil {
		return nil
	}
	var out []IngressRule
	for _, r := range reg.groups[name].rules {
		out = append(out, IngressRule{Protocol: r.protocol, FromPort: r.from, ToPort: r.to, CIDR: r.cidr, GroupID: r.groupID, Description: r.description})
	}
	return out
}
