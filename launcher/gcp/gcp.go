// Package gcp is the launcher.Provider for Google Compute Engine: one VM per instance, on-demand
// or Spot, through the real cloud.google.com/go/compute REST clients.
//
// A VM is bootstrapped by its startup-script metadata (no SSH): the script exports the spec's
// environment, FERRY_PORT and FERRY_HOST, then runs setup and run. VMs carry Ferry's labels
// (mapped to GCP's label alphabet, see labels.go), so a restarted controller adopts them by
// label. GPUs come built into a2/a3/g2 machine types, or are attached to n1 machine types as
// guestAccelerators (the catalog composes "n1-standard-8 + T4" rows); both must terminate on
// host maintenance. Capacity, quota and unsupported-configuration failures, whether reported
// as HTTP errors or as failed operations, become launcher.ErrNoCapacity, ErrQuota and
// ErrInvalid so the provisioner fails over.
//
// The service port admits the proxies only: an allow rule for them and a deny rule for the
// rest, both for the VMs tagged ferry-port-PORT; List narrows the rules Ferry made before for
// VMs an earlier controller launched (firewall.go).
//
// A job's node (Spec.Job) boots the same way but is meant to end: it learns its gang's
// addresses from a metadata attribute set after insert, hears preemption notices from its
// metadata server, and marks its exit status on the serial console before it powers off;
// List reports it as Instance.ExitCode, StreamLogs serves serial port 1 (job.go, logs.go).
// LaunchGang puts a gang in one zone (gang.go).
//
// Instance ids are "gcp/ZONE/NAME".
package gcp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/google/uuid"
	"go.uber.org/zap"
	"golang.org/x/oauth2"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/buckets"
	"github.com/ferryserve/ferry/launcher/catalog"
	"github.com/ferryserve/ferry/launcher/nodefiles"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

// InfraName is the provider's infra and the prefix of its instance ids.
const InfraName = "gcp"

// Defaults for Options.
const (
	// DefaultNetwork is the VPC network VMs join and the firewall rule applies to.
	DefaultNetwork = "default"
	// DefaultImage boots VMs without GPUs (bash is all the startup script needs).
	DefaultImage = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
	// DefaultGPUImage boots GPU VMs: a Deep Learning VM image, whose boot installs the NVIDIA
	// driver when the metadata asks (install-nvidia-driver=True, which the provider sets).
	DefaultGPUImage = "projects/deeplearning-platform-release/global/images/family/common-cu124-ubuntu-2204-py310"
	// DefaultMachineType is used when a placement names none.
	DefaultMachineType = "n1-standard-4"
	// DefaultDiskSizeGB is the boot disk when the task sets no disk_size.
	DefaultDiskSizeGB = 256
	// DefaultPort is the service port when the spec gives none.
	DefaultPort = 8080
	// DefaultLaunchTimeout bounds a launch: the insert operation and the wait for RUNNING.
	DefaultLaunchTimeout = 10 * time.Minute
	// DefaultPollInterval is how often a launch reads the VM while waiting for RUNNING.
	DefaultPollInterval = 2 * time.Second
	// DefaultNoticeInterval is how often the preemption watcher lists preempted operations.
	// GCP gives a Spot VM 30 seconds between the preemption notice and the stop, and tells
	// only the VM itself (metadata server); from outside, the compute.instances.preempted
	// operation appears when the preemption starts, so a notice is at most this late.
	DefaultNoticeInterval = 10 * time.Second
	// DefaultNoticeLookback is how old a preemption may be and still be noticed by a watcher
	// that has just started.
	DefaultNoticeLookback = time.Minute
	// networkTag marks Ferry's VMs; the firewall rule for a port targets "ferry-port-PORT".
	networkTag      = "ferry"
	cleanupTimeout  = 2 * time.Minute
	maxOpWaits      = 64 // operations.wait returns after at most 2 minutes each
	metaPort        = "ferry-port"
	metaPrice       = "ferry-price-per-hour"
	metaStartup     = "startup-script"
	preemptedOpType = "compute.instances.preempted"
)

