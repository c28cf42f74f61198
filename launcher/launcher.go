// Package launcher is Ferry's one provisioner, shared by services and jobs. A Provider starts,
// stops and lists instances on one infra; callers never learn which cloud API is behind one.
//
// It must not know about services or requests: a Spec is a program to run with labels on it.
// It is the contract between providers and their callers and nothing else: how a node gets its
// script and files is launcher/nodefiles, how a VM boots and reports launcher/vmnode, and
// neither is imported here.
package launcher

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferryserve/ferry/configs"
)

// Labels every instance Ferry makes carries, so that a restarted controller (or kubectl) can
// tell what an instance is without any other state.
const (
	LabelService   = "ferry.service"
	LabelVersion   = "ferry.version"
	LabelReplicaID = "ferry.replica-id"
	// LabelOwner marks instances made by Ferry at all.
	LabelOwner = "ferry.managed"
	// LabelJob is the job id on every node of a job; LabelAttempt counts its launches (1 first,
	// +1 per recovery or restart), so that a restarted controller tells the current gang from
	// the leftovers of an earlier one.
	LabelJob     = "ferry.job"
	LabelAttempt = "ferry.attempt"
)

// Spec is one instance to launch: what to run on it and how to recognise it later.
type Spec struct {
	// Name is unique among live instances, e.g. "chat-3".
	Name string
	// Cluster is what SkyPilot would call the instance's cluster (a service replica's
	// "<service>-<replica id>", a job's "<name>-<job id>"): SKYPILOT_CLUSTER_INFO's
	// cluster_name, which the provisioner sets with the placement (ClusterInfo).
	Cluster string
	Labels  map[string]string
	// Setup runs before Run, in the same shell environment.
	Setup string
	Run   string
	// Workdir is the task's local workdir (absolute), synced to ~/sky_workdir on the
	// instance, where setup and run start (launcher/nodefiles).
	Workdir string
	// GitWorkdir, when set, is a git repository the instance clones into its workdir at launch
	// (nodefiles.GitCloneShell), instead of a local directory synced there.
	GitWorkdir *configs.GitWorkdir
	// FileMounts maps remote paths to absolute local paths or s3:// and gs:// URLs
	// (launcher/nodefiles).
	FileMounts map[string]string
	// MountModes are the bucket mounts of FileMounts that are mounted, not copied
	// (nodefiles.MountScript): configs.ModeMount or configs.ModeMountCached by remote path.
	MountModes map[string]configs.MountMode
	// Envs includes secrets; providers must never log values.
	Envs map[string]string
	// SecretEnvs names the keys of Envs that are secrets, for infras that can keep them apart
	// (Kubernetes puts them in a Secret instead of the pod spec).
	SecretEnvs []string
	// Port is the port the program must serve on. A provider that cannot give every instance
	// the same port (local processes share one host) chooses another and reports it in
	// Instance.Endpoint and tells the program through FERRY_PORT.
	Port      int
	Resources configs.Resources
	// InstanceType is resources.instance_type: the one cloud instance type the task may run
	// on ("" lets the optimizer choose).
	InstanceType string
	// Placement is where the optimizer chose to put the instance; a provider launches exactly
	// there (zero fields mean the provider's default).
	Placement Placement
	// Spread, when not nil, asks the provisioner to spread spot instances over zones
	// (SpotHedge): it maps the caller's live spot instances (ids) to their ZoneKey, and zones
	// holding fewer are tried first.
	Spread map[string]string
	// SpreadFrom, with Spread, makes the launch a move out of that zone (a ZoneKey): the
	// instance goes only to a spot zone that is not blocked and holds at least two fewer of
	// the caller's spot instances than SpreadFrom (policy.SpreadTargets), and the launch fails
	// rather than land anywhere else. The replica manager asks for one when one zone holds
	// most of a service's spot replicas (policy.Crowded).
	SpreadFrom string
	// Job is set for a node of a job (nil for a service replica): what differs for a program
	// that is meant to end.
	Job *JobSpec
	// Kubernetes is the task's config.kubernetes (pod_config, custom_metadata,
	// provision_timeout), which the Kubernetes provider applies to its pods; other infras
	// ignore it. Nil when the task sets none.
	Kubernetes *configs.KubernetesTaskConfig
}

