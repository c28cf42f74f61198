package fakeec2

import (
	"encoding/base64"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// EC2 instance state codes.
var stateCodes = map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}

type instance struct {
	id, reservationID, region string
	imageID, instanceType     string
	zone                      zone
	placementGroup            string
	securityGroups            []xmlGroup
	spot                      bool
	request                   *spotRequest // nil for on-demand
	privateIP                 string
	tags                      map[string]string
	launchTime                time.Time
	state                     string
	endedAt                   time.Time
	reason                    *xmlStateReason
	transition                string
	metadata                  MetadataOptions
	root                      RootVolume
	vm                        *vm
	// reservation is the Capacity Reservation (an ODCR or a capacity block) the instance
	// runs in, "" for none; block is set for a capacity block (instance lifecycle
	// capacity-block).
	reservation string
	block       bool
	// profile is the IAM instance profile RunInstances gave (IamInstanceProfile.Name), ""
	// for none: the metadata service serves its role's credentials (imds.go).
	profile string
}

// MetadataOptions are an instance's instance-metadata-service settings, as RunInstances'
// MetadataOptions set them.
type MetadataOptions struct {
	// HTTPTokens is "required" (IMDSv2 only: every read needs a session token from a PUT) or
	// "optional" (IMDSv1's plain GETs answer too).
	HTTPTokens string
	// HopLimit is the PUT response's IP TTL: 1 keeps the token from leaving the instance (a
	// container behind a bridge, one hop further, gets none).
	HopLimit int
	// HTTPEndpoint is "enabled" or "disabled".
	HTTPEndpoint string
	// InstanceMetadataTags is "enabled" (the metadata service serves the instance's tags
	// under meta-data/tags/instance) or "disabled", EC2's default.
	InstanceMetadataTags string
}

// metadataOptions reads RunInstances' MetadataOptions.*, validated as EC2 does. Absent
// fields get the account's defaults, else what EC2 gives an image that does not declare
// IMDSv2 support: optional tokens, hop limit 1, endpoint enabled.
func metadataOptions(p params, defaults MetadataOptions) (MetadataOptions, *APIError) {
	m := MetadataOptions{HTTPTokens: "optional", HopLimit: 1, HTTPEndpoint: "enabled", InstanceMetadataTags: "disabled"}
	if defaults.HTTPTokens != "" {
		m.HTTPTokens = defaults.HTTPTokens
	}
	if defaults.HopLimit != 0 {
		m.HopLimit = defaults.HopLimit
	}
	if defaults.HTTPEndpoint != "" {
		m.HTTPEndpoint = defaults.HTTPEndpoint
	}
	if defaults.InstanceMetadataTags != "" {
		m.InstanceMetadataTags = defaults.InstanceMetadataTags
	}
	if v := p.get("MetadataOptions.HttpTokens"); v != "" {
		if v != "optional" && v != "required" {
			return m, apiErr("InvalidParameterValue", "Value (%s) for parameter MetadataOptions.HttpTokens is invalid. Valid values: optional, required", v)
		}
		m.HTTPTokens = v
	}
	if v := p.get("MetadataOptions.HttpPutResponseHopLimit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 64 {
			return m, apiErr("InvalidParameterValue", "Value (%s) for parameter MetadataOptions.HttpPutResponseHopLimit is invalid. It must be an integer from 1 to 64", v)
		}
		m.HopLimit = n
	}
	if v := p.get("MetadataOptions.HttpEndpoint"); v != "" {
		if v != "enabled" && v != "disabled" {
			return m, apiErr("InvalidParameterValue", "Value (%s) for parameter MetadataOptions.HttpEndpoint is invalid. Valid values: enabled, disabled", v)
		}
		m.HTTPEndpoint = v
	}
	if v := p.get("MetadataOptions.InstanceMetadataTags"); v != "" {
		if v != "enabled" && v != "disabled" {
			return m, apiErr("InvalidParameterValue", "Value (%s) for parameter MetadataOptions.InstanceMetadataTags is invalid. Valid values: enabled, disabled", v)
		}
		m.InstanceMetadataTags = v
	}
	return m, nil
}

