// Package configs owns Ferry's YAML schema: a SkyPilot-style task with an optional `service:`
// section, its defaults, and validation that reports every error with file, line and column.
//
// It must not import runtime packages: everything else depends on it, not the other way round.
package configs

// Task is one SkyPilot-style task. A task with a Service is a service; without one it is a job.
type Task struct {
	// Name is the task (and by default the service) name.
	Name string `json:"name,omitempty" yaml:"name,omitempty"`
	// Workdir is a local directory the task's commands run in.
	Workdir string `json:"workdir,omitempty" yaml:"workdir,omitempty"`
	// GitWorkdir is workdir's mapping form, a git repository cloned on each node (workdir.go);
	// nil for a local workdir or none.
	GitWorkdir *GitWorkdir `json:"git_workdir,omitempty" yaml:"-"`
	// NumNodes is the gang size for multi-node jobs; services use 1.
	NumNodes int `json:"num_nodes" yaml:"num_nodes"`
	// Resources says what each node needs and where it may run.
	Resources Resources `json:"resources" yaml:"resources"`
	// Envs are plain environment variables given to setup and run.
	Envs map[string]string `json:"envs,omitempty" yaml:"envs,omitempty"`
	// Secrets are environment variables whose values are never logged or shown.
	Secrets map[string]string `json:"secrets,omitempty" yaml:"secrets,omitempty"`
	// FileMounts maps a remote path to a local path or bucket URI (filemounts.go).
	FileMounts map[string]string `json:"file_mounts,omitempty" yaml:"file_mounts,omitempty"`
	// MountModes holds the bucket mounts of FileMounts that are mounted, not copied: remote
	// path → ModeMount or ModeMountCached. Every other mount is copied (ModeCopy).
	MountModes map[string]MountMode `json:"mount_modes,omitempty" yaml:"-"`
	// Setup runs once per node before Run.
	Setup string `json:"setup,omitempty" yaml:"setup,omitempty"`
	// Run is the main command; for a service it must start the server on the service port.
	Run string `json:"run" yaml:"run"`
	// Service is nil for a job.
	Service *Service `json:"service,omitempty" yaml:"service,omitempty"`
	// Job is set, defaults filled, for a job (no Service), and nil for a service.
	Job *Job `json:"job,omitempty" yaml:"job,omitempty"`
	// Config is SkyPilot's per-task `config:` as far as Ferry acts on it (taskconfig.go).
	Config *TaskConfig `json:"config,omitempty" yaml:"config,omitempty"`
	// Source is the file the task was read from, for messages.
	Source string `json:"-" yaml:"-"`
	// Notes are what Ferry accepted but reads its own way (a deprecated spelling, alternatives
	// on clouds Ferry lacks dropped from the plan, a name made DNS-safe), in file order. The CLI
	// prints them with the plan; they are not sent to the controller.
	Notes []Note `json:"-" yaml:"-"`
}