// JobSpec is what a job's node needs beyond a replica's.
type JobSpec struct {
	// Priority orders a provider's own scheduling where it has one (a Kubernetes
	// PriorityClass): services run at ServingPriority; a job at or above it is never preempted
	// for a service.
	Priority int
	// Preemptible says serving may take the node back: it then gets SIGTERM and Grace to
	// checkpoint before it is stopped.
	Preemptible bool
	// Grace is how long the program has between SIGTERM and SIGKILL when stopped by anyone.
	Grace time.Duration
	// CheckpointClaim names the job's checkpoint storage (CheckpointClaim(job)), which
	// survives recovery: a directory per claim on local, a PersistentVolumeClaim on
	// Kubernetes; clouds, see the provider. The provider tells the program where it is
	// through EnvCheckpointDir.
	CheckpointClaim string
	// CheckpointDir is where the claim appears inside a container or VM (its mount path),
	// for infras that mount it; local ignores it.
	CheckpointDir string
	// NodeIPs are the gang's addresses, rank 0 first, when they are known before launch (a
	// provider's own LaunchGang fixes them, e.g. local loopback addresses). Otherwise the
	// provider sets NodeIPsCommand.
	NodeIPs []string
	// NodeIPsCommand is a shell command that prints the gang's addresses one per line, rank 0
	// first, once every node exists, and fails (or prints nothing) before:
	// nodefiles.RenderScript waits for it before setup. Providers whose nodes learn their peers
	// only after launch (pod IPs, VM private IPs) set it: a downward-API file, the instance
	// metadata server.
	NodeIPsCommand string
}

// CheckpointClaim names a job's checkpoint storage on every infra (a PersistentVolumeClaim on
// Kubernetes, a directory on local): one per job, kept across its recoveries.
func CheckpointClaim(job string) string { return "ferry-job-" + job + "-checkpoint" }

// OwnedCapacity reports whether capacity on infra (an Instance's Infra) is Ferry's to hand
// from one workload to another: this machine and Kubernetes clusters are already paid for and
// bounded, so stopping a lower-priority job there makes room for a higher one; stopping a
// cloud's VM gives nothing back to Ferry.
func OwnedCapacity(infra string) bool {
	return infra == configs.InfraLocal || infra == "kubernetes" || strings.HasPrefix(infra, "kubernetes/")
}

// ServingPriority is the priority of service replicas where an infra schedules by priority.
// Jobs default below it (DefaultJobPriority), so serving wins unless a job says otherwise.
const (
	ServingPriority    = 1000
	DefaultJobPriority = 500
)

// ExitSetupFailed is the exit status a job's node reports when its setup failed (the setup's
// own status is in the log line before it): it tells FAILED_SETUP from a failing run. A run
// that exits with it is taken for a setup failure; the number is unusual enough to be rare.
const ExitSetupFailed = 223

// ZoneKey names a zone across infras for spreading and blocking: "aws/use1-az4",
// "gcp/us-central1-a"; the region where an infra has no zones, the infra alone where it has
// neither.
func ZoneKey(infra, region, zone string) string {
	switch {
	case zone != "":
		return infra + "/" + zone
	case region != "":
		return infra + "/" + region
	}
	return infra
}

// Placement is one concrete location and shape: the optimizer's pick among candidates.
type Placement struct {
	// Infra is the canonical infra: "local", "kubernetes/CONTEXT", "aws", "gcp".
	Infra        string `json:"infra"`
	Region       string `json:"region,omitempty"`
	Zone         string `json:"zone,omitempty"`
	InstanceType string `json:"instance_type,omitempty"`
	Accelerator  string `json:"accelerator,omitempty"`
	// AcceleratorCount is per instance (0.5 is a fractional GPU where an infra supports it).
	AcceleratorCount float64 `json:"accelerator_count,omitempty"`
	VCPUs            float64 `json:"vcpus,omitempty"`
	MemoryGiB        float64 `json:"memory_gib,omitempty"`
	Spot             bool    `json:"spot,omitempty"`
	PricePerHour     float64 `json:"price_per_hour"`
	// Nodes is the gang this placement launches when the task offers gang shapes (an
	// alternative's num_nodes: 8 nodes × 1 GPU against 1 × 8); 0 is the task's num_nodes.
	// PricePerHour stays per node.
	Nodes int `json:"nodes,omitempty"`
	// Reservation, Queued and the window are where the capacity comes from (capacity.go):
	// the reservation or block id to launch into ("" none), whether to wait in the cloud's
	// queue, and the reservation's window (zero: none; the nodes end at WindowEnd).
	Reservation string    `json:"reservation,omitempty"`
	Queued      bool      `json:"queued,omitempty"`
	WindowStart time.Time `json:"window_start,omitzero"`
	WindowEnd   time.Time `json:"window_end,omitzero"`
}