// Options configures a Provider for one project.
type Options struct {
	// Project is the GCP project id. Required.
	Project string
	// Zones and Regions bound where the provider launches and lists. A zone is allowed when
	// it is in Zones, or in one of Regions (the catalog's zones of the region). Both empty
	// allows every GCP zone in the catalog.
	Zones   []string
	Regions []string
	// Endpoint overrides the Compute API endpoint ("http://127.0.0.1:PORT" for the fake, or a
	// compatible cloud). With an Endpoint and no Token, requests carry no credentials.
	Endpoint string
	// Token is a static OAuth2 access token. Empty uses Application Default Credentials
	// (GOOGLE_APPLICATION_CREDENTIALS, gcloud's ADC file, the metadata server) unless Endpoint
	// is set.
	Token string
	// ClientOptions are added to every client (after the ones above).
	ClientOptions []option.ClientOption
	// Network is the VPC network; default DefaultNetwork.
	Network string
	// Image boots VMs when a task sets no image_id; default DefaultImage, or DefaultGPUImage
	// for VMs with GPUs. GPUImage overrides the latter.
	Image    string
	GPUImage string
	// PublicIP gives each VM an ephemeral external address and reports it as the endpoint,
	// for a controller outside the VPC. Without it the endpoint is the internal address.
	PublicIP bool
	// IngressCIDRs and IngressTags (network tags of VMs in the network) are all that may reach
	// the service port: the controller and its attached proxies. With neither, the controller
	// alone, at the address its host sends from to each replica (see firewall.go); with
	// PublicIP that is usually a NAT's, so list the public addresses here.
	IngressCIDRs []string
	IngressTags  []string
	// CheckpointNFS is an NFSv4 share ("server:/export", a Filestore instance) that job nodes
	// mount for their checkpoints, so that a recovery in reach of it resumes
	// (vmnode.CheckpointShell); empty keeps checkpoints on each VM's disk.
	CheckpointNFS string
	// Buckets lists the s3:// and gs:// sources of file_mounts and makes their download URLs;
	// nil is buckets.New with the controller's own credentials.
	Buckets nodefiles.Buckets
	// SkipFirewall leaves firewall rules to the operator (no compute.firewalls permission).
	SkipFirewall bool
	// LaunchTimeout, PollInterval, NoticeInterval and NoticeLookback: see the Default* constants.
	LaunchTimeout  time.Duration
	PollInterval   time.Duration
	NoticeInterval time.Duration
	NoticeLookback time.Duration
	// LogInterval is how often StreamLogs reads a followed serial port; default
	// DefaultLogInterval.
	LogInterval time.Duration
	// RequestTimeout cuts each HTTP request to the API that has not been answered by then
	// (default DefaultRequestTimeout), even inside a long call such as Launch: a hung endpoint
	// fails a call with launcher.ErrUnavailable instead of holding it (transport.go).
	// MaxAttempts bounds the SDK's retries of a call it retries (default DefaultMaxAttempts).
	RequestTimeout time.Duration
	MaxAttempts    int
	Logger         *zap.Logger
}

// Provider launches Compute Engine VMs in one project. It is safe for concurrent use.
type Provider struct {
	opts      Options
	log       *zap.Logger
	instances *compute.InstancesClient
	zoneOps   *compute.ZoneOperationsClient
	globalOps *compute.GlobalOperationsClient
	firewalls *compute.FirewallsClient
	// capacityClients list and read reservations (reservations.go).
	capacityClients

	mu            sync.Mutex
	allowed       map[string]bool // nil: every zone
	launchedZones map[string]bool // zones launched into, listed even when not configured

	// ingressCIDRs are Options.IngressCIDRs in canonical form.
	ingressCIDRs []string
	// routeSource is launcher.RouteSource; tests replace it.
	routeSource func(ip string) (netip.Prefix, error)
	// exits caches the exit status stopped job nodes marked, by "zone/name/id".
	exits *vmnode.ExitCodes
	// fwMu serialises changes to the firewall rules; it is never held with mu.
	fwMu sync.Mutex
	fw   firewallState
	// adoption: the ports of adopted VMs whose firewall rules List has set (firewall.go).
	adoption launcher.IngressAdoption
}

var (
	_ launcher.Provider           = (*Provider)(nil)
	_ launcher.Checker            = (*Provider)(nil)
	_ launcher.PreemptionNotifier = (*Provider)(nil)
	_ launcher.GangLauncher       = (*Provider)(nil)
	_ launcher.LogStreamer        = (*Provider)(nil)
)

