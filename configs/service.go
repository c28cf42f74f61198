package configs

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

var (
	serviceKeys     = keysOf[Service]()
	healthCheckKeys = keysOf[HealthCheck]()
	updateKeys      = keysOf[Update]()
	updateModes     = []string{UpdateRolling, UpdateBlueGreen}
	probeKeys       = keysOf[Probe]()
	// policyKeys lists ReplicaPolicy's keys in the order messages have always shown them
	// (SkyServe's fields, then Ferry's), which puts autoscaler elsewhere than ResolvedYAML
	// writes it; TestExplicitKeysCoverFields keeps the two in step.
	policyKeys = []string{"min_replicas", "max_replicas", "target_qps_per_replica", "num_overprovision",
		"upscale_delay_seconds", "downscale_delay_seconds", "base_ondemand_fallback_replicas",
		"dynamic_ondemand_fallback", "spot_placer", "autoscaler", "target_inflight_per_replica",
		"stable_window_seconds", "panic_window_seconds", "panic_threshold", "max_scale_up_rate",
		"max_scale_down_rate", "scale_to_zero_grace_seconds", "target_waiting_per_replica", "target_kv_cache_usage"}
	tlsKeys           = keysOf[TLS]()
	lbPolicies        = []string{PolicyRoundRobin, PolicyLeastLoad, PolicyInstanceAwareLeastLoad, PolicyPowerOfTwo, PolicySessionAffinity, PolicyPrefixAffinity, PolicyLLMAware, PolicyLeastTTFT}
	spotPlacers       = []string{SpotPlacerDynamicFallback}
	spotOnlyMsgSuffix = "spot-only field without use_spot: set resources.use_spot: true, or remove this field"
)

// policyField is the path of the service's replica_policy section, which several readers share.
const policyField = "service.replica_policy"

// policyField is the path of the replica_policy being read: the service's, or a pool's.
func (c *checker) policyField() string {
	if c.section == "" {
		return policyField
	}
	return joinField(c.section, "replica_policy")
}

// SpotPlacerDynamicFallback is SkyServe's SpotHedge placer, the only spot_placer there is.
const SpotPlacerDynamicFallback = "dynamic_fallback"

// SkyServe's defaults, applied when the YAML leaves a field out.
const (
	DefaultProbePath             = "/"
	DefaultInitialDelaySeconds   = 1200
	DefaultProbeTimeoutSeconds   = 15
	DefaultUpscaleDelaySeconds   = 300
	DefaultDownscaleDelaySeconds = 1200
)

// jsonIntRE is an integer as JSON writes it.
var jsonIntRE = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)

// maxPostData bounds the probe body: it is sent every few seconds to every replica.
const maxPostData = 64 << 10

// replicaNodes checks num_nodes under service:. A replica of several nodes is a gang (SkyServe's
// multi-node replicas: one model split over machines by tensor or pipeline parallelism),
// launched all or nothing in one location, its head (rank 0) serving; a gang on AWS is at most
// awsMaxGang nodes (checkInfraLimits checks jobs').
func (c *checker) replicaNodes(t *Task, f map[string]entry) {
	if t.NumNodes <= awsMaxGang {
		return
	}
	for _, cand := range t.Resources.Candidates() {
		if cand.Cloud != "aws" {
			return
		}
	}
	c.errorf(nodeOf(f, "num_nodes"), "num_nodes", "a replica's gang on AWS is at most %d nodes (got %d): lower num_nodes or let it run on Kubernetes or GCP", awsMaxGang, t.NumNodes)
}