// State is an instance's state as its infra reports it.
type State string

// Instance states.
const (
	StatePending    State = "PENDING"
	StateRunning    State = "RUNNING"
	StateTerminated State = "TERMINATED"
	StatePreempted  State = "PREEMPTED"
)

// Instance is one launched machine, pod or process.
type Instance struct {
	ID     string            `json:"id"`
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
	// Endpoint is host:port where the program's service port is reachable from the proxy.
	Endpoint     string  `json:"endpoint"`
	Infra        string  `json:"infra"`
	Region       string  `json:"region,omitempty"`
	Zone         string  `json:"zone,omitempty"`
	Spot         bool    `json:"spot"`
	PricePerHour float64 `json:"price_per_hour"`
	// Accelerator is the GPU type the instance was placed with ("" when none or unknown):
	// instance-aware routing and autoscaling weigh a replica by it.
	Accelerator string    `json:"accelerator,omitempty"`
	State       State     `json:"state"`
	LaunchedAt  time.Time `json:"launched_at"`
	// Reason says why an instance ended (exit status, preemption notice), when known.
	Reason string `json:"reason,omitempty"`
	// ExitCode is the program's exit status once it ended by itself (State Terminated);
	// nil while it runs, or when it was stopped, lost or preempted rather than exiting.
	ExitCode *int `json:"exit_code,omitempty"`
	// IP is the address other nodes of a gang reach this one at (a private IP, a pod IP, a
	// loopback address on local); "" until known.
	IP string `json:"ip,omitempty"`
	// WindowEnd is when the reservation or capacity block the instance runs in ends, and the
	// instance with it (zero: none); the provisioner fills it from the placement, a provider's
	// List reports it where it can (capacity.go).
	WindowEnd time.Time `json:"window_end,omitzero"`
}

// Exited reports whether the instance's program ended by itself, and with which status.
func (i Instance) Exited() (int, bool) {
	if i.ExitCode == nil {
		return 0, false
	}
	return *i.ExitCode, true
}

// Provider is the one interface every infra implements. Extra abilities (spot notices, logs,
// queued provisioning) are optional interfaces found by type assertion.
type Provider interface {
	// Launch starts one instance and returns once it exists (not once it is ready).
	Launch(ctx context.Context, spec Spec) (Instance, error)
	// Terminate stops an instance and everything it started. Terminating an instance that is
	// already gone is not an error.
	Terminate(ctx context.Context, id string) error
	// List returns the instances whose labels include every key/value of selector, including
	// ones launched by an earlier controller process. Ended instances may be reported with
	// StateTerminated or StatePreempted until terminated.
	List(ctx context.Context, selector map[string]string) ([]Instance, error)
}

// Offering is one shape an infra can run, with what it costs: a Kubernetes cluster reports one
// per GPU product its nodes carry, a cloud one per catalog row.
type Offering struct {
	InstanceType string `json:"instance_type,omitempty"`
	Accelerator  string `json:"accelerator,omitempty"`
	// AcceleratorCount is the most one instance can have (GPUs on the largest node).
	AcceleratorCount float64 `json:"accelerator_count,omitempty"`
	VCPUs            float64 `json:"vcpus,omitempty"`
	MemoryGiB        float64 `json:"memory_gib,omitempty"`
	Region           string  `json:"region,omitempty"`
	Zone             string  `json:"zone,omitempty"`
	PricePerHour     float64 `json:"price_per_hour"`
	SpotPricePerHour float64 `json:"spot_price_per_hour,omitempty"`
	// Total and Free count accelerators across the infra, where it knows them (-1 unknown).
	Total int `json:"total"`
	Free  int `json:"free"`
	// SharesGPU is set when some node with this accelerator shares GPUs (HAMi), so a
	// fractional or memory/cores request (configs.Resources.SharedGPU) fits here.
	SharesGPU bool `json:"shares_gpu,omitempty"`
	// Reservation is set for capacity already reserved (paid for whether used or not);
	// QueueWait for capacity reached through the cloud's queue: its expected wait (capacity.go).
	Reservation *ReservationOffer `json:"reservation,omitempty"`
	QueueWait   time.Duration     `json:"queue_wait,omitempty"`
}