// Instance is a snapshot of one fake instance, for tests.
type Instance struct {
	ID, Region, ZoneID, ZoneName, InstanceType, ImageID, State, PrivateIP, PlacementGroup string
	Spot                                                                                  bool
	Tags                                                                                  map[string]string
	// StateReason is the state reason code ("" while pending or running).
	StateReason string
	// SpotRequestID and SpotStatus are a spot instance's request and its status code.
	SpotRequestID, SpotStatus string
	// LogPath is the VM's output.
	LogPath string
	// Metadata is what RunInstances asked of the instance metadata service.
	Metadata MetadataOptions
	// Root is the boot volume RunInstances asked for.
	Root RootVolume
	// Reservation is the Capacity Reservation it runs in ("" for none); CapacityBlock is set
	// when that is a capacity block.
	Reservation   string
	CapacityBlock bool
	// InstanceProfile is the IAM instance profile it runs with ("" for none).
	InstanceProfile string
}

func (in *instance) live() bool { return in.state == "pending" || in.state == "running" }

// advance moves instances through time-driven transitions: boot, the reclaim a spot
// interruption warning scheduled, shutdown. Callers hold s.mu.
func (s *Server) advance() {
	now := s.opts.Now()
	s.endBlocks(now)
	for _, in := range s.instances {
		if in.state == "pending" && !now.Before(in.launchTime.Add(s.opts.BootDelay)) {
			in.state = "running"
		}
		if r := in.request; r != nil && in.live() && !r.reclaimAt.IsZero() && !now.Before(r.reclaimAt) {
			s.reclaim(in, r.reclaimAt)
		}
		if in.state == "shutting-down" && !now.Before(in.endedAt.Add(s.opts.ShutdownDelay)) {
			in.state = "terminated"
		}
	}
}

// Instances returns every instance the server has made, in launch order.
func (s *Server) Instances() []Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance()
	out := make([]Instance, 0, len(s.order))
	for _, id := range s.order {
		in := s.instances[id]
		snap := Instance{
			ID: in.id, Region: in.region, ZoneID: in.zone.id, ZoneName: in.zone.name, InstanceType: in.instanceType,
			ImageID: in.imageID, State: in.state, PrivateIP: in.privateIP, PlacementGroup: in.placementGroup, Spot: in.spot,
			Tags: maps.Clone(in.tags), LogPath: s.logPath(in.id), Metadata: in.metadata, Root: in.root,
			Reservation: in.reservation, CapacityBlock: in.block, InstanceProfile: in.profile,
		}
		if in.reason != nil {
			snap.StateReason = in.reason.Code
		}
		if in.request != nil {
			snap.SpotRequestID, snap.SpotStatus = in.request.id, in.request.code
		}
		out = append(out, snap)
	}
	return out
}

// end starts an instance's shutdown at at, and closes its spot request. Callers hold s.mu.
func (s *Server) end(in *instance, at time.Time, code, message, transition string) {
	in.state = "shutting-down"
	in.endedAt = at
	in.reason = &xmlStateReason{Code: code, Message: message}
	in.transition = fmt.Sprintf("%s (%s)", transition, at.UTC().Format("2006-01-02 15:04:05 MST"))
	if r := in.request; r != nil {
		switch {
		case code == ReasonSpotTermination && r.code != StatusNoCapacity:
			r.setStatus(StatusNoCapacity, at)
		case code == ReasonUserShutdown && r.state == "active":
			r.setStatus(statusTerminatedByUser, at)
		}
	}
	if in.vm != nil {
		in.vm.kill(s.opts.KillGrace)
	}
}

func (s *Server) logPath(id string) string { return s.opts.LogDir + "/" + id + ".log" }

func (s *Server) vcpusOf(instanceType string) int {
	if n := s.vcpus[instanceType]; n > 0 {
		return n
	}
	return 2
}