// service reads the `service:` section; res is the resolved resources, needed for use_spot,
// ports and accelerator names.
func (c *checker) service(e entry, res Resources, envs, secrets map[string]string) *Service {
	const field = "service"
	s := &Service{
		ReadinessProbe:      Probe{Path: DefaultProbePath, InitialDelaySeconds: DefaultInitialDelaySeconds, TimeoutSeconds: DefaultProbeTimeoutSeconds},
		LoadBalancingPolicy: PolicyLeastTTFT,
		Update:              DefaultUpdate(),
	}
	f, ok := c.fields(e.value, field, serviceKeys)
	if !ok {
		return s
	}
	if p, ok := f["readiness_probe"]; ok {
		s.ReadinessProbe = c.probe(p.value, joinField(field, "readiness_probe"))
	}
	if lb, ok := f["load_balancing_policy"]; ok {
		if v, ok := c.oneOf(lb.value, joinField(field, "load_balancing_policy"), lbPolicies, "policy", "policies"); ok {
			s.LoadBalancingPolicy = v
		}
	}
	qpsNode := c.replicas(f, s, res.UseSpot)
	c.checkPerAcceleratorQPS(f, s, qpsNode, res)
	s.Port = c.servicePort(e, f, res)

	if t, ok := f["tls"]; ok {
		s.TLS = c.tls(t.value, joinField(field, "tls"))
	}
	if a, ok := f["auth"]; ok {
		s.Auth = c.auth(a.value, joinField(field, "auth"), envs, secrets)
	}
	if l, ok := f["limits"]; ok {
		s.Limits = c.limits(l.value, joinField(field, "limits"))
	}
	if u, ok := f["update"]; ok {
		s.Update = c.update(u.value, joinField(field, "update"))
	}
	if h, ok := f["health_check"]; ok {
		s.HealthCheck = c.healthCheck(h.value, joinField(field, "health_check"))
	}
	if a, ok := f["adapters"]; ok {
		s.Adapters = c.adapters(a.value, joinField(field, "adapters"))
	}
	if p, ok := f["pools"]; ok {
		s.Pools = c.pools(p.value, joinField(field, "pools"), s, res.UseSpot) // pools.go
	}
	return s
}

// replicas reads replicas (a fixed count, 1 by default) or replica_policy (to autoscale) into s;
// the two are exclusive. It returns the target_qps_per_replica node, nil if absent.
func (c *checker) replicas(f map[string]entry, s *Service, useSpot bool) *yaml.Node {
	rep, hasRep := f["replicas"]
	pol, hasPol := f["replica_policy"]
	if hasRep && hasPol {
		c.errorf(pol.keyNode, c.policyField(), "replicas and replica_policy are exclusive: use replicas for a fixed count, or replica_policy to autoscale")
	}
	if hasPol {
		var qpsNode *yaml.Node
		s.ReplicaPolicy, qpsNode = c.replicaPolicy(pol, useSpot)
		return qpsNode
	}
	n := 1
	if hasRep {
		if v, ok := c.intAtLeast(rep.value, joinField(cmp.Or(c.section, "service"), "replicas"), 0); ok {
			n = v
		}
	}
	s.FixedReplicas = true
	s.ReplicaPolicy = ReplicaPolicy{MinReplicas: n, MaxReplicas: n,
		UpscaleDelaySeconds: DefaultUpscaleDelaySeconds, DownscaleDelaySeconds: DefaultDownscaleDelaySeconds}
	return nil
}

// checkPerAcceleratorQPS checks that a per-accelerator QPS map and the instance-aware policy
// come together (the policy divides in-flight requests by each replica's accelerator's
// target), and that the map names accelerators the resources ask for.
func (c *checker) checkPerAcceleratorQPS(f map[string]entry, s *Service, qpsNode *yaml.Node, res Resources) {
	perAccelerator := s.ReplicaPolicy.TargetQPSPerAccelerator != nil
	if perAccelerator && s.LoadBalancingPolicy != PolicyInstanceAwareLeastLoad {
		c.errorf(qpsNode, joinField(c.policyField(), "target_qps_per_replica"),
			"a mapping of accelerator to QPS needs load_balancing_policy: %s (got %s)", PolicyInstanceAwareLeastLoad, s.LoadBalancingPolicy)
	}
	lb, hasLB := f["load_balancing_policy"]
	if s.LoadBalancingPolicy == PolicyInstanceAwareLeastLoad && !perAccelerator && hasLB {
		c.errorf(lb.value, "service.load_balancing_policy",
			"%s needs replica_policy.target_qps_per_replica as a mapping of accelerator to QPS (e.g. {A100: 10, L4: 3})", PolicyInstanceAwareLeastLoad)
	}
	if perAccelerator {
		c.checkQPSAccelerators(qpsNode, res)
	}
}