// New creates the REST clients. With ADC it resolves credentials now (an error here wraps
// launcher.ErrUnauthorized) but makes no API call.
func New(ctx context.Context, opts Options) (*Provider, error) {
	if opts.Project == "" {
		return nil, fmt.Errorf("gcp: %w: no project", launcher.ErrInvalid)
	}
	launcher.SetDefault(&opts.Network, DefaultNetwork)
	launcher.SetDefault(&opts.Image, DefaultImage)
	launcher.SetDefault(&opts.GPUImage, DefaultGPUImage)
	cidrs, err := checkIngress(opts)
	if err != nil {
		return nil, err
	}
	launcher.SetDefault(&opts.LaunchTimeout, DefaultLaunchTimeout)
	launcher.SetDefault(&opts.PollInterval, DefaultPollInterval)
	launcher.SetDefault(&opts.NoticeInterval, DefaultNoticeInterval)
	launcher.SetDefault(&opts.NoticeLookback, DefaultNoticeLookback)
	launcher.SetDefault(&opts.LogInterval, DefaultLogInterval)
	launcher.SetDefault(&opts.RequestTimeout, DefaultRequestTimeout)
	launcher.SetDefault(&opts.MaxAttempts, DefaultMaxAttempts)
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	var copts []option.ClientOption
	if opts.Endpoint != "" {
		copts = append(copts, option.WithEndpoint(opts.Endpoint))
	}
	switch {
	case opts.Token != "":
		copts = append(copts, option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: opts.Token, TokenType: "Bearer"})))
	case opts.Endpoint != "":
		copts = append(copts, option.WithoutAuthentication())
	}
	copts = append(copts, option.WithUserAgent("ferry"))
	copts = append(copts, opts.ClientOptions...)
	if opts.Buckets == nil {
		var gcs []option.ClientOption
		if opts.Token != "" {
			gcs = append(gcs, option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: opts.Token, TokenType: "Bearer"})))
		}
		opts.Buckets = buckets.New(buckets.Options{GCSOptions: gcs})
	}

	hc, err := newHTTPClient(ctx, copts, opts.RequestTimeout)
	if err != nil {
		return nil, fmt.Errorf("gcp: %w: http client: %w", launcher.ErrUnauthorized, err)
	}
	copts = append(copts, option.WithHTTPClient(hc))

	p := &Provider{opts: opts, log: opts.Logger.With(zap.String("infra", InfraName), zap.String("project", opts.Project)),
		launchedZones: map[string]bool{}, ingressCIDRs: cidrs, routeSource: launcher.RouteSource,
		exits: vmnode.NewExitCodes(exitRetry),
		fw:    firewallState{settled: map[int]bool{}, denied: map[int]bool{}, admitted: map[string]bool{}}}
	p.allowed = allowedZones(opts.Zones, opts.Regions)
	if opts.PublicIP && !p.configured() && !opts.SkipFirewall {
		p.log.Warn("replicas get public addresses but no proxy source is configured: the controller is admitted at its own address, which a NAT usually hides; set gcp.proxy_cidrs")
	}
	if p.instances, err = compute.NewInstancesRESTClient(ctx, copts...); err != nil {
		return nil, fmt.Errorf("gcp: %w: instances client: %w", launcher.ErrUnauthorized, err)
	}
	if p.zoneOps, err = compute.NewZoneOperationsRESTClient(ctx, copts...); err != nil {
		p.Close()
		return nil, fmt.Errorf("gcp: %w: zone operations client: %w", launcher.ErrUnauthorized, err)
	}
	if p.globalOps, err = compute.NewGlobalOperationsRESTClient(ctx, copts...); err != nil {
		p.Close()
		return nil, fmt.Errorf("gcp: %w: global operations client: %w", launcher.ErrUnauthorized, err)
	}
	if p.firewalls, err = compute.NewFirewallsRESTClient(ctx, copts...); err != nil {
		p.Close()
		return nil, fmt.Errorf("gcp: %w: firewalls client: %w", launcher.ErrUnauthorized, err)
	}
	if err = p.newCapacityClients(ctx, copts); err != nil {
		p.Close()
		return nil, err
	}
	for _, callOptions := range []any{p.instances.CallOptions, p.zoneOps.CallOptions, p.globalOps.CallOptions,
		p.firewalls.CallOptions, p.reservations.CallOptions, p.futureRes.CallOptions} {
		boundRetries(callOptions, opts.MaxAttempts)
	}
	return p, nil
}

// allowedZones is the set of zones named or in the named regions; nil when both are empty.
func allowedZones(zones, regions []string) map[string]bool {
	if len(zones) == 0 && len(regions) == 0 {
		return nil
	}
	set := map[string]bool{}
	for _, z := range zones {
		set[z] = true
	}
	for _, r := range regions {
		for _, z := range catalogZones() {
			if regionOf(z) == r {
				set[z] = true
			}
		}
	}
	return set
}

