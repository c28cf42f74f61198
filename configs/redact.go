package configs

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// RedactedValue replaces every secret value in Redacted and ResolvedYAML output.
const RedactedValue = "<redacted>"

// Redacted returns a deep copy of t that is safe to print, log or send to a client: every
// secret value, every env named like a credential (CredentialEnv) or that keys_from_env reads an
// API key from (KeyEnvs), and every probe header that carries credentials (Authorization,
// cookies, tokens, API keys), is replaced by RedactedValue. t itself is not changed.
func (t *Task) Redacted() *Task {
	if t == nil {
		return nil
	}
	out := *t
	out.Resources = t.Resources.clone()
	out.Envs = maps.Clone(t.Envs)
	for _, name := range t.KeyEnvs() {
		out.Envs[name] = RedactedValue
	}
	for name := range t.Envs {
		if CredentialEnv(name) {
			out.Envs[name] = RedactedValue
		}
	}
	out.FileMounts = maps.Clone(t.FileMounts)
	out.MountModes = maps.Clone(t.MountModes)
	if t.Secrets != nil {
		out.Secrets = make(map[string]string, len(t.Secrets))
		for k := range t.Secrets {
			out.Secrets[k] = RedactedValue
		}
	}
	if t.Job != nil {
		j := *t.Job
		j.Recovery.RecoverOnExitCodes = slices.Clone(j.Recovery.RecoverOnExitCodes)
		out.Job = &j
	}
	if t.Service != nil {
		s := *t.Service
		s.ReplicaPolicy.TargetQPSPerAccelerator = maps.Clone(s.ReplicaPolicy.TargetQPSPerAccelerator)
		if s.ReadinessProbe.Headers != nil {
			h := make(map[string]string, len(s.ReadinessProbe.Headers))
			for k, v := range s.ReadinessProbe.Headers {
				if sensitiveHeader(k) {
					v = RedactedValue
				}
				h[k] = v
			}
			s.ReadinessProbe.Headers = h
		}
		if s.TLS != nil {
			tls := *s.TLS
			s.TLS = &tls
		}
		if s.Auth != nil {
			// Hashes are not keys, but nothing that shows a task needs them either.
			s.Auth = &Auth{KeysFromEnv: slices.Clone(s.Auth.KeysFromEnv), KeysFile: s.Auth.KeysFile}
		}
		if s.Limits != nil {
			limits := *s.Limits
			if r := limits.RateLimitPerKey; r != nil {
				rate := *r
				limits.RateLimitPerKey = &rate
			}
			s.Limits = &limits
		}
		if s.HealthCheck != nil {
			h := *s.HealthCheck
			s.HealthCheck = &h
		}
		out.Service = &s
	}
	scrubSecrets(&out, t.secretValues())
	return &out
}

// secretValues are the values Redacted scrubs from other fields: the secrets', and those of
// envs named like a credential of at least minScrubbed bytes (an env such as CACHE_KEY=1 must
// not turn every 1 in a path into <redacted>; its own value is hidden whatever its length).
func (t *Task) secretValues() []string {
	const minScrubbed = 4
	var out []string
	for _, v := range t.Secrets {
		out = append(out, v)
	}
	for k, v := range t.Envs {
		if CredentialEnv(k) && len(v) >= minScrubbed {
			out = append(out, v)
		}
	}
	return out
}

// CredentialEnv reports whether an env's name says its value is a credential: *_TOKEN, *_KEY,
// *_PAT, *_APIKEY and anything with SECRET, PASSWORD, PASSWD, CREDENTIAL or PRIVATE_KEY in it
// (HF_TOKEN, AWS_SECRET_ACCESS_KEY, OPENAI_API_KEY, DB_PASSWORD, ...), in any case, as are
// TOKEN, APIKEY and API_KEY themselves. Such an env is treated as a secret everywhere but in its
// name: shown as RedactedValue, encrypted in the store, put in a Kubernetes Secret, and still
// given to the replica as written.
func CredentialEnv(name string) bool {
	n := strings.ToUpper(name)
	switch n {
	case "TOKEN", "APIKEY", "API_KEY", "PASSWORD":
		return true
	}
	for _, suffix := range []string{"_TOKEN", "_KEY", "_PAT", "_APIKEY"} {
		if strings.HasSuffix(n, suffix) {
			return true
		}
	}
	for _, word := range []string{"SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "PRIVATE_KEY"} {
		if strings.Contains(n, word) {
			return true
		}
	}
	return false
}