// servicePort reads service.ports, the one port each replica serves on; when it is left out,
// resources.ports may name it, if it lists exactly one. It returns 0 when there is none.
func (c *checker) servicePort(e entry, f map[string]entry, res Resources) int {
	const portField = "service.ports"
	p, ok := f["ports"]
	if !ok {
		ports := candidatePorts(res)
		switch len(ports) {
		case 1:
			return ports[0]
		case 0:
			c.errorf(e.keyNode, portField, "required: the port each replica serves on (set service.ports, or give exactly one port in resources.ports)")
		default:
			c.errorf(e.keyNode, portField, "required: resources.ports lists %d ports, so say which one replicas serve on", len(ports))
		}
		return 0
	}
	if p.value.Kind == yaml.SequenceNode {
		c.errorf(p.value, portField, "expected one port (the port each replica serves on), got a list")
		return 0
	}
	lo, hi, ok := c.portRange(p.value, portField)
	if !ok {
		return 0
	}
	if lo != hi {
		c.errorf(p.value, portField, "expected one port (the port each replica serves on), got a range")
	}
	return lo
}

// healthCheck reads `service.health_check`.
func (c *checker) healthCheck(n *yaml.Node, field string) *HealthCheck {
	f, ok := c.fields(n, field, healthCheckKeys)
	if !ok {
		return nil
	}
	h := &HealthCheck{}
	if e, ok := f["path"]; ok {
		pf := joinField(field, "path")
		if v, ok := c.str(e.value, pf); ok && c.probePath(e.value, pf, v) {
			h.Path = v
		}
	}
	if e, ok := f["interval_seconds"]; ok {
		h.IntervalSeconds, _ = c.numberAbove(e.value, joinField(field, "interval_seconds"), 0, 60)
	}
	if e, ok := f["timeout_seconds"]; ok {
		h.TimeoutSeconds, _ = c.numberAbove(e.value, joinField(field, "timeout_seconds"), 0, 60)
	}
	if e, ok := f["disabled"]; ok {
		h.Disabled, _ = c.boolean(e.value, joinField(field, "disabled"))
	}
	return h
}

// update reads `service.update`.
func (c *checker) update(n *yaml.Node, field string) Update {
	u := DefaultUpdate()
	f, ok := c.fields(n, field, updateKeys)
	if !ok {
		return u
	}
	if e, ok := f["mode"]; ok {
		if v, ok := c.oneOf(e.value, joinField(field, "mode"), updateModes, "mode", "modes"); ok {
			u.Mode = v
		}
	}
	if e, ok := f["max_parallel"]; ok {
		u.MaxParallel, _ = c.intAtLeast(e.value, joinField(field, "max_parallel"), 0)
	}
	if e, ok := f["min_healthy_seconds"]; ok {
		u.MinHealthySeconds, _ = c.intAtLeast(e.value, joinField(field, "min_healthy_seconds"), 0)
	}
	if e, ok := f["progress_deadline_seconds"]; ok {
		u.ProgressDeadlineSeconds, _ = c.intAtLeast(e.value, joinField(field, "progress_deadline_seconds"), 1)
	}
	if e, ok := f["auto_rollback"]; ok {
		if v, ok := c.boolean(e.value, joinField(field, "auto_rollback")); ok {
			u.AutoRollback = v
		}
	}
	return u
}