// Offerer is an optional Provider capability for infras whose shapes are not in the catalog
// (Kubernetes: what its nodes carry).
type Offerer interface {
	Offerings(ctx context.Context) ([]Offering, error)
}

// Checker is an optional Provider capability: whether the infra is usable now (credentials,
// reachability), for `ferry check`. A nil error means usable.
type Checker interface {
	Check(ctx context.Context) error
}

// LogSource is an optional Provider capability: where an instance's output can be read.
type LogSource interface {
	// LogPath returns a local file holding the instance's stdout and stderr.
	LogPath(id string) (string, error)
}

// LogStreamer is an optional Provider capability for infras that keep an instance's output
// where only their API reads it (a pod's log through the API server, a VM's console output).
type LogStreamer interface {
	// StreamLogs writes the instance's output to w: the last opts.Tail lines (all when
	// negative), then with opts.Follow what follows until the instance ends or ctx ends.
	StreamLogs(ctx context.Context, id string, opts LogOptions, w io.Writer) error
}

// JobCleaner is an optional Provider capability: release what a job held beyond its
// instances (its checkpoint PersistentVolumeClaim) once the job has ended for good. job is the
// LabelJob value; cleaning a job that holds nothing is not an error.
type JobCleaner interface {
	CleanupJob(ctx context.Context, job string) error
}

// LogOptions select what StreamLogs writes.
type LogOptions struct {
	Tail   int
	Follow bool
	// Opened, when set, is called once the output is open: from then on what the instance
	// printed reaches w even if the instance is stopped now. Whoever stops an instance whose
	// infra drops its output with it (a deleted pod, a deleted GCE VM) waits for Opened first,
	// or the stop can win the race and take the whole log.
	Opened func()
	// Stalled, when set, is called each time a followed read fails for the infra's own
	// reasons (unavailable, throttled) and the stream goes on, reading less often until the
	// infra answers. Whoever waits for a stopped instance's last output stops waiting then:
	// the infra cannot say when that output is complete (jobs' stop keeps what it read).
	Stalled func(error)
}

// NotifyOpened calls o.Opened if set.
func (o LogOptions) NotifyOpened() {
	if o.Opened != nil {
		o.Opened()
	}
}

// NotifyStalled calls o.Stalled with err if set.
func (o LogOptions) NotifyStalled(err error) {
	if o.Stalled != nil {
		o.Stalled(err)
	}
}

// LogHinter is an optional Provider capability for infras that keep an instance's output
// where Ferry does not read it yet: the command a user runs to read it.
type LogHinter interface {
	LogHint(id string) string
}

// Typed errors callers act on: capacity and quota fail over to another location, unauthorised
// and invalid stop the launch, preempted is replaced. Wrap them with %w.
var (
	ErrNoCapacity   = errors.New("no capacity")
	ErrQuota        = errors.New("quota exceeded")
	ErrUnauthorized = errors.New("unauthorized")
	ErrInvalid      = errors.New("invalid request")
	ErrPreempted    = errors.New("preempted")
	ErrNotFound     = errors.New("instance not found")
	// ErrQueued says the launch is waiting in the cloud's queue or for a reservation's window
	// (QueuedError): not a failure, the caller keeps the task pending (capacity.go).
	ErrQueued = errors.New("waiting for capacity")
	// ErrCapacityRefused marks a failed launch that every location it tried refused for
	// capacity or quota, with none down, throttled or failing otherwise: the caller's
	// instances in those places are as many as they hold now (replicas' spare reads it). It
	// is found with errors.Is beside ErrNoCapacity, not in the message.
	ErrCapacityRefused = errors.New("every location tried refused for capacity")
)

// CapacityRefused marks err (which wraps ErrNoCapacity) with ErrCapacityRefused, its message
// unchanged.
func CapacityRefused(err error) error { return capacityRefused{err} }

type capacityRefused struct{ error }

func (e capacityRefused) Unwrap() error        { return e.error }
func (e capacityRefused) Is(target error) bool { return target == ErrCapacityRefused }