// Resources is one `resources:` block. AnyOf and Ordered hold alternatives; each alternative
// inherits the fields set at the top level and overrides what it sets itself.
type Resources struct {
	// Infra is "local", "kubernetes[/context]", "aws[/region[/zone]]", "gcp[/region[/zone]]" or
	// "*" (every enabled infra but local); "" (none written) is every enabled infra, local
	// only where it fits. Cloud/Region/Zone are the older spelling of the same thing, never
	// written back: infra says it, and the two spellings may not be combined in one file.
	Infra  string `json:"infra,omitempty" yaml:"infra,omitempty"`
	Cloud  string `json:"cloud,omitempty" yaml:"-"`
	Region string `json:"region,omitempty" yaml:"-"`
	Zone   string `json:"zone,omitempty" yaml:"-"`
	// InstanceType pins a cloud instance type (p4d.24xlarge, a2-highgpu-1g); the optimizer
	// plans only that type.
	InstanceType string `json:"instance_type,omitempty" yaml:"instance_type,omitempty"`
	// Accelerators are alternatives: any one of them satisfies the task ("A100:1" is one).
	Accelerators []Accelerator `json:"accelerators,omitempty" yaml:"accelerators,omitempty"`
	// CPUs and Memory keep SkyPilot's spelling: "4" means exactly 4, "4+" at least 4.
	CPUs     string `json:"cpus,omitempty" yaml:"cpus,omitempty"`
	Memory   string `json:"memory,omitempty" yaml:"memory,omitempty"`
	UseSpot  bool   `json:"use_spot,omitempty" yaml:"use_spot,omitempty"`
	Ports    []int  `json:"ports,omitempty" yaml:"ports,omitempty,flow"`
	ImageID  string `json:"image_id,omitempty" yaml:"image_id,omitempty"`
	DiskSize int    `json:"disk_size,omitempty" yaml:"disk_size,omitempty"`
	// DiskTier is SkyPilot's disk_tier (DiskTierLow … DiskTierBest); "" leaves each infra's
	// default (the medium tier on VMs).
	DiskTier string `json:"disk_tier,omitempty" yaml:"disk_tier,omitempty"`
	// NetworkTier is SkyPilot's network_tier (NetworkTierStandard, NetworkTierBest; network.go);
	// "" is standard.
	NetworkTier string `json:"network_tier,omitempty" yaml:"network_tier,omitempty"`
	// Labels go on every instance: pod labels on Kubernetes, tags on AWS, labels on GCP.
	Labels map[string]string `json:"labels,omitempty" yaml:"labels,omitempty"`
	// Autostop is resources.autostop; nil when the YAML leaves it out or says false.
	Autostop *Autostop `json:"autostop,omitempty" yaml:"autostop,omitempty"`
	// GPUShare is `gpu_share`: memory and core shares, type and UUID pins, binpack or spread
	// (gpushare.go). Nil when not written.
	GPUShare *GPUShare `json:"gpu_share,omitempty" yaml:"gpu_share,omitempty"`
	// Capacity is `capacity` (capacity.go): queued or reserved capacity. Nil when not written
	// (on-demand); set only at the top of resources, and copied into every alternative.
	Capacity *Capacity `json:"capacity,omitempty" yaml:"capacity,omitempty"`
	// AnyOf alternatives: the cheapest feasible one wins.
	AnyOf []Resources `json:"any_of,omitempty" yaml:"any_of,omitempty"`
	// Ordered alternatives: the first feasible one wins.
	Ordered []Resources `json:"ordered,omitempty" yaml:"ordered,omitempty"`
	// Objective is what the optimizer minimises among the candidates (objective.go).
	Objective Objective `json:"objective,omitzero" yaml:"objective"`
	// NumNodes, in an any_of or ordered alternative of a job, is that shape's gang size (8
	// nodes × 1 GPU on spot against 1 node × 8 on demand); 0 is the task's num_nodes. Never
	// set at the top of resources, where num_nodes is the task's.
	NumNodes int `json:"num_nodes,omitempty" yaml:"num_nodes,omitempty"`
}

// Autostop is SkyPilot's resources.autostop. Ferry has no long-lived clusters: a job's nodes
// are torn down when it ends, which is autodown with no idle wait, so a job accepts every
// spelling; a service scales with replica_policy instead (docs/yaml.md, the autostop row).
type Autostop struct {
	IdleMinutes int  `json:"idle_minutes" yaml:"idle_minutes"`
	Down        bool `json:"down" yaml:"down"`
}

// Disk tiers, SkyPilot's names.
const (
	DiskTierLow    = "low"
	DiskTierMedium = "medium"
	DiskTierHigh   = "high"
	DiskTierUltra  = "ultra"
	DiskTierBest   = "best"
)

// Accelerator is a GPU (or TPU) type and how many of it one node needs.
type Accelerator struct {
	Name  string  `json:"name"`
	Count float64 `json:"count"`
}