// candidatePorts is the distinct ports over every resources candidate.
func candidatePorts(res Resources) []int {
	var out []int
	for _, cand := range res.Candidates() {
		for _, p := range cand.Ports {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// checkQPSAccelerators makes sure every key of a per-accelerator QPS map names an accelerator
// some candidate asks for; otherwise no replica would ever get that target.
func (c *checker) checkQPSAccelerators(qpsNode *yaml.Node, res Resources) {
	known := map[string]bool{}
	var names []string
	for _, cand := range res.Candidates() {
		for _, a := range cand.Accelerators {
			if !known[strings.ToLower(a.Name)] {
				known[strings.ToLower(a.Name)] = true
				names = append(names, a.Name)
			}
		}
	}
	ps, _ := c.pairs(qpsNode, "")
	for _, p := range ps {
		if known[strings.ToLower(p.key)] {
			continue
		}
		field := "service.replica_policy.target_qps_per_replica." + p.key
		if len(names) == 0 {
			c.errorf(p.keyNode, field, "resources ask for no accelerators, so a per-accelerator target cannot apply; add resources.accelerators")
		} else {
			c.errorf(p.keyNode, field, "no resources candidate asks for accelerator %s (accelerators: %s)", quoteShort(p.key), strings.Join(names, ", "))
		}
	}
}

// probe reads readiness_probe: a path, or a mapping.
func (c *checker) probe(n *yaml.Node, field string) Probe {
	p := Probe{Path: DefaultProbePath, InitialDelaySeconds: DefaultInitialDelaySeconds, TimeoutSeconds: DefaultProbeTimeoutSeconds}
	if n.Kind == yaml.ScalarNode {
		if v, ok := c.str(n, field); ok && c.probePath(n, field, v) {
			p.Path = v
		}
		return p
	}
	if n.Kind != yaml.MappingNode {
		c.errorf(n, field, "expected a path such as /health, or a mapping with path, initial_delay_seconds, timeout_seconds, post_data and headers; got %s", describe(n))
		return p
	}
	f, _ := c.fields(n, field, probeKeys)
	if e, ok := f["path"]; ok {
		pf := joinField(field, "path")
		if v, ok := c.str(e.value, pf); ok && c.probePath(e.value, pf, v) {
			p.Path = v
		}
	}
	if e, ok := f["initial_delay_seconds"]; ok {
		if v, ok := c.intAtLeast(e.value, joinField(field, "initial_delay_seconds"), 0); ok {
			p.InitialDelaySeconds = v
		}
	}
	if e, ok := f["timeout_seconds"]; ok {
		if v, ok := c.intAtLeast(e.value, joinField(field, "timeout_seconds"), 1); ok {
			p.TimeoutSeconds = v
		}
	}
	if e, ok := f["post_data"]; ok {
		p.PostData = c.postData(e.value, joinField(field, "post_data"))
	}
	if e, ok := f["headers"]; ok {
		hf := joinField(field, "headers")
		ps, _ := c.pairs(e.value, hf)
		for _, h := range ps {
			f := joinField(hf, h.key)
			if !validHeaderName(h.key) {
				c.errorf(h.keyNode, f, "%s is not a valid HTTP header name", quoteShort(h.key))
				continue
			}
			v, ok := c.scalarText(h.value, f)
			if !ok {
				continue
			}
			if strings.ContainsAny(v, "\r\n\x00") {
				c.errorf(h.value, f, "a header value cannot contain line breaks or NUL")
				continue
			}
			if p.Headers == nil {
				p.Headers = map[string]string{}
			}
			p.Headers[h.key] = v
		}
	}
	return p
}

// validHeaderName is RFC 9110's token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", ch) >= 0 {
			continue
		}
		return false
	}
	return true
}

func (c *checker) probePath(n *yaml.Node, field, path string) bool {
	if !strings.HasPrefix(path, "/") {
		c.errorf(n, field, "must start with \"/\", got %s", quoteShort(path))
		return false
	}
	if strings.ContainsFunc(path, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		c.errorf(n, field, "must not contain spaces or control characters, got %s", quoteShort(path))
		return false
	}
	return true
}

// postData encodes the probe body as JSON. A string that already is JSON is used as written
// (SkyServe users often paste a JSON body); any other value is encoded, keeping key order.
func (c *checker) postData(n *yaml.Node, field string) string {
	if isScalar(n, "!!str") && json.Valid([]byte(n.Value)) {
		if len(n.Value) > maxPostData {
			c.errorf(n, field, "body is larger than %d bytes", maxPostData)
			return ""
		}
		return n.Value
	}
	var buf bytes.Buffer
	if !c.writeJSON(&buf, n, field, 0) {
		return ""
	}
	if buf.Len() > maxPostData {
		c.errorf(n, field, "body is larger than %d bytes", maxPostData)
		return ""
	}
	return buf.String()
}