// SecretEnvNames are the names of the task's environment that are secrets, sorted: every
// secret and every env named like a credential (CredentialEnv). Infras that can keep secrets
// apart (a Kubernetes Secret) do so for all of them (launcher.Spec.SecretEnvs).
func (t *Task) SecretEnvNames() []string {
	if t == nil {
		return nil
	}
	var out []string
	for k := range t.Secrets {
		out = append(out, k)
	}
	for k := range t.Envs {
		if _, dup := t.Secrets[k]; !dup && CredentialEnv(k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// scrubSecrets replaces secret values that `$NAME` substitution put into workdir, file_mounts or
// the readiness probe (SkyPilot substitutes inline secrets too), so they are never shown.
func scrubSecrets(t *Task, secrets []string) {
	var pairs []string
	for _, v := range secrets {
		if v != "" {
			pairs = append(pairs, v, RedactedValue)
		}
	}
	if len(pairs) == 0 {
		return
	}
	r := strings.NewReplacer(pairs...)
	t.Workdir = r.Replace(t.Workdir)
	if t.FileMounts != nil {
		fm := make(map[string]string, len(t.FileMounts))
		for k, v := range t.FileMounts {
			fm[r.Replace(k)] = r.Replace(v)
		}
		t.FileMounts = fm
	}
	if t.MountModes != nil {
		modes := make(map[string]MountMode, len(t.MountModes))
		for k, v := range t.MountModes {
			modes[r.Replace(k)] = v
		}
		t.MountModes = modes
	}
	if t.Service != nil {
		p := &t.Service.ReadinessProbe
		p.Path, p.PostData = r.Replace(p.Path), r.Replace(p.PostData)
		for k, v := range p.Headers {
			p.Headers[k] = r.Replace(v)
		}
	}
}

// KeyEnvs are the names service.auth.keys_from_env takes API keys from that are also among the
// task's envs. Parsing refuses them, as envs are shown and stored as written; a task stored
// before that rule may still have them, and Redacted hides their values.
func (t *Task) KeyEnvs() []string {
	if t == nil || t.Service == nil || t.Service.Auth == nil {
		return nil
	}
	var out []string
	for _, name := range t.Service.Auth.KeysFromEnv {
		if _, ok := t.Envs[name]; ok {
			out = append(out, name)
		}
	}
	return out
}

// sensitiveHeader reports whether a header's value is a credential.
func sensitiveHeader(name string) bool {
	n := strings.ToLower(name)
	switch n {
	case "authorization", "proxy-authorization", "cookie", "set-cookie":
		return true
	}
	for _, word := range []string{"token", "secret", "key", "password", "auth", "session"} {
		if strings.Contains(n, word) {
			return true
		}
	}
	return false
}

// ResolvedYAML renders the task as Ferry will run it, with every default filled in and
// secrets redacted, so `serve up` can show exactly what was understood. The output is itself a
// valid task file: parsing it gives back t.Redacted().
func (t *Task) ResolvedYAML() ([]byte, error) {
	r := t.Redacted()
	doc := resolvedTask{
		Name:       text(r.Name),
		NumNodes:   r.NumNodes,
		Resources:  toResolvedResources(r.Resources).withObjective(r.Resources.Objective),
		Envs:       textMap(r.Envs),
		Secrets:    textMap(r.Secrets),
		FileMounts: resolvedFileMounts(r),
		Setup:      text(r.Setup),
		Run:        text(r.Run),
	}
	doc.Workdir, doc.Config = resolvedWorkdir(r), r.Config // workdir.go, taskconfig.go
	if r.Service != nil {
		doc.Service = toResolvedService(r.Service)
	}
	if j := r.Job; j != nil {
		doc.Job = &resolvedJob{Priority: j.Priority, Preemptible: j.Preemptible, GracePeriodSeconds: j.GracePeriodSeconds}
		rec := j.Recovery
		doc.Resources.JobRecovery = &resolvedRecovery{Strategy: rec.Strategy, MaxRestartsOnErrors: rec.MaxRestartsOnErrors, RecoverOnExitCodes: rec.RecoverOnExitCodes, MinNodes: rec.MinNodes}
	}
	var buf bytes.Buffer
	buf.WriteString("# Resolved by Ferry: defaults filled in, secrets redacted.\n")
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("configs: render resolved task: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("configs: render resolved task: %w", err)
	}
	return buf.Bytes(), nil
}

// text is a string that ResolvedYAML writes so that it reads back the same. yaml.v3 writes
// multi-line strings as block scalars, which lose a leading newline or indented first line;
// those are double-quoted instead.
type text string

// MarshalYAML implements yaml.Marshaler.
func (t text) MarshalYAML() (any, error) {
	n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: string(t)}
	if s := string(t); strings.Contains(s, "\n") && strings.IndexByte(" \t\r\n", s[0]) >= 0 {
		n.Style = yaml.DoubleQuotedStyle
	}
	return n, nil
}

func textMap(m map[string]string) map[string]text {
	if m == nil {
		return nil
	}
	out := make(map[string]text, len(m))
	for k, v := range m {
		out[k] = text(v)
	}
	return out
}

// The resolved* types fix the YAML shape and key order of ResolvedYAML. Cloud/Region/Zone are
// left out: Infra says the same, and the two spellings may not be combined in one file.
type resolvedTask struct {
	Name       text              `yaml:"name,omitempty"`
	Workdir    any               `yaml:"workdir,omitempty"`
	NumNodes   int               `yaml:"num_nodes"`
	Resources  resolvedResources `yaml:"resources"`
	Envs       map[string]text   `yaml:"envs,omitempty"`
	Secrets    map[string]text   `yaml:"secrets,omitempty"`
	FileMounts map[string]any    `yaml:"file_mounts,omitempty"`
	Setup      text              `yaml:"setup,omitempty"`
	Run        text              `yaml:"run"`
	Service    *resolvedService  `yaml:"service,omitempty"`
	Job        *resolvedJob      `yaml:"job,omitempty"`
	Config     *TaskConfig       `yaml:"config,omitempty"`
}

type resolvedJob struct {
	Priority           int  `yaml:"priority"`
	Preemptible        bool `yaml:"preemptible"`
	GracePeriodSeconds int  `yaml:"grace_period_seconds"`
}

type resolvedRecovery struct {
	Strategy            string `yaml:"strategy"`
	MaxRestartsOnErrors int    `yaml:"max_restarts_on_errors"`
	RecoverOnExitCodes  []int  `yaml:"recover_on_exit_codes,omitempty,flow"`
	MinNodes            int    `yaml:"min_nodes,omitempty"`
}

type resolvedResources struct {
	Infra        text                `yaml:"infra,omitempty"`
	InstanceType text                `yaml:"instance_type,omitempty"`
	Accelerators *yaml.Node          `yaml:"accelerators,omitempty"`
	CPUs         text                `yaml:"cpus,omitempty"`
	Memory       text                `yaml:"memory,omitempty"`
	UseSpot      bool                `yaml:"use_spot,omitempty"`
	Ports        []int               `yaml:"ports,omitempty,flow"`
	ImageID      text                `yaml:"image_id,omitempty"`
	DiskSize     int                 `yaml:"disk_size,omitempty"`
	DiskTier     text                `yaml:"disk_tier,omitempty"`
	NetworkTier  text                `yaml:"network_tier,omitempty"`
	Labels       map[string]text     `yaml:"labels,omitempty"`
	Autostop     *Autostop           `yaml:"autostop,omitempty"`
	GPUShare     *GPUShare           `yaml:"gpu_share,omitempty"`
	Capacity     *Capacity           `yaml:"capacity,omitempty"`
	AnyOf        []resolvedResources `yaml:"any_of,omitempty"`
	Ordered      []resolvedResources `yaml:"ordered,omitempty"`
	JobRecovery  *resolvedRecovery   `yaml:"job_recovery,omitempty"`
	Objective    *resolvedObjective  `yaml:"objective,omitempty"`
}

func toResolvedResources(r Resources) resolvedResources {
	out := resolvedResources{
		Infra:        text(r.Infra),
		InstanceType: text(r.InstanceType),
		CPUs:         text(r.CPUs),
		Memory:       text(r.Memory),
		UseSpot:      r.UseSpot,
		Ports:        r.Ports,
		ImageID:      text(r.ImageID),
		DiskSize:     r.DiskSize,
		DiskTier:     text(r.DiskTier),
		NetworkTier:  text(r.NetworkTier),
		Labels:       textMap(r.Labels),
		Autostop:     r.Autostop,
		GPUShare:     r.GPUShare,
		Capacity:     r.Capacity,
	}
	if r.isPreferenceList() {
		// Written back as the list it came from, which means the same ordered alternatives.
		out.Accelerators = &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
		for _, a := range r.Accelerators {
			out.Accelerators.Content = append(out.Accelerators.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: a.Spec()})
		}
		return out
	}
	if len(r.Accelerators) > 0 {
		// A mapping is a set, as in SkyPilot: {A100: 1, L4: 0.5}. A GPU at several counts is
		// written as SkyPilot's keys, {A100:4: null, A100:8: null}, as names would repeat.
		out.Accelerators = &yaml.Node{Kind: yaml.MappingNode, Style: yaml.FlowStyle}
		specKeys := repeatsName(r.Accelerators)
		for _, a := range r.Accelerators {
			if specKeys {
				out.Accelerators.Content = append(out.Accelerators.Content,
					&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: a.Spec()},
					&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"})
				continue
			}
			out.Accelerators.Content = append(out.Accelerators.Content,
				&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: a.Name},
				&yaml.Node{Kind: yaml.ScalarNode, Tag: countTag(a.Count), Value: formatCount(a.Count)})
		}
	}
	// capacity is written once, at the top, where it is read; alternatives inherit it.
	for _, alt := range r.AnyOf {
		out.AnyOf = append(out.AnyOf, toResolvedResources(alt))
		out.AnyOf[len(out.AnyOf)-1].Capacity, out.AnyOf[len(out.AnyOf)-1].NetworkTier = nil, ""
	}
	for _, alt := range r.Ordered {
		out.Ordered = append(out.Ordered, toResolvedResources(alt))
		out.Ordered[len(out.Ordered)-1].Capacity, out.Ordered[len(out.Ordered)-1].NetworkTier = nil, ""
	}
	return out
}