// IsRetryable reports whether a launch error is about the location (capacity, quota,
// preemption) so the next candidate may succeed, rather than about the request itself.
func IsRetryable(err error) bool {
	return errors.Is(err, ErrNoCapacity) || errors.Is(err, ErrQuota) || errors.Is(err, ErrPreempted)
}

// Matches reports whether labels include every key/value of selector.
func Matches(labels, selector map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// GangLauncher is an optional Provider capability: launch n instances that come up together
// or not at all, natively (a placement group, a Kueue workload). Providers without it get
// LaunchGang's launch-all-then-roll-back.
type GangLauncher interface {
	LaunchGang(ctx context.Context, spec Spec, n int) ([]Instance, error)
}

// PreemptionNotifier is an optional Provider capability: notices that an instance will be
// taken away soon (a spot interruption warning), so a replacement can start before it goes.
type PreemptionNotifier interface {
	// Notices delivers instance ids with the time they will be reclaimed, until ctx ends.
	Notices(ctx context.Context) <-chan Notice
}

// Notice is one advance warning of a preemption.
type Notice struct {
	InstanceID string
	At         time.Time
}

// GangName is the name of node rank of a gang launched from spec: "NAME-RANK". Rank 0 keeps
// the plain name when the gang has one node, so a single-node task reads as before.
func GangName(name string, rank, n int) string {
	if n == 1 {
		return name
	}
	return name + "-" + strconv.Itoa(rank)
}

// Environment variables every node of a gang gets, with SkyPilot's names so multi-node
// programs (torchrun, deepspeed) written for SkyPilot work unchanged.
const (
	EnvNodeRank = "SKYPILOT_NODE_RANK"
	EnvNumNodes = "SKYPILOT_NUM_NODES"
	// EnvNodeIPs lists the gang's addresses, one per line, rank 0 first.
	EnvNodeIPs        = "SKYPILOT_NODE_IPS"
	EnvNumGPUsPerNode = "SKYPILOT_NUM_GPUS_PER_NODE"
	EnvTaskID         = "SKYPILOT_TASK_ID"
	// EnvClusterInfo is SkyPilot's JSON of where the task runs: ClusterInfo.
	EnvClusterInfo     = "SKYPILOT_CLUSTER_INFO"
	EnvSetupNodeRank   = "SKYPILOT_SETUP_NODE_RANK"
	EnvSetupNodeIPs    = "SKYPILOT_SETUP_NODE_IPS"
	EnvCheckpointDir   = "FERRY_CHECKPOINT_DIR"
	EnvPreemptionGrace = "FERRY_PREEMPTION_GRACE_SECONDS"
	// LabelNodeRank is the node's rank among its gang.
	LabelNodeRank = "ferry.node-rank"
)

// GangPreparer is an optional Provider capability for infras that can fix a gang's
// addresses before launching it (local: a loopback address per node), so that every node
// finds its peers in its environment (JobSpec.NodeIPs) and needs no NodeIPsCommand.
type GangPreparer interface {
	PrepareGang(spec Spec, n int) (Spec, error)
}

// LaunchGang launches n instances of spec, all or none: the provider's own GangLauncher when
// it has one, else n concurrent Launch calls (after PrepareGang where the provider has it),
// terminating every launched instance if any fails. Each node gets its rank in its labels and
// environment.
func LaunchGang(ctx context.Context, p Provider, spec Spec, n int) ([]Instance, error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: a gang needs at least one node, got %d", ErrInvalid, n)
	}
	if g, ok := p.(GangLauncher); ok {
		return g.LaunchGang(ctx, spec, n)
	}
	if g, ok := p.(GangPreparer); ok {
		prepared, err := g.PrepareGang(spec, n)
		if err != nil {
			return nil, err
		}
		spec = prepared
	}
	return LaunchEach(ctx, p, spec, n)
}