// Service is the `service:` section.
type Service struct {
	ReadinessProbe Probe `json:"readiness_probe" yaml:"readiness_probe"`
	// FixedReplicas is true when the YAML said `replicas: N` (or nothing); ReplicaPolicy then has
	// MinReplicas == MaxReplicas == N.
	FixedReplicas bool          `json:"fixed_replicas" yaml:"replicas"`
	ReplicaPolicy ReplicaPolicy `json:"replica_policy" yaml:"replica_policy"`
	// Port is the port each replica serves on (from `ports`, else the single resources.ports).
	Port                int    `json:"port" yaml:"ports"`
	LoadBalancingPolicy string `json:"load_balancing_policy" yaml:"load_balancing_policy"`
	TLS                 *TLS   `json:"tls,omitempty" yaml:"tls,omitempty"`
	// Auth, when set, makes the endpoint require an API key.
	Auth *Auth `json:"auth,omitempty" yaml:"auth,omitempty"`
	// Limits overrides the proxy's request limits; nil keeps the defaults.
	Limits *Limits `json:"limits,omitempty" yaml:"limits,omitempty"`
	// Update is how `ferry serve update` rolls this version out; defaults applied.
	Update Update `json:"update" yaml:"update"`
	// HealthCheck tunes the proxy's own check of each replica; nil keeps the defaults.
	HealthCheck *HealthCheck `json:"health_check,omitempty" yaml:"health_check,omitempty"`
	// Adapters are the LoRA adapters requests may name as their model (adapters.go); nil
	// when the service serves its base model only.
	Adapters *Adapters `json:"adapters,omitempty" yaml:"adapters,omitempty"`
	// Pools, when set, disaggregates prefill from decode (pools.go): the service's own
	// replicas decode, and a pool of its own prefills.
	Pools *Pools `json:"pools,omitempty" yaml:"pools,omitempty"`
}

// Update modes.
const (
	UpdateRolling   = "rolling"
	UpdateBlueGreen = "blue_green"
)

// Update defaults. MaxParallel 0 means a quarter of the target count, at least 1, as
// Kubernetes' maxSurge: faster than one at a time for large fleets, without doubling them.
const (
	DefaultMinHealthySeconds       = 10
	DefaultProgressDeadlineSeconds = 1800
)

// Update is `service.update`, the knobs of a rollout (after Nomad's update stanza).
type Update struct {
	// Mode is rolling (versions mix, old replicas go as new ones are healthy) or blue_green
	// (traffic switches at once when the new version has min_replicas healthy).
	Mode string `json:"mode" yaml:"mode"`
	// MaxParallel bounds new-version replicas starting at once (launched, not yet healthy); 0
	// is a quarter of the target count, at least 1.
	MaxParallel int `json:"max_parallel" yaml:"max_parallel"`
	// MinHealthySeconds is how long a new replica must stay READY before it counts: only then
	// does an old replica go.
	MinHealthySeconds int `json:"min_healthy_seconds" yaml:"min_healthy_seconds"`
	// ProgressDeadlineSeconds fails the rollout when no new replica became healthy for this
	// long (since the start or the previous healthy one).
	ProgressDeadlineSeconds int `json:"progress_deadline_seconds" yaml:"progress_deadline_seconds"`
	// AutoRollback restores the previous version when the rollout fails (default true).
	AutoRollback bool `json:"auto_rollback" yaml:"auto_rollback"`
}

// DefaultUpdate is `service.update` when the YAML says nothing.
func DefaultUpdate() Update {
	return Update{Mode: UpdateRolling, MinHealthySeconds: DefaultMinHealthySeconds,
		ProgressDeadlineSeconds: DefaultProgressDeadlineSeconds, AutoRollback: true}
}