// repeatsName reports whether an accelerator name appears twice (at different counts).
func repeatsName(accs []Accelerator) bool {
	seen := map[string]bool{}
	for _, a := range accs {
		key := strings.ToLower(a.Name)
		if seen[key] {
			return true
		}
		seen[key] = true
	}
	return false
}

// countTag is the YAML tag a count reads back as, so the encoder writes no explicit tag.
func countTag(v float64) string {
	if v == float64(int64(v)) {
		return "!!int"
	}
	return "!!float"
}

type resolvedService struct {
	ReadinessProbe      resolvedProbe   `yaml:"readiness_probe"`
	Replicas            *int            `yaml:"replicas,omitempty"`
	ReplicaPolicy       *resolvedPolicy `yaml:"replica_policy,omitempty"`
	Ports               int             `yaml:"ports"`
	LoadBalancingPolicy string          `yaml:"load_balancing_policy"`
	TLS                 *resolvedTLS    `yaml:"tls,omitempty"`
	Auth                *resolvedAuth   `yaml:"auth,omitempty"`
	Limits              *Limits         `yaml:"limits,omitempty"`
	Update              *Update         `yaml:"update,omitempty"`
	HealthCheck         *HealthCheck    `yaml:"health_check,omitempty"`
}

type resolvedAuth struct {
	KeysFromEnv []text `yaml:"keys_from_env,omitempty"`
	KeysFile    text   `yaml:"keys_file,omitempty"`
}