// LaunchEach is the all-or-nothing gang for providers with no native gang: n concurrent
// Launch calls (none cancelled when another fails, so that the rollback sees every instance
// made), then, if any failed, every launched instance terminated and the first node's error
// returned (its type decides failover). A provider's own LaunchGang may call it after fixing
// the placement (one zone).
func LaunchEach(ctx context.Context, p Provider, spec Spec, n int) ([]Instance, error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: a gang needs at least one node, got %d", ErrInvalid, n)
	}
	out := make([]Instance, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for rank := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[rank], errs[rank] = p.Launch(ctx, GangNode(spec, rank, n))
		}()
	}
	wg.Wait()
	err := errors.Join(errs...)
	if err == nil {
		return out, nil
	}
	// Roll back: a partial gang would hold capacity and never run. Terminate outlives ctx,
	// which may be what failed.
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), gangCleanupTimeout)
	defer cancel()
	var left []error
	for rank, inst := range out {
		if errs[rank] == nil {
			if terr := p.Terminate(cleanup, inst.ID); terr != nil {
				left = append(left, fmt.Errorf("terminate %s: %w", inst.ID, terr))
			}
		}
	}
	if len(left) > 0 {
		return nil, fmt.Errorf("gang of %d failed: %w; cleanup: %w", n, firstError(errs), errors.Join(left...))
	}
	return nil, fmt.Errorf("gang of %d failed: %w", n, firstError(errs))
}

// gangCleanupTimeout bounds rolling back a failed gang.
const gangCleanupTimeout = 2 * time.Minute

// GangNode is spec for node rank of an n-node gang: its name (GangName), its rank in the
// LabelNodeRank label, and EnvNodeRank / EnvNumNodes in its environment.
func GangNode(spec Spec, rank, n int) Spec {
	s := spec
	s.Name = GangName(spec.Name, rank, n)
	s.Labels = make(map[string]string, len(spec.Labels)+1)
	for k, v := range spec.Labels {
		s.Labels[k] = v
	}
	s.Labels[LabelNodeRank] = strconv.Itoa(rank)
	s.Envs = make(map[string]string, len(spec.Envs)+2)
	for k, v := range spec.Envs {
		s.Envs[k] = v
	}
	s.Envs[EnvNodeRank] = strconv.Itoa(rank)
	s.Envs[EnvSetupNodeRank] = strconv.Itoa(rank)
	s.Envs[EnvNumNodes] = strconv.Itoa(n)
	if spec.Job != nil && len(spec.Job.NodeIPs) > 0 {
		ips := strings.Join(spec.Job.NodeIPs, "\n")
		s.Envs[EnvNodeIPs], s.Envs[EnvSetupNodeIPs] = ips, ips
	}
	return s
}

// firstError is the first non-nil error, keeping its type for errors.Is (capacity errors
// decide failover).
func firstError(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// PollNotices serves PreemptionNotifier for infras without a watch API: it calls poll at once
// and then every interval until ctx ends or poll returns false, and returns the channel poll
// sends on, closed at the end.
func PollNotices(ctx context.Context, interval time.Duration, poll func(ctx context.Context, ch chan<- Notice) bool) <-chan Notice {
	ch := make(chan Notice, 16)
	go func() {
		defer close(ch)
		t := time.NewTicker(interval)
		defer t.Stop()
		for poll(ctx, ch) {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return ch
}

// ClusterInfo is SKYPILOT_CLUSTER_INFO for spec at placement pl, as SkyPilot writes it:
// {"cluster_name", "cloud", "region", "zone"}, cloud as SkyPilot names it ("AWS", "GCP",
// "Kubernetes"; "Local" for Ferry's own), a missing region or zone null. Programs read it with
// `jq .region` or json.loads.
func ClusterInfo(spec Spec, pl Placement) string {
	kind, _, _ := strings.Cut(pl.Infra, "/")
	cloud := map[string]string{"aws": "AWS", "gcp": "GCP", "kubernetes": "Kubernetes", "local": "Local"}[kind]
	if cloud == "" {
		cloud = kind
	}
	orNull := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	region := pl.Region
	if kind == "kubernetes" && region == "" {
		_, region, _ = strings.Cut(pl.Infra, "/") // SkyPilot's region on Kubernetes is the context
	}
	b, _ := json.Marshal(struct {
		ClusterName string  `json:"cluster_name"`
		Cloud       string  `json:"cloud"`
		Region      *string `json:"region"`
		Zone        *string `json:"zone"`
	}{cmp.Or(spec.Cluster, spec.Name), cloud, orNull(region), orNull(pl.Zone)})
	return string(b)
}

// SetDefault sets *v to def when it is unset: the zero value, or a negative number (a timeout,
// interval or count below zero means nothing). It is how the providers' and the replica
// manager's options take their defaults, one line each.
func SetDefault[T cmp.Ordered](v *T, def T) {
	var zero T
	if *v <= zero {
		*v = def
	}
}