func (s *Server) allocIP() (string, *APIError) {
	for s.nextIP < 256*256-2 {
		s.nextIP++
		b, c := s.nextIP/256, s.nextIP%256
		if c == 0 || c == 255 {
			continue
		}
		return fmt.Sprintf("%s.%d.%d", s.opts.Subnet, b, c), nil
	}
	return "", apiErr("InsufficientFreeAddressesInSubnet", "No free addresses left in %s.0.0/16", s.opts.Subnet)
}

func (s *Server) runInstances(m meta, reg *region, p params) (any, *APIError) {
	if s.closed {
		return nil, apiErr("Unavailable", "%v", errClosed)
	}
	imageID, itype := p.get("ImageId"), p.get("InstanceType")
	if imageID == "" {
		return nil, apiErr("MissingParameter", "The request must contain the parameter ImageId")
	}
	if !strings.HasPrefix(imageID, "ami-") {
		return nil, apiErr("InvalidAMIID.Malformed", "Invalid id: %q (expecting \"ami-...\")", imageID)
	}
	if itype == "" {
		itype = "m1.small"
	}
	minCount, err1 := strconv.Atoi(p.get("MinCount"))
	maxCount, err2 := strconv.Atoi(p.get("MaxCount"))
	if err1 != nil || err2 != nil || minCount < 1 || maxCount < minCount {
		return nil, apiErr("InvalidParameterValue", "MinCount and MaxCount must be positive, with MinCount <= MaxCount")
	}
	if token := p.get("ClientToken"); token != "" {
		if rid, ok := s.tokens[token]; ok {
			return s.reservationResponse(m, rid), nil
		}
	}
	// Zone: AvailabilityZone (name) or AvailabilityZoneId; default the region's first.
	z := reg.zones[0]
	if name := p.get("Placement.AvailabilityZone"); name != "" {
		i := slices.IndexFunc(reg.zones, func(z zone) bool { return z.name == name })
		if i < 0 {
			return nil, apiErr("InvalidParameterValue", "Invalid availability zone: [%s]", name)
		}
		z = reg.zones[i]
	} else if id := p.get("Placement.AvailabilityZoneId"); id != "" {
		i := slices.IndexFunc(reg.zones, func(z zone) bool { return z.id == id })
		if i < 0 {
			return nil, apiErr("InvalidParameterValue", "Invalid availability zone ID: [%s]", id)
		}
		z = reg.zones[i]
	}
	pg := p.get("Placement.GroupName")
	if pg != "" {
		g := reg.placement[pg]
		if g == nil {
			return nil, apiErr("InvalidPlacementGroup.Unknown", "The Placement Group '%s' is unknown.", pg)
		}
		if g.strategy == "cluster" {
			for _, in := range s.instances {
				if in.live() && in.placementGroup == pg && in.zone.id != z.id {
					return nil, apiErr("InvalidParameterValue", "Placement group %s is in %s; cluster placement groups span one availability zone", pg, in.zone.name)
				}
			}
		}
	}
	var groups []xmlGroup
	for _, id := range p.list("SecurityGroupId") {
		g := findGroup(reg, func(g *securityGroup) bool { return g.id == id })
		if g == nil {
			return nil, apiErr("InvalidGroup.NotFound", "The security group '%s' does not exist", id)
		}
		groups = append(groups, xmlGroup{GroupID: g.id, GroupName: g.name})
	}
	for _, name := range p.list("SecurityGroup") {
		g := reg.groups[name]
		if g == nil {
			return nil, apiErr("InvalidGroup.NotFound", "The security group '%s' does not exist in default VPC", name)
		}
		groups = append(groups, xmlGroup{GroupID: g.id, GroupName: g.name})
	}
	spot := false
	mt := p.get("InstanceMarketOptions.MarketType")
	switch mt {
	case "", ReservationTypeCapacityBlock:
	case "spot":
		spot = true
		if aerr := checkSpotOptions(p); aerr != nil {
			return nil, aerr
		}
	default:
		return nil, apiErr("InvalidParameterValue", "Invalid market type %q", mt)
	}
	zoneGiven := p.get("Placement.AvailabilityZone") != "" || p.get("Placement.AvailabilityZoneId") != ""
	res, aerr := s.launchReservation(reg, p, &z, zoneGiven, itype, mt, minCount)
	if aerr != nil {
		return nil, aerr
	}
	metadata, aerr := metadataOptions(p, s.opts.MetadataDefaults)
	if aerr != nil {
		return nil, aerr
	}
	root, aerr := rootVolume(p)
	if aerr != nil {
		return nil, aerr
	}
	profile := p.get("IamInstanceProfile.Name")
	if arn := p.get("IamInstanceProfile.Arn"); profile == "" && arn != "" {
		profile = arn[strings.LastIndex(arn, "/")+1:]
	}
	userData := p.get("UserData")
	script, err := base64.StdEncoding.DecodeString(userData)
	if err != nil {
		return nil, apiErr("InvalidParameterValue", "Invalid BASE64 encoding of user data.")
	}
	if len(script) > 16*1024 {
		return nil, apiErr("InvalidParameterValue", "User data is limited to 16384 bytes")
	}
	tags, aerr := p.tags("instance")
	if aerr != nil {
		return nil, aerr
	}
	requestTags, aerr := p.tags("spot-instances-request")
	if aerr != nil {
		return nil, aerr
	}
	if e := s.zoneErrors[z.id]; e != nil {
		return nil, e
	}
	// Capacity, quota and price checks count live instances.
	liveOfType, liveVCPUs, liveSpot, zoneSpot := 0, 0, 0, 0
	for _, in := range s.instances {
		if !in.live() {
			continue
		}
		if in.zone.id == z.id && in.instanceType == itype {
			liveOfType++
		}
		if in.zone.id == z.id && in.spot && in.request.reclaimAt.IsZero() {
			zoneSpot++
		}
		if in.region == reg.name {
			if in.spot {
				liveSpot++
			} else {
				liveVCPUs += s.vcpusOf(in.instanceType)
			}
		}
	}
	if spot {
		price, ok := s.spotPrices[z.id+"/"+itype]
		if maxPrice := p.get("InstanceMarketOptions.SpotOptions.MaxPrice"); ok && maxPrice != "" {
			if mp, err := strconv.ParseFloat(maxPrice, 64); err == nil && mp < price {
				return nil, apiErr("SpotMaxPriceTooLow", "Your Spot request price of %s is lower than the minimum required Spot request fulfillment price of %.4f.", maxPrice, price)
			}
		}
		if lim := s.opts.SpotInstanceLimit; lim > 0 && liveSpot+minCount > lim {
			return nil, apiErr("MaxSpotInstanceCountExceeded", "Max spot instance count exceeded")
		}
		if c, ok := s.spotCapacity[z.id]; ok && zoneSpot+minCount > c {
			return nil, apiErr("InsufficientInstanceCapacity", "We currently do not have sufficient %s capacity in the Availability Zone you requested (%s). Our system will be working on provisioning additional capacity.", itype, z.name)
		}
	} else if lim := s.opts.VCPULimit; res == nil && lim > 0 && liveVCPUs+minCount*s.vcpusOf(itype) > lim {
		return nil, apiErr("VcpuLimitExceeded", "You have requested more vCPU capacity than your current vCPU limit of %d allows for the instance bucket that the specified instance type belongs to. Please visit http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.", lim)
	}
	count := maxCount
	if res != nil {
		// Reserved capacity: the reservation's room, checked for minCount already.
		count = min(count, s.available(res, s.opts.Now()))
	} else if c, ok := s.capacity[z.id+"/"+itype]; ok || s.opts.DefaultCapacity > 0 {
		if !ok {
			c = s.opts.DefaultCapacity
		}
		free := max(c-liveOfType, 0)
		if free < minCount {
			return nil, apiErr("InsufficientInstanceCapacity", "We currently do not have sufficient %s capacity in the Availability Zone you requested (%s). Our system will be working on provisioning additional capacity.", itype, z.name)
		}
		count = min(count, free)
	}
	rid := newID("r-")
	now := s.opts.Now()
	for range count {
		ip, aerr := s.allocIP()
		if aerr != nil {
			return nil, aerr
		}
		in := &instance{
			id: newID("i-"), reservationID: rid, region: reg.name, imageID: imageID, instanceType: itype,
			zone: z, placementGroup: pg, securityGroups: groups, spot: spot, privateIP: ip,
			tags: maps.Clone(tags), launchTime: now, state: "pending", metadata: metadata, root: root,
			profile: profile,
		}
		if spot {
			in.request = newSpotRequest(now, p.get("InstanceMarketOptions.SpotOptions.MaxPrice"), requestTags)
		}
		if res != nil {
			in.reservation, in.block = res.ID, res.Type == ReservationTypeCapacityBlock
		}
		s.instances[in.id] = in
		s.order = append(s.order, in.id)
		v, err := s.boot(in, script)
		if err != nil {
			in.state, in.endedAt = "shutting-down", now
			in.reason = &xmlStateReason{Code: "Server.InternalError", Message: "Server.InternalError: " + err.Error()}
			if in.request != nil {
				in.request.setStatus(statusSystemError, now)
			}
			continue
		}
		in.vm = v
	}
	if token := p.get("ClientToken"); token != "" {
		s.tokens[token] = rid
	}
	return s.reservationResponse(m, rid), nil
}