// writeJSONScalar writes a YAML scalar as the JSON value its tag says: null, a boolean, an
// integer (its digits kept when too big for 64 bits), a number, or else a string.
func (c *checker) writeJSONScalar(buf *bytes.Buffer, n *yaml.Node, field string) bool {
	switch n.ShortTag() {
	case "!!null":
		buf.WriteString("null")
		return true
	case "!!bool":
		var v bool
		if n.Decode(&v) == nil {
			fmt.Fprint(buf, v)
			return true
		}
	case "!!int":
		var v any
		if n.Decode(&v) == nil {
			switch v.(type) {
			case int, int64, uint64:
				out, _ := json.Marshal(v)
				buf.Write(out)
				return true
			}
		}
		// Too big for 64 bits: keep the digits rather than round through a float.
		if jsonIntRE.MatchString(n.Value) {
			buf.WriteString(n.Value)
			return true
		}
		c.errorf(n, field, "integer %s cannot be encoded as JSON", truncate(n.Value))
		return false
	case "!!float":
		v, ok := c.number(n, field)
		if !ok {
			return false
		}
		out, _ := json.Marshal(v)
		buf.Write(out)
		return true
	}
	writeJSONString(buf, n.Value)
	return true
}

// writeJSON encodes a YAML node as JSON in document order.
func (c *checker) writeJSON(buf *bytes.Buffer, n *yaml.Node, field string, depth int) bool {
	n = c.deref(n)
	if depth > 64 {
		c.errorf(n, field, "nested more than 64 levels deep")
		return false
	}
	if buf.Len() > maxPostData {
		return true // postData reports the size once
	}
	switch n.Kind {
	case yaml.MappingNode:
		ps, ok := c.pairs(n, field)
		if !ok {
			return false
		}
		buf.WriteByte('{')
		for i, p := range ps {
			if i > 0 {
				buf.WriteByte(',')
			}
			writeJSONString(buf, p.key)
			buf.WriteByte(':')
			if !c.writeJSON(buf, p.value, joinField(field, p.key), depth+1) {
				return false
			}
		}
		buf.WriteByte('}')
		return true
	case yaml.SequenceNode:
		buf.WriteByte('[')
		for i, item := range n.Content {
			if i > 0 {
				buf.WriteByte(',')
			}
			if !c.writeJSON(buf, item, indexField(field, i), depth+1) {
				return false
			}
		}
		buf.WriteByte(']')
		return true
	case yaml.ScalarNode:
		return c.writeJSONScalar(buf, n, field)
	}
	c.errorf(n, field, "cannot encode %s as JSON", describe(n))
	return false
}

func writeJSONString(buf *bytes.Buffer, s string) {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	buf.Truncate(buf.Len() - 1)
}

// replicaPolicy reads replica_policy with its defaults and cross-field rules. It returns the
// target_qps_per_replica node (nil if absent) for rules that depend on other sections.
func (c *checker) replicaPolicy(e entry, useSpot bool) (ReplicaPolicy, *yaml.Node) {
	p := ReplicaPolicy{UpscaleDelaySeconds: DefaultUpscaleDelaySeconds, DownscaleDelaySeconds: DefaultDownscaleDelaySeconds}
	f, ok := c.fields(e.value, c.policyField(), policyKeys)
	if !ok {
		return p, nil
	}
	minOK, maxOK := c.replicaRange(e, f, &p)
	var qpsNode *yaml.Node
	if q, ok := f["target_qps_per_replica"]; ok {
		qpsNode = q.value
		c.qpsTarget(q.value, &p)
	}

	scaling := c.resolveAutoscaler(f, p, minOK && maxOK, qpsNode != nil)
	p.Autoscaler = scaling.name
	c.scalingFields(f, &p, scaling, minOK)

	if n, ok := f["num_overprovision"]; ok {
		p.NumOverprovision, _ = c.intAtLeast(n.value, joinField(c.policyField(), "num_overprovision"), 0)
		p.NumOverprovisionSet = true
	}
	c.spotFallback(f, &p, useSpot)
	return p, qpsNode
}