// catalogZones are the GCP zones the price catalog has rows for.
func catalogZones() []string {
	seen := map[string]bool{}
	for _, r := range catalog.Default().Rows() {
		if r.Cloud == catalog.GCP && r.Zone != "" {
			seen[r.Zone] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// Close releases the clients' connections.
func (p *Provider) Close() {
	if p.instances != nil {
		_ = p.instances.Close()
	}
	if p.zoneOps != nil {
		_ = p.zoneOps.Close()
	}
	if p.globalOps != nil {
		_ = p.globalOps.Close()
	}
	if p.firewalls != nil {
		_ = p.firewalls.Close()
	}
	p.capacityClients.close()
}

// Infra is "gcp".
func (p *Provider) Infra() string { return InfraName }

func regionOf(zone string) string {
	if i := strings.LastIndexByte(zone, '-'); i > 0 {
		return zone[:i]
	}
	return zone
}

// zoneAllowed reports whether the options admit zone.
func (p *Provider) zoneAllowed(zone string) bool {
	if p.allowed == nil {
		return true
	}
	return p.allowed[zone] || slices.Contains(p.opts.Regions, regionOf(zone))
}

// listZones are the zones List and the preemption watcher read: the allowed ones (every
// catalog zone when unrestricted) and any zone this provider launched into.
func (p *Provider) listZones() []string {
	set := map[string]bool{}
	if p.allowed == nil {
		for _, z := range catalogZones() {
			set[z] = true
		}
	}
	for z, ok := range p.allowed {
		if ok {
			set[z] = true
		}
	}
	p.mu.Lock()
	for z := range p.launchedZones {
		set[z] = true
	}
	p.mu.Unlock()
	return slices.Sorted(maps.Keys(set))
}

// zoneFor picks the placement's zone, else the first allowed zone of its region, else the
// first allowed zone.
func (p *Provider) zoneFor(pl launcher.Placement) (string, error) {
	if pl.Zone != "" {
		if pl.Region != "" && regionOf(pl.Zone) != pl.Region {
			return "", fmt.Errorf("gcp: %w: zone %s is not in region %s", launcher.ErrInvalid, pl.Zone, pl.Region)
		}
		if !p.zoneAllowed(pl.Zone) {
			return "", fmt.Errorf("gcp: %w: zone %s is not among the allowed zones and regions", launcher.ErrInvalid, pl.Zone)
		}
		return pl.Zone, nil
	}
	for _, z := range p.listZones() {
		if pl.Region == "" || regionOf(z) == pl.Region {
			return z, nil
		}
	}
	return "", fmt.Errorf("gcp: %w: no allowed zone in region %q", launcher.ErrInvalid, pl.Region)
}

// Check asks every zone List reads whether it answers (listing one VM at most), all at once.
// Its error names each zone that failed, so that `ferry check` shows which part of GCP is down:
// it wraps a *launcher.PartialListError whose gaps carry each zone's classified error
// (errors.Is finds launcher.ErrUnavailable, ErrThrottled, ErrUnauthorized, or ErrNotFound for a
// zone that does not exist).
func (p *Provider) Check(ctx context.Context) error {
	zones := p.listZones()
	if len(zones) == 0 {
		return fmt.Errorf("gcp: %w: no zone allowed", launcher.ErrInvalid)
	}
	_, gaps := eachZone(ctx, zones, func(ctx context.Context, zone string) (struct{}, error) {
		it := p.instances.List(ctx, &computepb.ListInstancesRequest{Project: p.opts.Project, Zone: zone, MaxResults: proto.Uint32(1)})
		if _, err := it.Next(); err != nil && !errors.Is(err, iterator.Done) {
			return struct{}{}, classify(err, "list instances in "+zone)
		}
		return struct{}{}, nil
	})
	if len(gaps) == 0 {
		return nil
	}
	return fmt.Errorf("gcp: %d of %d zones failing: %w", len(gaps), len(zones), launcher.PartialList(gaps))
}

// eachZone calls fn for every zone at once and returns the answers in zone order. A zone whose
// call failed, or that has not answered when ctx ends, is a gap and its answer the zero value;
// the others are good. Calls that did not answer go on in the background until their requests
// are cut (RequestTimeout): the REST clients' List requests do not carry ctx, so only the
// HTTP client can end them.
func eachZone[T any](ctx context.Context, zones []string, fn func(ctx context.Context, zone string) (T, error)) ([]T, []launcher.Gap) {
	type answer struct {
		i   int
		v   T
		err error
	}
	ch := make(chan answer, len(zones)) // buffered: a late answer never blocks its goroutine
	for i, zone := range zones {
		if err := launcher.Skip(ctx, regionOf(zone), zone); err != nil {
			var zero T
			ch <- answer{i, zero, err} // known to be down: not asked again (the provisioner probes it)
			continue
		}
		go func() {
			v, err := fn(ctx, zone)
			ch <- answer{i, v, err}
		}()
	}
	out := make([]T, len(zones))
	errs := make([]error, len(zones))
	answered := make([]bool, len(zones))
collect:
	for range zones {
		select {
		case a := <-ch:
			out[a.i], errs[a.i], answered[a.i] = a.v, a.err, true
		case <-ctx.Done():
			break collect
		}
	}
	var gaps []launcher.Gap
	for i, zone := range zones {
		err := errs[i]
		if !answered[i] {
			err = fmt.Errorf("gcp: %s did not answer before the call ended: %w", zone, launcher.ClassifyTransport(context.Cause(ctx)))
		}
		if err != nil {
			var zero T
			out[i] = zero
			gaps = append(gaps, launcher.Gap{Infra: InfraName, Region: regionOf(zone), Zone: zone, Err: err})
		}
	}
	return out, gaps
}

// Launch inserts the VM, waits for the insert operation, then for RUNNING with an address,
// all within LaunchTimeout. A VM that fails after its insert succeeded is deleted. Failed
// operations and HTTP errors are both classified (capacity, quota, invalid, unauthorized).
// If ctx ends while the insert request is in flight, GCP may still create the VM after the
// clean-up delete found nothing; it carries Ferry's labels, so List reports it and the
// reconciler adopts or terminates it.
//
// A job's node launched alone learns its own address as its gang's (job.go).
func (p *Provider) Launch(ctx context.Context, spec launcher.Spec) (launcher.Instance, error) {
	spec, selfTag := vmnode.WithNodeIPsCommand(spec, nodeIPsCommand)
	zone, err := p.zoneFor(spec.Placement)
	if err != nil {
		return launcher.Instance{}, err
	}
	spec.Placement.Zone = zone
	if flexWanted(spec) {
		return p.launchFlex(ctx, spec, selfTag)
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.LaunchTimeout)
	defer cancel()
	reserved, err := p.reservationFor(ctx, &spec, zone)
	if err != nil {
		return launcher.Instance{}, err
	}
	vm, err := p.instanceFor(ctx, spec, zone)
	if err != nil {
		return launcher.Instance{}, err
	}
	if reserved != nil {
		reserved.reserve(vm)
	}
	withGrace(vm, spec)
	if err := p.ensureFirewall(ctx, portOf(spec), ""); err != nil {
		return launcher.Instance{}, err
	}
	if spec.Job != nil {
		if err := p.ensureJobsRule(ctx); err != nil {
			return launcher.Instance{}, err
		}
	}
	p.mu.Lock()
	p.launchedZones[zone] = true
	p.mu.Unlock()
	log := p.log.With(zap.String("zone", zone), zap.String("instance", vm.GetName()),
		zap.String("machine_type", spec.Placement.InstanceType), zap.Bool("spot", spec.Placement.Spot))
	op, err := p.instances.Insert(ctx, &computepb.InsertInstanceRequest{
		Project: p.opts.Project, Zone: zone, InstanceResource: vm, RequestId: proto.String(uuid.NewString()),
	})
	if err != nil {
		if ctx.Err() != nil || !errors.As(err, new(*googleapi.Error)) {
			// Cancelled or cut mid-request (no answer from the API): the insert may have been
			// accepted.
			p.deleteQuietly(zone, vm.GetName())
		}
		return launcher.Instance{}, launchError(classify(err, "insert "+vm.GetName()+" in "+zone))
	}
	if _, err := p.waitZoneOp(ctx, zone, op.Proto()); err != nil {
		if !errors.As(err, new(*OperationError)) {
			// The VM may exist: the wait failed, not the insert.
			p.deleteQuietly(zone, vm.GetName())
		}
		log.Info("launch failed", zap.Error(err))
		return launcher.Instance{}, launchError(fmt.Errorf("gcp: insert %s in %s: %w", vm.GetName(), zone, err))
	}
	running, err := p.waitRunning(ctx, zone, vm.GetName())
	if err == nil {
		// Without configured sources the controller is admitted once the VM has an address.
		err = p.ensureFirewall(ctx, portOf(spec), address(running, p.opts.PublicIP))
	}
	inst := p.toInstance(zone, running, nil)
	if err == nil && selfTag {
		err = p.setNodeIPs(ctx, []launcher.Instance{inst})
	}
	if err != nil {
		p.deleteQuietly(zone, vm.GetName())
		return launcher.Instance{}, err
	}
	log.Info("launched", zap.String("ip", running.GetNetworkInterfaces()[0].GetNetworkIP()))
	return inst, nil
}

// launchError turns a not-found on insert (a zone, machine or accelerator type that does
// not exist) into ErrInvalid: the request, not the location's capacity, is wrong.
func launchError(classified error) error {
	if errors.Is(classified, launcher.ErrNotFound) {
		return fmt.Errorf("%w: %w", launcher.ErrInvalid, classified)
	}
	return classified
}

// waitZoneOp waits for a zone operation with operations.wait (which returns when the
// operation is DONE or after two minutes) and returns its error as an *OperationError.
//
// A wait is a long poll, which RequestTimeout may cut before GCP ends it: then a get, answered
// at once, tells an operation that is still running (wait again) from an endpoint that hangs
// (the get is cut too, and the wait fails with launcher.ErrUnavailable).
func (p *Provider) waitZoneOp(ctx context.Context, zone string, op *computepb.Operation) (*computepb.Operation, error) {
	for i := 0; op.GetStatus() != computepb.Operation_DONE; i++ {
		if i == maxOpWaits {
			return op, fmt.Errorf("operation %s is not done after %d waits", op.GetName(), i)
		}
		next, err := p.zoneOps.Wait(ctx, &computepb.WaitZoneOperationRequest{Project: p.opts.Project, Zone: zone, Operation: op.GetName()})
		if err != nil && isRequestTimeout(err) && ctx.Err() == nil {
			next, err = p.zoneOps.Get(ctx, &computepb.GetZoneOperationRequest{Project: p.opts.Project, Zone: zone, Operation: op.GetName()})
		}
		if err != nil {
			return op, classify(err, "wait for operation "+op.GetName())
		}
		op = next
	}
	return op, operationError(op)
}

// waitGlobalOp is waitZoneOp for a global operation.
func (p *Provider) waitGlobalOp(ctx context.Context, op *computepb.Operation) error {
	for i := 0; op.GetStatus() != computepb.Operation_DONE; i++ {
		if i == maxOpWaits {
			return fmt.Errorf("operation %s is not done after %d waits", op.GetName(), i)
		}
		next, err := p.globalOps.Wait(ctx, &computepb.WaitGlobalOperationRequest{Project: p.opts.Project, Operation: op.GetName()})
		if err != nil && isRequestTimeout(err) && ctx.Err() == nil {
			next, err = p.globalOps.Get(ctx, &computepb.GetGlobalOperationRequest{Project: p.opts.Project, Operation: op.GetName()})
		}
		if err != nil {
			return classify(err, "wait for operation "+op.GetName())
		}
		op = next
	}
	return operationError(op)
}

// waitRunning reads the VM every PollInterval until it is RUNNING with an address. A VM that
// stops first was preempted (Spot) or failed to start.
func (p *Provider) waitRunning(ctx context.Context, zone, name string) (*computepb.Instance, error) {
	t := time.NewTicker(p.opts.PollInterval)
	defer t.Stop()
	for {
		vm, err := p.instances.Get(ctx, &computepb.GetInstanceRequest{Project: p.opts.Project, Zone: zone, Instance: name})
		if err != nil {
			err = classify(err, "get "+name)
			if errors.Is(err, launcher.ErrNotFound) {
				return nil, fmt.Errorf("gcp: %w: %s disappeared while starting", launcher.ErrPreempted, name)
			}
			return nil, err
		}
		switch vm.GetStatus() {
		case "RUNNING":
			if address(vm, p.opts.PublicIP) != "" {
				return vm, nil
			}
		case "STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED", "TERMINATED":
			if vm.GetStatus() == "TERMINATED" && decodeLabels(vm.GetLabels())[launcher.LabelJob] != "" && vm.GetLastStartTimestamp() != "" {
				// A job's node that ran and powered off between two polls (a preempted one
				// is told apart when listed).
				return vm, nil
			}
			if isSpot(vm) {
				return nil, fmt.Errorf("gcp: %w: Spot VM %s stopped while starting (%s)", launcher.ErrPreempted, name, vm.GetStatus())
			}
			return nil, fmt.Errorf("gcp: %s stopped while starting (%s)", name, vm.GetStatus())
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("gcp: %s is %s, not RUNNING, after %v: %w", name, vm.GetStatus(), p.opts.LaunchTimeout, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// deleteQuietly removes a VM a failed launch left, outliving the launch's context.
func (p *Provider) deleteQuietly(zone, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := p.delete(ctx, zone, name); err != nil {
		p.log.Warn("delete after failed launch", zap.String("zone", zone), zap.String("instance", name), zap.Error(err))
	}
}

// Terminate deletes the VM and waits for the delete operation; a running job node's program is
// stopped with its grace period first. A VM that is already gone is not an error.
func (p *Provider) Terminate(ctx context.Context, id string) error {
	zone, name, err := parseID(id)
	if err != nil {
		return err
	}
	p.stopGracefully(ctx, zone, name) // a job node's run gets SIGTERM and its grace (stop.go)
	return p.delete(ctx, zone, name)
}

func (p *Provider) delete(ctx context.Context, zone, name string) error {
	op, err := p.instances.Delete(ctx, &computepb.DeleteInstanceRequest{Project: p.opts.Project, Zone: zone, Instance: name,
		RequestId: proto.String(uuid.NewString())})
	if err != nil {
		err = classify(err, "delete "+name)
		if errors.Is(err, launcher.ErrNotFound) {
			return nil
		}
		return err
	}
	if _, err := p.waitZoneOp(ctx, zone, op.Proto()); err != nil && !errors.Is(err, launcher.ErrNotFound) {
		return fmt.Errorf("gcp: delete %s: %w", name, err)
	}
	p.log.Info("deleted", zap.String("zone", zone), zap.String("instance", name))
	return nil
}

var _ launcher.Locator = (*Provider)(nil)

// Locate is the region and zone of an instance id ("gcp/ZONE/NAME").
func (p *Provider) Locate(id string) (region, zone string) {
	zone, _, err := parseID(id)
	if err != nil {
		return "", ""
	}
	return regionOf(zone), zone
}

// parseID splits "gcp/ZONE/NAME".
func parseID(id string) (zone, name string, err error) {
	rest, ok := strings.CutPrefix(id, InfraName+"/")
	if ok {
		zone, name, ok = strings.Cut(rest, "/")
	}
	if !ok || zone == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%w: %q is not a gcp instance id (gcp/ZONE/NAME)", launcher.ErrNotFound, id)
	}
	return zone, name, nil
}

// List returns Ferry's VMs (labelled ferry.managed=true) whose labels include selector, in
// every listed zone, filtered by the API. A stopped Spot VM with a
// compute.instances.preempted operation is reported as StatePreempted.
//
// Zones are listed at once. A zone that fails, or has not answered when ctx ends, is a
// launcher.Gap{Infra: "gcp", Region, Zone} in a *launcher.PartialListError returned with the
// VMs of the zones that answered: what it holds is unknown, not gone, and one broken zone
// never hides the others. A zone that does not exist (404) is a gap whose Err wraps
// launcher.ErrNotFound: it holds nothing.
func (p *Provider) List(ctx context.Context, selector map[string]string) ([]launcher.Instance, error) {
	filter := ownedFilter(selector)
	zones := p.listZones()
	perZone, gaps := eachZone(ctx, zones, func(ctx context.Context, zone string) ([]launcher.Instance, error) {
		return p.listZone(ctx, zone, filter)
	})
	out := slices.Concat(perZone...)
	slices.SortFunc(out, func(a, b launcher.Instance) int { return strings.Compare(a.ID, b.ID) })
	if ctx.Err() == nil {
		p.adoptFirewall(ctx, out)
	}
	return out, wholeIfEveryZone(gaps, len(zones))
}

// wholeIfEveryZone is the List's error: a gap per failing zone, or, when no zone answered and
// none for not existing, one gap for the whole infra naming each zone (GCP failing, which its
// breaker must see as such, not as zones failing one by one).
func wholeIfEveryZone(gaps []launcher.Gap, zones int) error {
	if len(gaps) < 2 || len(gaps) != zones || slices.ContainsFunc(gaps, func(g launcher.Gap) bool { return errors.Is(g.Err, launcher.ErrNotFound) }) {
		return launcher.PartialList(gaps)
	}
	errs := make([]error, len(gaps))
	for i, g := range gaps {
		errs[i] = fmt.Errorf("%s: %w", g.Zone, g.Err)
	}
	return launcher.PartialList([]launcher.Gap{{Infra: InfraName, Err: errors.Join(errs...)}})
}

func (p *Provider) listZone(ctx context.Context, zone, filter string) ([]launcher.Instance, error) {
	vms, err := p.rawListZone(ctx, zone, filter)
	if err != nil {
		return nil, err
	}
	var preempted map[uint64]*computepb.Operation
	for _, vm := range vms {
		if isSpot(vm) && stopped(vm) {
			var err error
			if preempted, err = p.preemptions(ctx, zone); err != nil {
				return nil, err
			}
			break
		}
	}
	out := make([]launcher.Instance, 0, len(vms))
	for _, vm := range vms {
		inst := p.toInstance(zone, vm, preempted)
		out = append(out, p.withExitCode(ctx, zone, vm, inst))
	}
	return out, nil
}

// preemptions are the zone's compute.instances.preempted operations by target VM id.
func (p *Provider) preemptions(ctx context.Context, zone string) (map[uint64]*computepb.Operation, error) {
	ops, err := p.preemptionOps(ctx, zone)
	if err != nil {
		return nil, err
	}
	out := make(map[uint64]*computepb.Operation, len(ops))
	for _, op := range ops {
		out[op.GetTargetId()] = op
	}
	return out, nil
}

func stopped(vm *computepb.Instance) bool {
	switch vm.GetStatus() {
	case "STOPPING", "STOPPED", "TERMINATED", "SUSPENDED":
		return true
	}
	return false
}

func isSpot(vm *computepb.Instance) bool {
	return vm.GetScheduling().GetProvisioningModel() == "SPOT" || vm.GetScheduling().GetPreemptible()
}

// address is where the proxy reaches the VM: its external address with PublicIP, else its
// internal one.
func address(vm *computepb.Instance, public bool) string {
	nics := vm.GetNetworkInterfaces()
	if len(nics) == 0 {
		return ""
	}
	if public {
		for _, ac := range nics[0].GetAccessConfigs() {
			if ac.GetNatIP() != "" {
				return ac.GetNatIP()
			}
		}
		return ""
	}
	return nics[0].GetNetworkIP()
}

func metadataValue(vm *computepb.Instance, key string) string {
	for _, it := range vm.GetMetadata().GetItems() {
		if it.GetKey() == key {
			return it.GetValue()
		}
	}
	return ""
}

// toInstance maps a VM: PROVISIONING and STAGING are pending, RUNNING running, a stopped Spot
// VM with a preemption operation preempted, anything else that stopped terminated.
func (p *Provider) toInstance(zone string, vm *computepb.Instance, preempted map[uint64]*computepb.Operation) launcher.Instance {
	inst := launcher.Instance{
		ID:     InfraName + "/" + zone + "/" + vm.GetName(),
		Name:   vm.GetName(),
		Labels: decodeLabels(vm.GetLabels()),
		Infra:  InfraName,
		Region: regionOf(zone),
		Zone:   zone,
		Spot:   isSpot(vm),
	}
	inst.PricePerHour, _ = strconv.ParseFloat(metadataValue(vm, metaPrice), 64)
	inst.LaunchedAt, _ = time.Parse(time.RFC3339, vm.GetCreationTimestamp())
	if ip, port := address(vm, p.opts.PublicIP), metadataValue(vm, metaPort); ip != "" && port != "" {
		inst.Endpoint = net.JoinHostPort(ip, port)
	}
	inst.IP = address(vm, false)
	inst.WindowEnd = endOf(vm) // its reservation's end or run limit (reservations.go)
	switch vm.GetStatus() {
	case "PROVISIONING", "STAGING", "REPAIRING", "PENDING":
		inst.State = launcher.StatePending
	case "RUNNING":
		inst.State = launcher.StateRunning
	default:
		inst.State, inst.Reason = launcher.StateTerminated, "VM is "+vm.GetStatus()
		if op, ok := preempted[vm.GetId()]; ok && inst.Spot && stopped(vm) {
			inst.State = launcher.StatePreempted
			inst.Reason = "Spot VM preempted at " + op.GetInsertTime()
			if msg := op.GetStatusMessage(); msg != "" {
				inst.Reason += ": " + msg
			}
		}
	}
	return inst
}