// Auth is `service.auth`: requests must carry one of the service's API keys, as
// "Authorization: Bearer KEY" (what OpenAI SDKs send) or "api-key: KEY" (Azure's SDKs).
type Auth struct {
	// KeysFromEnv names environment variables that hold keys: a task secret or env of that
	// name, else the environment `ferry serve up` runs in.
	KeysFromEnv []string `json:"keys_from_env,omitempty" yaml:"keys_from_env,omitempty"`
	// KeysFile is a file with one key per line (blank lines and # comments skipped), resolved
	// against the task file's directory and read by `ferry serve up`.
	KeysFile string `json:"keys_file,omitempty" yaml:"keys_file,omitempty"`
	// ManagedKeys accepts the controller's managed keys (`ferry keys create`) whose scope
	// allows the service, alone or beside the keys above.
	ManagedKeys bool `json:"managed_keys,omitempty" yaml:"managed_keys,omitempty"`
	// KeyHashes are HashAPIKey of every key, filled by Load. Only hashes leave the CLI: the
	// controller, its store and the proxy never hold a key. A service whose Auth has no hashes
	// rejects every request.
	KeyHashes []string `json:"key_hashes,omitempty" yaml:"-"`
}

// Limits is `service.limits`. Zero fields keep the proxy's defaults.
type Limits struct {
	// MaxRequestBodyMB is the largest request body accepted, in MiB (default 32); larger
	// requests get 413.
	MaxRequestBodyMB int `json:"max_request_body_mb,omitempty" yaml:"max_request_body_mb,omitempty"`
	// MaxConcurrentRequests caps requests in flight through the endpoint; beyond it requests
	// get 429 with Retry-After. Zero means no cap.
	MaxConcurrentRequests int `json:"max_concurrent_requests,omitempty" yaml:"max_concurrent_requests,omitempty"`
	// IdleTimeoutSeconds is how long a replica or client may stay silent mid-request before the
	// proxy gives up (default 300): a per-read deadline, so streams of any length live on.
	IdleTimeoutSeconds int `json:"idle_timeout_seconds,omitempty" yaml:"idle_timeout_seconds,omitempty"`
	// MaxQueuedRequests bounds requests held while the service has no READY replica (scaling from zero); beyond it they get 503. 0 = proxy default (1000); -1 disables holding.
	MaxQueuedRequests int `json:"max_queued_requests,omitempty" yaml:"max_queued_requests,omitempty"`
	// MaxQueueWaitSeconds bounds how long a held request waits for a replica; 0 = proxy default (300).
	MaxQueueWaitSeconds int `json:"max_queue_wait_seconds,omitempty" yaml:"max_queue_wait_seconds,omitempty"`
	// RateLimitPerKey admits each API key's requests (each client address's, when the service
	// has no auth) through a token bucket; beyond it they get 429 with Retry-After. Nil means
	// no rate limit.
	RateLimitPerKey *RateLimit `json:"rate_limit_per_key,omitempty" yaml:"rate_limit_per_key,omitempty"`
	// MaxConcurrentStreams caps streaming requests ("stream": true) in flight through the
	// endpoint; beyond it they get 429, while requests that do not stream are unaffected. Zero
	// means no cap.
	MaxConcurrentStreams int `json:"max_concurrent_streams,omitempty" yaml:"max_concurrent_streams,omitempty"`
	// MaxInFlightPerReplica caps the requests each proxy has in flight on one replica; beyond
	// it requests wait in the proxy (within max_queued_requests and max_queue_wait_seconds)
	// and go to the first replica that frees a slot. Zero (the default) caps each replica at
	// its engine's batch size, learned from its vLLM or TGI metrics, and sends a request that
	// cannot wait on to a replica anyway; a positive value is a fixed cap (503 for a request
	// that cannot wait); -1 turns late binding off.
	MaxInFlightPerReplica int `json:"max_in_flight_per_replica,omitempty" yaml:"max_in_flight_per_replica,omitempty"`
}