func (s *Server) reservationResponse(m meta, rid string) *runInstancesResponse {
	out := &runInstancesResponse{meta: m}
	out.ReservationID, out.OwnerID = rid, ownerID
	for _, id := range s.order {
		if in := s.instances[id]; in.reservationID == rid {
			out.Instances = append(out.Instances, s.xmlInstance(in, len(out.Instances)))
		}
	}
	return out
}

func (s *Server) xmlInstance(in *instance, index int) xmlInstance {
	x := xmlInstance{
		InstanceID: in.id, ImageID: in.imageID, State: xmlState{Code: stateCodes[in.state], Name: in.state},
		Reason: in.transition, AmiLaunchIndex: index, InstanceType: in.instanceType, LaunchTime: timestamp(in.launchTime),
		Placement:   xmlPlacement{AvailabilityZone: in.zone.name, AvailabilityZoneID: in.zone.id, GroupName: in.placementGroup, Tenancy: "default"},
		GroupSet:    in.securityGroups,
		StateReason: in.reason, TagSet: tagSet(in.tags),
		MetadataOptions: xmlMetadataOptions{
			State: "applied", HTTPTokens: in.metadata.HTTPTokens, HopLimit: in.metadata.HopLimit, HTTPEndpoint: in.metadata.HTTPEndpoint,
			InstanceMetadataTags: in.metadata.InstanceMetadataTags,
		},
	}
	if in.request != nil {
		x.SpotInstanceRequestID = in.request.id
	}
	if in.state != "terminated" {
		x.PrivateIPAddress = in.privateIP
		x.PrivateDNSName = "ip-" + strings.ReplaceAll(in.privateIP, ".", "-") + ".ec2.internal"
	}
	if in.spot {
		x.InstanceLifecycle = "spot"
	}
	if in.block {
		x.InstanceLifecycle = ReservationTypeCapacityBlock
	}
	if in.reservation != "" {
		x.CapacityReservationID = in.reservation
		x.CapacityReservationSpecification = &xmlCapacityReservationSpecification{Target: &xmlCapacityReservationTarget{ID: in.reservation}}
	}
	return x
}