type resolvedTLS struct {
	KeyFile  text `yaml:"keyfile"`
	CertFile text `yaml:"certfile"`
}

type resolvedProbe struct {
	Path                text            `yaml:"path"`
	InitialDelaySeconds int             `yaml:"initial_delay_seconds"`
	TimeoutSeconds      int             `yaml:"timeout_seconds"`
	PostData            text            `yaml:"post_data,omitempty"`
	Headers             map[string]text `yaml:"headers,omitempty"`
}

type resolvedPolicy struct {
	MinReplicas                  int     `yaml:"min_replicas"`
	MaxReplicas                  int     `yaml:"max_replicas"`
	Autoscaler                   string  `yaml:"autoscaler,omitempty"`
	TargetQPSPerReplica          any     `yaml:"target_qps_per_replica,omitempty"`
	NumOverprovision             *int    `yaml:"num_overprovision,omitempty"`
	UpscaleDelaySeconds          *int    `yaml:"upscale_delay_seconds,omitempty"`
	DownscaleDelaySeconds        *int    `yaml:"downscale_delay_seconds,omitempty"`
	BaseOndemandFallbackReplicas int     `yaml:"base_ondemand_fallback_replicas,omitempty"`
	DynamicOndemandFallback      bool    `yaml:"dynamic_ondemand_fallback,omitempty"`
	SpotPlacer                   string  `yaml:"spot_placer,omitempty"`
	TargetInflightPerReplica     float64 `yaml:"target_inflight_per_replica,omitempty"`
	StableWindowSeconds          int     `yaml:"stable_window_seconds,omitempty"`
	PanicWindowSeconds           int     `yaml:"panic_window_seconds,omitempty"`
	PanicThreshold               float64 `yaml:"panic_threshold,omitempty"`
	MaxScaleUpRate               float64 `yaml:"max_scale_up_rate,omitempty"`
	MaxScaleDownRate             float64 `yaml:"max_scale_down_rate,omitempty"`
	ScaleToZeroGraceSeconds      int     `yaml:"scale_to_zero_grace_seconds,omitempty"`
	TargetWaitingPerReplica      float64 `yaml:"target_waiting_per_replica,omitempty"`
	TargetKVCacheUsage           float64 `yaml:"target_kv_cache_usage,omitempty"`
}