// RateLimit is a token bucket: Burst requests at once, refilled at RequestsPerSecond. A
// client that waited long enough may send Burst requests back to back, and a steady
// RequestsPerSecond after that.
// HealthCheck is `service.health_check`: how each proxy checks its replicas itself, to take a
// hung one out of rotation within about interval + timeout. Zero fields keep the proxy's
// defaults (GET /health every 0.5 s, 1 s timeout); any HTTP status counts as an answer.
type HealthCheck struct {
	Path            string  `json:"path,omitempty" yaml:"path,omitempty"`
	IntervalSeconds float64 `json:"interval_seconds,omitempty" yaml:"interval_seconds,omitempty"`
	TimeoutSeconds  float64 `json:"timeout_seconds,omitempty" yaml:"timeout_seconds,omitempty"`
	// Disabled turns the check off: replicas leave rotation only through the controller's
	// readiness probe.
	Disabled bool `json:"disabled,omitempty" yaml:"disabled,omitempty"`
}

type RateLimit struct {
	RequestsPerSecond float64 `json:"requests_per_second" yaml:"requests_per_second"`
	// Burst is the bucket's size; the default (filled in by Parse) is RequestsPerSecond
	// rounded up, at least 1: one second's worth.
	Burst int `json:"burst" yaml:"burst"`
}

// Probe is the readiness probe. Only HTTP 200 counts as ready.
type Probe struct {
	Path                string `json:"path" yaml:"path"`
	InitialDelaySeconds int    `json:"initial_delay_seconds" yaml:"initial_delay_seconds"`
	TimeoutSeconds      int    `json:"timeout_seconds" yaml:"timeout_seconds"`
	// PostData, when set, makes the probe a POST with this JSON body (already encoded).
	PostData string            `json:"post_data,omitempty" yaml:"post_data,omitempty"`
	Headers  map[string]string `json:"headers,omitempty" yaml:"headers,omitempty"`
}