func (s *Server) describeInstances(m meta, reg *region, p params) (any, *APIError) {
	ids := p.list("InstanceId")
	for _, id := range ids {
		if !strings.HasPrefix(id, "i-") {
			return nil, apiErr("InvalidInstanceID.Malformed", "Invalid id: \"%s\"", id)
		}
		if in := s.instances[id]; in == nil || in.region != reg.name {
			return nil, apiErr("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
		}
	}
	filters := p.filters()
	for name := range filters {
		switch {
		case strings.HasPrefix(name, "tag:"), name == "tag-key", name == "instance-state-name", name == "instance-lifecycle",
			name == "instance-id", name == "placement-group-name", name == "availability-zone", name == "instance-type",
			name == "capacity-reservation-id":
		default:
			return nil, apiErr("InvalidParameterValue", "The filter '%s' is invalid", name)
		}
	}
	match := func(in *instance) bool {
		if len(ids) > 0 && !slices.Contains(ids, in.id) {
			return false
		}
		return matches(filters, func(name string) []string {
			switch name {
			case "instance-state-name":
				return []string{in.state}
			case "instance-lifecycle":
				switch {
				case in.spot:
					return []string{"spot"}
				case in.block:
					return []string{ReservationTypeCapacityBlock}
				}
				return nil
			case "capacity-reservation-id":
				return []string{in.reservation}
			case "instance-id":
				return []string{in.id}
			case "placement-group-name":
				return []string{in.placementGroup}
			case "availability-zone":
				return []string{in.zone.name}
			case "instance-type":
				return []string{in.instanceType}
			}
			return tagValues(name, in.tags)
		})
	}
	// One reservation per RunInstances call, with its matching instances.
	var rids []string
	byRes := map[string][]*instance{}
	for _, id := range s.order {
		in := s.instances[id]
		if in.region != reg.name || !match(in) {
			continue
		}
		if _, ok := byRes[in.reservationID]; !ok {
			rids = append(rids, in.reservationID)
		}
		byRes[in.reservationID] = append(byRes[in.reservationID], in)
	}
	start := 0
	if tok := p.get("NextToken"); tok != "" {
		n, err := strconv.Atoi(tok)
		if err != nil || n < 0 || n > len(rids) {
			return nil, apiErr("InvalidParameterValue", "Invalid NextToken")
		}
		start = n
	}
	end := len(rids)
	out := &describeInstancesResponse{meta: m}
	if mr := p.get("MaxResults"); mr != "" {
		n, err := strconv.Atoi(mr)
		if err != nil || n < 5 || n > 1000 {
			return nil, apiErr("InvalidParameterValue", "MaxResults must be between 5 and 1000")
		}
		if len(ids) > 0 {
			return nil, apiErr("InvalidParameterCombination", "The parameter instancesSet cannot be used with the parameter maxResults")
		}
		if start+n < end {
			end = start + n
			out.NextToken = strconv.Itoa(end)
		}
	}
	for _, rid := range rids[start:end] {
		res := xmlReservation{ReservationID: rid, OwnerID: ownerID}
		for i, in := range byRes[rid] {
			res.Instances = append(res.Instances, s.xmlInstance(in, i))
		}
		out.Reservations = append(out.Reservations, res)
	}
	return out, nil
}

func (s *Server) terminateInstances(m meta, reg *region, p params) (any, *APIError) {
	ids := p.list("InstanceId")
	if len(ids) == 0 {
		return nil, apiErr("MissingParameter", "The request must contain the parameter InstanceId")
	}
	for _, id := range ids {
		if !strings.HasPrefix(id, "i-") {
			return nil, apiErr("InvalidInstanceID.Malformed", "Invalid id: \"%s\"", id)
		}
		if in := s.instances[id]; in == nil || in.region != reg.name {
			return nil, apiErr("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
		}
	}
	out := &terminateInstancesResponse{meta: m}
	for _, id := range ids {
		in := s.instances[id]
		prev := xmlState{Code: stateCodes[in.state], Name: in.state}
		if in.live() {
			s.end(in, s.opts.Now(), ReasonUserShutdown, "Client.UserInitiatedShutdown: User initiated shutdown", "User initiated")
		}
		out.Instances = append(out.Instances, xmlStateChange{InstanceID: id, PreviousState: prev, CurrentState: xmlState{Code: stateCodes[in.state], Name: in.state}})
	}
	return out, nil
}