// ifSet is &v when set, else nil (omitted from resolved YAML).
func ifSet(set bool, v int) *int {
	if !set {
		return nil
	}
	return &v
}

// toResolvedService is a service block as --dry-run shows it, defaults filled in.
func toResolvedService(s *Service) *resolvedService {
	rs := &resolvedService{
		ReadinessProbe: resolvedProbe{
			Path:                text(s.ReadinessProbe.Path),
			InitialDelaySeconds: s.ReadinessProbe.InitialDelaySeconds,
			TimeoutSeconds:      s.ReadinessProbe.TimeoutSeconds,
			PostData:            text(s.ReadinessProbe.PostData),
			Headers:             textMap(s.ReadinessProbe.Headers),
		},
		Ports:               s.Port,
		LoadBalancingPolicy: s.LoadBalancingPolicy,
	}
	if s.TLS != nil {
		rs.TLS = &resolvedTLS{KeyFile: text(s.TLS.KeyFile), CertFile: text(s.TLS.CertFile)}
	}
	if s.Auth != nil {
		ra := &resolvedAuth{KeysFile: text(s.Auth.KeysFile)}
		for _, name := range s.Auth.KeysFromEnv {
			ra.KeysFromEnv = append(ra.KeysFromEnv, text(name))
		}
		rs.Auth = ra
	}
	rs.Limits = s.Limits
	rs.HealthCheck = s.HealthCheck
	if s.Update != DefaultUpdate() {
		u := s.Update
		rs.Update = &u
	}
	if s.FixedReplicas {
		n := s.ReplicaPolicy.MinReplicas
		rs.Replicas = &n
	} else {
		rs.ReplicaPolicy = toResolvedPolicy(s.ReplicaPolicy)
	}
	return rs
}

// toResolvedPolicy is a replica_policy as --dry-run shows it: the fields its autoscaler reads.
func toResolvedPolicy(p ReplicaPolicy) *resolvedPolicy {
	rp := &resolvedPolicy{
		// Written only when the YAML set it: absent, concurrency and llm learn a headroom.
		NumOverprovision:             ifSet(p.NumOverprovisionSet, p.NumOverprovision),
		MinReplicas:                  p.MinReplicas,
		MaxReplicas:                  p.MaxReplicas,
		Autoscaler:                   p.Autoscaler,
		BaseOndemandFallbackReplicas: p.BaseOndemandFallbackReplicas,
		DynamicOndemandFallback:      p.DynamicOndemandFallback,
		SpotPlacer:                   p.SpotPlacer,
		// The windowed autoscalers' fields are written as given: their zero means
		// the autoscaler package's default, which is not this package's to show.
		TargetInflightPerReplica: p.TargetInflightPerReplica,
		StableWindowSeconds:      p.StableWindowSeconds,
		PanicWindowSeconds:       p.PanicWindowSeconds,
		PanicThreshold:           p.PanicThreshold,
		MaxScaleUpRate:           p.MaxScaleUpRate,
		MaxScaleDownRate:         p.MaxScaleDownRate,
		ScaleToZeroGraceSeconds:  p.ScaleToZeroGraceSeconds,
		TargetWaitingPerReplica:  p.TargetWaitingPerReplica,
		TargetKVCacheUsage:       p.TargetKVCacheUsage,
	}
	// SkyServe's delays belong to request_rate (and are accepted with a fixed count);
	// concurrency and llm reject them.
	if p.Autoscaler == "" || p.Autoscaler == AutoscalerRequestRate {
		up, down := p.UpscaleDelaySeconds, p.DownscaleDelaySeconds
		rp.UpscaleDelaySeconds, rp.DownscaleDelaySeconds = &up, &down
	}
	switch {
	case p.TargetQPSPerAccelerator != nil:
		rp.TargetQPSPerReplica = p.TargetQPSPerAccelerator
	case p.TargetQPSPerReplica > 0:
		rp.TargetQPSPerReplica = p.TargetQPSPerReplica
	}
	return rp
}