// replicaRange reads min_replicas (required) and max_replicas (min_replicas when left out).
// minOK and maxOK say each was read without error: the choice of autoscaler depends on both.
func (c *checker) replicaRange(e entry, f map[string]entry, p *ReplicaPolicy) (minOK, maxOK bool) {
	min := 0
	if m, ok := f["min_replicas"]; ok {
		min, minOK = c.intAtLeast(m.value, joinField(c.policyField(), "min_replicas"), 0)
	} else {
		c.errorf(e.keyNode, joinField(c.policyField(), "min_replicas"), "required: how many replicas to keep running (0 scales to zero)")
	}
	p.MinReplicas, p.MaxReplicas = min, min
	maxNode, hasMax := f["max_replicas"]
	maxOK = minOK
	if hasMax {
		var max int
		max, maxOK = c.intAtLeast(maxNode.value, joinField(c.policyField(), "max_replicas"), 0)
		if maxOK && minOK && max < min {
			c.errorf(maxNode.value, joinField(c.policyField(), "max_replicas"), "must be at least min_replicas (%d), got %d", min, max)
			maxOK = false
		}
		if maxOK {
			p.MaxReplicas = max
		}
	}
	return minOK, maxOK
}

// qpsTarget reads target_qps_per_replica: one target for every replica, or a mapping of
// accelerator to target for replicas that run on different accelerators.
func (c *checker) qpsTarget(n *yaml.Node, p *ReplicaPolicy) {
	qf := joinField(c.policyField(), "target_qps_per_replica")
	switch n.Kind {
	case yaml.MappingNode:
		ps, _ := c.pairs(n, qf)
		if len(ps) == 0 {
			c.errorf(n, qf, "empty mapping: give a QPS target for at least one accelerator")
		}
		m := map[string]float64{}
		for _, a := range ps {
			af := joinField(qf, a.key)
			if !acceleratorNameRE.MatchString(a.key) {
				c.errorf(a.keyNode, af, "bad accelerator name %s", quoteShort(a.key))
				continue
			}
			if v, ok := c.positive(a.value, af); ok {
				m[a.key] = v
			}
		}
		if len(m) > 0 {
			p.TargetQPSPerAccelerator = m
		}
	case yaml.ScalarNode:
		if v, ok := c.positive(n, qf); ok {
			p.TargetQPSPerReplica = v
		}
	default:
		c.errorf(n, qf, "expected a number, or a mapping of accelerator to number, got %s", describe(n))
	}
}

// spotFallback reads the fields that describe how spot and on-demand replicas mix. Without
// spot they would silently do nothing, which is worse than an error.
func (c *checker) spotFallback(f map[string]entry, p *ReplicaPolicy, useSpot bool) {
	spotOnly := func(key string, set bool, n *yaml.Node) {
		if set && !useSpot {
			c.errorf(n, joinField(c.policyField(), key), "%s", spotOnlyMsgSuffix)
		}
	}
	if n, ok := f["base_ondemand_fallback_replicas"]; ok {
		if v, ok := c.intAtLeast(n.value, joinField(c.policyField(), "base_ondemand_fallback_replicas"), 0); ok {
			p.BaseOndemandFallbackReplicas = v
			spotOnly("base_ondemand_fallback_replicas", v > 0, n.value)
		}
	}
	if n, ok := f["dynamic_ondemand_fallback"]; ok {
		if v, ok := c.boolean(n.value, joinField(c.policyField(), "dynamic_ondemand_fallback")); ok {
			p.DynamicOndemandFallback = v
			spotOnly("dynamic_ondemand_fallback", v, n.value)
		}
	}
	if n, ok := f["spot_placer"]; ok {
		if v, ok := c.oneOf(n.value, joinField(c.policyField(), "spot_placer"), spotPlacers, "spot placer", "placers"); ok {
			p.SpotPlacer = v
			spotOnly("spot_placer", true, n.value)
		}
	}
}

// expandHome replaces a leading "~" or "~/" with the user's home directory.
func expandHome(p string) string {
	if p != "~" && !strings.HasPrefix(p, "~/") {
		return p
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		return p
	}
	return filepath.Join(home, p[1:])
}