// ReplicaPolicy is SkyServe's `replica_policy` with its defaults applied, plus Ferry's
// load-based autoscalers. SkyServe's fields get their defaults here; the concurrency and llm
// fields keep what the YAML said (0 = the autoscaler package's default), because that package
// owns those defaults.
type ReplicaPolicy struct {
	MinReplicas int `json:"min_replicas" yaml:"min_replicas"`
	MaxReplicas int `json:"max_replicas" yaml:"max_replicas"`
	// Autoscaler is the scaling policy: AutoscalerRequestRate, AutoscalerConcurrency or AutoscalerLLM; "" for a fixed replica count (min == max).
	Autoscaler string `json:"autoscaler,omitempty" yaml:"autoscaler,omitempty"`
	// TargetQPSPerReplica is 0 when unset. TargetQPSPerAccelerator is the map form. Any
	// autoscaler may have it: request_rate scales on it, instance_aware_least_load routes on it.
	TargetQPSPerReplica     float64            `json:"target_qps_per_replica,omitempty" yaml:"target_qps_per_replica,omitempty"`
	TargetQPSPerAccelerator map[string]float64 `json:"target_qps_per_accelerator,omitempty" yaml:"-"`
	NumOverprovision        int                `json:"num_overprovision" yaml:"num_overprovision"`
	// NumOverprovisionSet says the YAML named num_overprovision: concurrency and llm learn a
	// headroom only when it did not, so an explicit 0 means none.
	NumOverprovisionSet bool `json:"num_overprovision_set,omitempty" yaml:"-"`
	// UpscaleDelaySeconds and DownscaleDelaySeconds are SkyServe's hysteresis, read by
	// request_rate (defaults 300 and 1200). They are 0 under concurrency and llm, whose
	// windows take their place.
	UpscaleDelaySeconds          int    `json:"upscale_delay_seconds" yaml:"upscale_delay_seconds"`
	DownscaleDelaySeconds        int    `json:"downscale_delay_seconds" yaml:"downscale_delay_seconds"`
	BaseOndemandFallbackReplicas int    `json:"base_ondemand_fallback_replicas" yaml:"base_ondemand_fallback_replicas,omitempty"`
	DynamicOndemandFallback      bool   `json:"dynamic_ondemand_fallback" yaml:"dynamic_ondemand_fallback,omitempty"`
	SpotPlacer                   string `json:"spot_placer,omitempty" yaml:"spot_placer,omitempty"`

	// TargetInflightPerReplica: concurrency/llm target of in-flight requests per replica; 0 = autoscaler default.
	TargetInflightPerReplica float64 `json:"target_inflight_per_replica,omitempty" yaml:"target_inflight_per_replica,omitempty"`
	StableWindowSeconds      int     `json:"stable_window_seconds,omitempty" yaml:"stable_window_seconds,omitempty"`             // 0 = learned: 5 × the replicas' cold start, at least 60
	PanicWindowSeconds       int     `json:"panic_window_seconds,omitempty" yaml:"panic_window_seconds,omitempty"`               // 0 = default 6
	PanicThreshold           float64 `json:"panic_threshold,omitempty" yaml:"panic_threshold,omitempty"`                         // 0 = default 2.0 (ratio of desired to ready)
	MaxScaleUpRate           float64 `json:"max_scale_up_rate,omitempty" yaml:"max_scale_up_rate,omitempty"`                     // 0 = default 1000 (Knative): at most ready×rate per decision
	MaxScaleDownRate         float64 `json:"max_scale_down_rate,omitempty" yaml:"max_scale_down_rate,omitempty"`                 // 0 = default 2: at most ready/rate removed per decision
	ScaleToZeroGraceSeconds  int     `json:"scale_to_zero_grace_seconds,omitempty" yaml:"scale_to_zero_grace_seconds,omitempty"` // 0 = default 30; only with min_replicas 0
	TargetWaitingPerReplica  float64 `json:"target_waiting_per_replica,omitempty" yaml:"target_waiting_per_replica,omitempty"`   // llm only; 0 = default 1 (engine queue per replica)
	TargetKVCacheUsage       float64 `json:"target_kv_cache_usage,omitempty" yaml:"target_kv_cache_usage,omitempty"`             // llm only; 0 = default 0.8; in (0,1]
}

// TLS terminates HTTPS at the proxy.
type TLS struct {
	KeyFile  string `json:"keyfile" yaml:"keyfile"`
	CertFile string `json:"certfile" yaml:"certfile"`
}

// Load balancing policy names accepted in `load_balancing_policy`.
const (
	PolicyRoundRobin             = "round_robin"
	PolicyLeastLoad              = "least_load"
	PolicyInstanceAwareLeastLoad = "instance_aware_least_load"
	PolicyPowerOfTwo             = "power_of_two"
	PolicySessionAffinity        = "session_affinity"
	PolicyPrefixAffinity         = "prefix_affinity"
	PolicyLLMAware               = "llm_aware"
	PolicyLeastTTFT              = "least_ttft"
)

// Autoscaler names accepted in `replica_policy.autoscaler`.
const (
	// AutoscalerRequestRate is SkyServe's: queries per second over target_qps_per_replica,
	// with upscale and downscale delays.
	AutoscalerRequestRate = "request_rate"
	// AutoscalerConcurrency is Knative's KPA: in-flight requests per replica over stable and
	// panic windows.
	AutoscalerConcurrency = "concurrency"
	// AutoscalerLLM is the KPA's windows over a demand that also counts the engines' queues
	// and KV-cache use.
	AutoscalerLLM = "llm"
)

// DefaultAutoscaler is the autoscaler of a policy whose min and max differ and that names
// none and sets no target_qps_per_replica. It is the policy that wins `ferry sim`; the
// simulator work may change it.
const DefaultAutoscaler = AutoscalerConcurrency

// InfraLocal is the embedded default infra: replicas are processes on this machine.
const InfraLocal = "local"
