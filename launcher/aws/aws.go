// Package aws is the launcher.Provider for Amazon EC2: one VM per instance, on-demand or spot,
// through aws-sdk-go-v2.
//
// A VM is bootstrapped by its user-data (a bash script: the spec's environment, FERRY_PORT and
// FERRY_HOST, then nodefiles.RenderScript), never over SSH, and its metadata service answers
// IMDSv2 only, with a hop limit of 1 (metadataOptions). Instances carry Ferry's labels as
// tags, so a restarted controller adopts them with List. Instance ids are
// "aws/<region>/<instance-id>". The service port is opened, to the proxies only, in one
// security group per region (Options.SecurityGroup), created on first use; List narrows it
// for instances an earlier controller launched (ingress.go). EC2 has no watch API: Launch polls
// DescribeInstances with backoff until the VM runs, and Notices polls for spot interruption
// warnings and terminations every Options.NoticeInterval.
//
// A job's node (Spec.Job) boots the same way but is meant to end: it learns its gang's
// addresses from an instance tag, hears spot interruption warnings from its metadata service,
// and marks its exit status on the console before it powers off; List reports it as
// Instance.ExitCode, StreamLogs serves the console (job.go, logs.go). LaunchGang puts a gang in
// one cluster placement group (gang.go).
//
// When EC2 fails (an outage, throttling, an endpoint that hangs) the failure stays its region's:
// every HTTP request is cut by Options.RequestTimeout and the SDK's retries are bounded; errors
// wrap launcher.ErrThrottled or launcher.ErrUnavailable (errors.go); List and Check ask the
// regions at once, and List reports a region it could not read as a launcher.Gap; launches,
// the notice poll and a followed console in one region never wait on another's calls, and
// the background polls back off from a failing region and log the failure once.
//
// Credentials come from the SDK's default chain (environment, shared config and credentials
// files, SSO, IMDS) unless Options.Credentials is set; Options.Endpoint points the client at
// a compatible cloud or at the in-project fake (launcher/aws/fakeec2).
package aws

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/buckets"
	"github.com/ferryserve/ferry/launcher/nodefiles"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

// Defaults for Options.
const (
	// InfraName is the infra this provider serves and the prefix of its instance ids.
	InfraName = "aws"
	// DefaultRegion is used when Options.Regions is empty.
	DefaultRegion = "us-east-1"
	// DefaultSecurityGroup is the security group Ferry creates per region for service ports.
	DefaultSecurityGroup = "ferry"
	// DefaultJobSecurityGroup is the security group Ferry creates per region in which a job's
	// nodes reach each other.
	DefaultJobSecurityGroup = "ferry-jobs"
	// DefaultLaunchTimeout bounds the wait for a VM to reach running with a private IP. EC2
	// usually takes under a minute; large GPU instances a few.
	DefaultLaunchTimeout = 10 * time.Minute
	// DefaultPollInterval is the first wait between DescribeInstances polls during launch;
	// it grows by half each time up to maxPollInterval.
	DefaultPollInterval = 2 * time.Second
	// DefaultNoticeInterval is how often Notices polls EC2 for spot interruptions. Every poll
	// is one DescribeSpotInstanceRequests and one DescribeInstances per region, well inside
	// EC2's request rate limits.
	DefaultNoticeInterval = 5 * time.Second
	// DefaultPort is the service port when the spec gives none.
	DefaultPort = 8080
	// DefaultRequestTimeout bounds one HTTP request to EC2, from dial to the answer's last
	// byte. EC2 answers in well under a second; an endpoint that accepts and never answers
	// would otherwise hold a call (and whatever waits on it) until the caller's own deadline,
	// which a background loop or a long Launch does not have.
	DefaultRequestTimeout = 30 * time.Second
	// DefaultMaxAttempts is how many times the SDK tries one API call: with its jittered
	// back-off (a second or two after throttling), a call against an endpoint that is down
	// fails within about three RequestTimeouts.
	DefaultMaxAttempts = 3
	// maxRetryBackoff caps the SDK's wait between two attempts of a call.
	maxRetryBackoff = 5 * time.Second

	maxPollInterval = 10 * time.Second
	cleanupTimeout  = 2 * time.Minute
)

// Tags Ferry sets besides the spec's labels. They are not reported as labels.
const (
	tagName           = "Name"
	tagPort           = "ferry.port"
	tagPrice          = "ferry.price-per-hour"
	tagPlacementGroup = "ferry.placement-group"
)

// State reason codes EC2 reports.
const (
	reasonSpotTermination = "Server.SpotInstanceTermination"
	reasonNoCapacity      = "Server.InsufficientInstanceCapacity"
	reasonUserShutdown    = "Client.UserInitiatedShutdown"
)

// Options configures a Provider.
type Options struct {
	// Regions are where instances may go; the first is the default. Default [DefaultRegion].
	Regions []string
	// Endpoint overrides EC2's endpoint in every region (a compatible cloud, or the fake).
	Endpoint string
	// Credentials, when set, replace the SDK's default credential chain.
	Credentials awssdk.CredentialsProvider
	// Profile selects a shared-config profile for the default chain.
	Profile string
	// SecurityGroup is the group every instance runs in, whose rules open the service ports;
	// default DefaultSecurityGroup.
	SecurityGroup string
	// JobSecurityGroup is the group a job's nodes run in besides SecurityGroup, which admits
	// all traffic between its members; default DefaultJobSecurityGroup (see ensureJobGroup).
	JobSecurityGroup string
	// IngressCIDRs and IngressSecurityGroups (ids, in the instances' VPC) are all that may
	// reach the service port: the controller and its attached proxies. With neither, the
	// controller alone, at the address its host sends from to each replica (see ingress.go).
	IngressCIDRs          []string
	IngressSecurityGroups []string
	// CheckpointNFS is an NFSv4 share ("fs-….efs.REGION.amazonaws.com:/", an EFS file system)
	// that job nodes mount for their checkpoints, so that a recovery in reach of it resumes
	// (vmnode.CheckpointShell); empty keeps checkpoints on each VM's disk.
	CheckpointNFS string
	// Buckets lists the s3:// and gs:// sources of file_mounts and presigns their downloads;
	// nil is buckets.New with the controller's own credentials.
	Buckets nodefiles.Buckets
	// MountInstanceProfile is the IAM instance profile a VM that mounts s3:// buckets (MOUNT,
	// MOUNT_CACHED) runs with: its role must read and write them (mounts.go). Empty refuses
	// such mounts.
	MountInstanceProfile string
	// AMIs is the image per region for tasks without an "ami-" image_id.
	AMIs map[string]string
	// LaunchTimeout bounds the wait for a VM to run; default DefaultLaunchTimeout.
	LaunchTimeout time.Duration
	// PollInterval is the first wait between launch polls; default DefaultPollInterval.
	PollInterval time.Duration
	// NoticeInterval is how often Notices polls; default DefaultNoticeInterval.
	NoticeInterval time.Duration
	// LogInterval is how often StreamLogs reads a followed console; default DefaultLogInterval.
	LogInterval time.Duration
	// CapacityBlockTerminationLead is how long before a capacity block's end EC2 terminates
	// its instances; default DefaultCapacityBlockTerminationLead (capacityblocks.go).
	CapacityBlockTerminationLead time.Duration
	// ReservationNoticeLead is how long before that Notices warns of it; default
	// launcher.DefaultWindowLead.
	ReservationNoticeLead time.Duration
	// MaxAttempts bounds the SDK's attempts per API call; default DefaultMaxAttempts.
	MaxAttempts int
	// RequestTimeout bounds each HTTP request to EC2, so that a hung endpoint is cut even
	// inside a long operation (Launch's wait for a VM, the notice poll); default
	// DefaultRequestTimeout.
	RequestTimeout time.Duration
	Logger         *zap.Logger
}

// Provider launches EC2 instances in the configured regions. It is safe for concurrent use.
type Provider struct {
	opts    Options
	log     *zap.Logger
	clients map[string]*ec2.Client

	mu    sync.Mutex
	zones map[string]map[string]string // region -> AZ ID -> zone name
	amis  map[string]string            // "region/gpu" -> default image found by name
	// rootDevices caches each image's root device name (disk.go).
	rootDevices sync.Map
	// exits caches the exit status job nodes marked, by instance id.
	exits *vmnode.ExitCodes

	// sources are the configured ingress sources; none means the controller's route source.
	sources []source
	// routeSource is launcher.RouteSource; tests replace it.
	routeSource func(ip string) (netip.Prefix, error)
	// ingress is each region's security-group state, with the lock that serialises changes
	// to them (ingress.go); the map is fixed in New. A region's lock is never held with mu.
	ingress map[string]*regionIngress
	// adoption: the ports of adopted instances whose ingress List has set (ingress.go).
	adoption launcher.IngressAdoption
	// windows caches capacity blocks' ends for List (reservations.go).
	windows windowCache
}

var (
	_ launcher.Provider           = (*Provider)(nil)
	_ launcher.Checker            = (*Provider)(nil)
	_ launcher.GangLauncher       = (*Provider)(nil)
	_ launcher.PreemptionNotifier = (*Provider)(nil)
	_ launcher.LogStreamer        = (*Provider)(nil)
	_ launcher.Reserver           = (*Provider)(nil)
	_ launcher.Offerer            = (*Provider)(nil)
)

// New loads the SDK configuration (credentials are resolved lazily, on the first call) and
// returns a Provider. It does not contact EC2.
func New(ctx context.Context, opts Options) (*Provider, error) {
	if len(opts.Regions) == 0 {
		opts.Regions = []string{DefaultRegion}
	}
	launcher.SetDefault(&opts.SecurityGroup, DefaultSecurityGroup)
	launcher.SetDefault(&opts.JobSecurityGroup, DefaultJobSecurityGroup)
	sources, err := configuredSources(opts)
	if err != nil {
		return nil, err
	}
	launcher.SetDefault(&opts.LaunchTimeout, DefaultLaunchTimeout)
	launcher.SetDefault(&opts.PollInterval, DefaultPollInterval)
	launcher.SetDefault(&opts.NoticeInterval, DefaultNoticeInterval)
	launcher.SetDefault(&opts.LogInterval, DefaultLogInterval)
	launcher.SetDefault(&opts.CapacityBlockTerminationLead, DefaultCapacityBlockTerminationLead)
	launcher.SetDefault(&opts.ReservationNoticeLead, launcher.DefaultWindowLead)
	launcher.SetDefault(&opts.MaxAttempts, DefaultMaxAttempts)
	launcher.SetDefault(&opts.RequestTimeout, DefaultRequestTimeout)
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Buckets == nil {
		opts.Buckets = buckets.New(buckets.Options{Credentials: opts.Credentials})
	}
	// One HTTP client with a per-request timeout for every call, the credential chain's
	// included (an IMDS or SSO endpoint can hang too).
	httpClient := awshttp.NewBuildableClient().WithTimeout(opts.RequestTimeout)
	load := []func(*config.LoadOptions) error{config.WithRegion(opts.Regions[0]), config.WithHTTPClient(httpClient)}
	if opts.Credentials != nil {
		load = append(load, config.WithCredentialsProvider(opts.Credentials))
	}
	if opts.Profile != "" {
		load = append(load, config.WithSharedConfigProfile(opts.Profile))
	}
	cfg, err := config.LoadDefaultConfig(ctx, load...)
	if err != nil {
		return nil, fmt.Errorf("%s: load SDK config: %w", InfraName, err)
	}
	// The SDK's standard retryer backs off with jitter (longer after throttling) and stops
	// retrying when too many attempts failed lately (its retry quota); bounded here so that a
	// call against a failing endpoint gives up in time for the caller to go elsewhere.
	cfg.Retryer = func() awssdk.Retryer {
		return retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = opts.MaxAttempts
			o.MaxBackoff = maxRetryBackoff
			o.Retryables = append([]retry.IsErrorRetryable{noRetryCapacity}, o.Retryables...)
		})
	}
	p := &Provider{
		opts: opts, log: opts.Logger.With(zap.String("infra", InfraName)), clients: map[string]*ec2.Client{},
		zones: map[string]map[string]string{}, amis: map[string]string{}, exits: vmnode.NewExitCodes(exitRetry),
		sources: sources, routeSource: launcher.RouteSource,
		ingress: map[string]*regionIngress{},
	}
	for _, r := range opts.Regions {
		p.ingress[r] = newRegionIngress()
		p.clients[r] = ec2.NewFromConfig(cfg, func(o *ec2.Options) {
			o.Region = r
			if opts.Endpoint != "" {
				o.BaseEndpoint = awssdk.String(opts.Endpoint)
			}
		})
	}
	return p, nil
}

// Infra is "aws".
func (p *Provider) Infra() string { return InfraName }

// Regions are the regions the provider launches in and lists.
func (p *Provider) Regions() []string { return slices.Clone(p.opts.Regions) }

// Check reports whether EC2 answers with the configured credentials in every region. The
// regions are asked at once, each within the request timeout, so that one that hangs does not
// hide the others' answers; the error names every region that failed, and wraps each one's
// error (launcher.ErrUnauthorized, ErrUnavailable, ErrThrottled).
func (p *Provider) Check(ctx context.Context) error {
	errs := make([]error, len(p.opts.Regions))
	var wg sync.WaitGroup
	for i, r := range p.opts.Regions {
		wg.Go(func() {
			if _, err := p.clients[r].DescribeAvailabilityZones(ctx, &ec2.DescribeAvailabilityZonesInput{}); err != nil {
				errs[i] = classify(err, "describe availability zones in "+r)
			}
		})
	}
	wg.Wait()
	var failed []string
	for i, err := range errs {
		if err != nil {
			failed = append(failed, p.opts.Regions[i])
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %d of %d region(s) failing (%s): %w", InfraName, len(failed), len(p.opts.Regions), strings.Join(failed, ", "), errors.Join(errs...))
}

// ZoneNames returns region's Availability Zones as AZ ID (use1-az4, the catalog's and the
// optimizer's) → the account's zone name (us-east-1a). It is cached after the first call.
func (p *Provider) ZoneNames(ctx context.Context, region string) (map[string]string, error) {
	c, err := p.client(region)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	cached := p.zones[region]
	p.mu.Unlock()
	if cached != nil {
		return maps.Clone(cached), nil
	}
	out, err := c.DescribeAvailabilityZones(ctx, &ec2.DescribeAvailabilityZonesInput{})
	if err != nil {
		return nil, classify(err, "describe availability zones in "+region)
	}
	m := map[string]string{}
	for _, z := range out.AvailabilityZones {
		if z.ZoneId != nil && z.ZoneName != nil {
			m[*z.ZoneId] = *z.ZoneName
		}
	}
	p.mu.Lock()
	p.zones[region] = m
	p.mu.Unlock()
	return maps.Clone(m), nil
}

// zoneName resolves a placement's zone, an AZ ID or a zone name, to the account's zone name.
func (p *Provider) zoneName(ctx context.Context, region, zone string) (string, error) {
	names, err := p.ZoneNames(ctx, region)
	if err != nil {
		return "", err
	}
	if name, ok := names[zone]; ok {
		return name, nil
	}
	for _, name := range names {
		if name == zone {
			return name, nil
		}
	}
	return "", fmt.Errorf("%w: %s: zone %q is neither an Availability Zone ID nor a zone name in %s", launcher.ErrInvalid, InfraName, zone, region)
}

func (p *Provider) client(region string) (*ec2.Client, error) {
	c := p.clients[region]
	if c == nil {
		return nil, fmt.Errorf("%w: %s: region %q is not enabled (enabled: %s)", launcher.ErrInvalid, InfraName, region, strings.Join(p.opts.Regions, ", "))
	}
	return c, nil
}

// Default images, found by name when neither the task nor Options.AMIs names one: AWS's Deep
// Learning Base AMI (NVIDIA driver and CUDA, Ubuntu 22.04) for GPU instance types, Canonical's
// Ubuntu 22.04 otherwise. The newest available build wins.
var defaultImages = map[bool]struct{ owner, name string }{
	true:  {"amazon", "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"},
	false: {"099720109477", "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*"},
}

// defaultAMI looks up (once per region and kind) the newest default image.
func (p *Provider) defaultAMI(ctx context.Context, c *ec2.Client, region string, gpu bool) (string, error) {
	key := region + "/" + strconv.FormatBool(gpu)
	p.mu.Lock()
	ami, ok := p.amis[key]
	p.mu.Unlock()
	if ok {
		return ami, nil
	}
	want := defaultImages[gpu]
	out, err := c.DescribeImages(ctx, &ec2.DescribeImagesInput{
		Owners: []string{want.owner},
		Filters: []types.Filter{
			{Name: awssdk.String("name"), Values: []string{want.name}},
			{Name: awssdk.String("state"), Values: []string{"available"}},
			{Name: awssdk.String("architecture"), Values: []string{"x86_64"}},
		},
	})
	if err != nil {
		return "", classify(err, "find the default image")
	}
	var newest types.Image
	for _, img := range out.Images {
		if awssdk.ToString(img.CreationDate) > awssdk.ToString(newest.CreationDate) {
			newest = img
		}
	}
	if newest.ImageId == nil {
		return "", fmt.Errorf("%w: %s: no image named %q in %s; set amis in config.yaml or image_id: ami-... in the task", launcher.ErrInvalid, InfraName, want.name, region)
	}
	ami = awssdk.ToString(newest.ImageId)
	p.mu.Lock()
	p.amis[key] = ami
	p.mu.Unlock()
	p.log.Info("default image", zap.String("region", region), zap.Bool("gpu", gpu), zap.String("ami", ami), zap.String("name", awssdk.ToString(newest.Name)))
	return ami, nil
}

// launchPlan is what one RunInstances call needs, resolved from a spec.
type launchPlan struct {
	region, zone, ami, instanceType, securityGroup, placementGroup string
	// jobGroup is the job security group, for a job's nodes.
	jobGroup string
	port     int
	// reservation is the Capacity Reservation or block to launch into (reservations.go).
	reservation *reservedLaunch
}

// plan resolves region, zone, image, instance type, port and security group for spec.
func (p *Provider) plan(ctx context.Context, spec launcher.Spec, needZone bool) (launchPlan, error) {
	pl := spec.Placement
	lp := launchPlan{region: pl.Region, instanceType: pl.InstanceType, port: spec.Port}
	if lp.region == "" {
		lp.region = p.opts.Regions[0]
	}
	c, err := p.client(lp.region)
	if err != nil {
		return lp, err
	}
	if lp.instanceType == "" {
		return lp, fmt.Errorf("%w: %s: the placement has no instance type", launcher.ErrInvalid, InfraName)
	}
	if lp.port == 0 {
		lp.port = DefaultPort
	}
	switch img := spec.Resources.ImageID; {
	case strings.HasPrefix(img, "ami-"):
		lp.ami = img
	case img != "" && vmnode.DockerImage(spec) == "":
		return lp, fmt.Errorf("%w: %s: image_id %q is neither an AMI (ami-...) nor a container image (docker:IMAGE)", launcher.ErrInvalid, InfraName, img)
	default: // a docker: image runs on the default image, which the boot script gives docker
		lp.ami = p.opts.AMIs[lp.region]
		if lp.ami == "" {
			if lp.ami, err = p.defaultAMI(ctx, c, lp.region, pl.Accelerator != ""); err != nil {
				return lp, err
			}
		}
	}
	if lp.reservation, err = p.resolveReservation(ctx, spec, lp.region, pl.Zone); err != nil {
		return lp, err
	}
	switch {
	case pl.Zone != "":
		if lp.zone, err = p.zoneName(ctx, lp.region, pl.Zone); err != nil {
			return lp, err
		}
	case lp.reservation != nil:
		lp.zone = lp.reservation.zone
	case needZone:
		names, err := p.ZoneNames(ctx, lp.region)
		if err != nil {
			return lp, err
		}
		ids := slices.Sorted(maps.Keys(names))
		if len(ids) == 0 {
			return lp, fmt.Errorf("%w: %s: region %s has no zones", launcher.ErrNoCapacity, InfraName, lp.region)
		}
		lp.zone = names[ids[0]]
	}
	if lp.securityGroup, err = p.ensureIngress(ctx, lp.region, lp.port, ""); err != nil {
		return lp, err
	}
	if spec.Job != nil {
		ri := p.ingress[lp.region]
		ri.mu.Lock()
		lp.jobGroup, err = p.ensureJobGroup(ctx, c, lp.region)
		ri.mu.Unlock()
		if err != nil {
			return lp, err
		}
	}
	return lp, nil
}

// userDataLimit is EC2's bound on user-data, before base64.
const userDataLimit = nodefiles.AWSUserDataLimit

// envName is what bash accepts as a variable name.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// userData is the VM's boot script: the environment, the port and host, then the spec's
// script. Known limitation: EC2 has no secret channel into user-data, so Spec.SecretEnvs are
// written here like any other variable, and anyone who may call DescribeInstanceAttribute, or
// any process on the VM (IMDSv2 with hop limit 1 stops forged requests and containers, not
// them), can read them. Keeping them apart needs Secrets Manager or SSM Parameter Store and an
// instance profile that may read them.
func userData(ctx context.Context, spec launcher.Spec, port int, o vmnode.BootOptions) (string, error) {
	var b strings.Builder
	b.WriteString("#!/bin/bash\n# Ferry user-data for " + nodefiles.ShellQuote(spec.Name) + ".\n")
	for _, k := range slices.Sorted(maps.Keys(spec.Envs)) {
		if !envName.MatchString(k) {
			return "", fmt.Errorf("%w: %s: environment variable name %q is not valid in bash", launcher.ErrInvalid, InfraName, k)
		}
		if k == "FERRY_PORT" || k == "FERRY_HOST" {
			continue
		}
		b.WriteString("export " + k + "=" + nodefiles.ShellQuote(spec.Envs[k]) + "\n")
	}
	b.WriteString("export FERRY_PORT=" + strconv.Itoa(port) + "\n")
	b.WriteString("export FERRY_HOST=${FERRY_HOST:-0.0.0.0}\n")
	o.Watch = preemptionWatch
	o.FilesLimit = userDataLimit - b.Len()
	boot, err := vmnode.Boot(ctx, InfraName, spec, o)
	if err != nil {
		return "", err
	}
	b.WriteString(boot)
	if b.Len() > userDataLimit {
		what := "move setup into a script on the image"
		if spec.Workdir != "" || len(spec.FileMounts) > 0 {
			what = "put the workdir and file_mounts in a bucket and mount that (each object adds a presigned URL), or move setup into a script on the image"
		}
		return "", fmt.Errorf("%w: %s: user-data is %d bytes, over EC2's 16 KiB limit; %s", nodefiles.ErrFiles, InfraName, b.Len(), what)
	}
	return base64.StdEncoding.EncodeToString([]byte(b.String())), nil
}

// metadataOptions are every instance's: IMDSv2 only, hop limit 1, whatever the image or the
// account defaults to. The user-data carries the task's environment, secrets included, and
// the metadata service serves it to anyone who can make the VM send a request: IMDSv1 answers
// a plain GET, which a server-side request forgery in the replica's program can make;
// IMDSv2 first wants a PUT with a header for a session token, and a hop limit of 1 keeps that
// token from reaching a container behind a bridge (one hop further). Processes on the VM
// itself can still read it: see userData.
//
// A job's node also gets its tags in the metadata service (InstanceMetadataTags), where it
// reads its gang's addresses (job.go); a replica's tags stay out of it.
func metadataOptions(job bool) *types.InstanceMetadataOptionsRequest {
	m := &types.InstanceMetadataOptionsRequest{
		HttpTokens:              types.HttpTokensStateRequired,
		HttpPutResponseHopLimit: awssdk.Int32(1),
		HttpEndpoint:            types.InstanceMetadataEndpointStateEnabled,
	}
	if job {
		m.InstanceMetadataTags = types.InstanceMetadataTagsStateEnabled
	}
	return m
}

// tags are the spec's labels plus Ferry's own.
func tags(spec launcher.Spec, port int, placementGroup string) []types.Tag {
	m := maps.Clone(spec.Labels)
	if m == nil {
		m = map[string]string{}
	}
	m[launcher.LabelOwner] = "true"
	m[tagName] = spec.Name
	m[tagPort] = strconv.Itoa(port)
	m[tagPrice] = strconv.FormatFloat(spec.Placement.PricePerHour, 'f', -1, 64)
	if placementGroup != "" {
		m[tagPlacementGroup] = placementGroup
	}
	out := make([]types.Tag, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, types.Tag{Key: awssdk.String(k), Value: awssdk.String(m[k])})
	}
	return out
}

// Launch runs one instance exactly at spec.Placement and returns once it is running with a
// private IP (not once its program serves). A VM that does not run within LaunchTimeout, or
// ends while starting, is terminated. If ctx ends first, the VM is left for List to adopt.
//
// A job's node launched alone learns its own address as its gang's (job.go).
func (p *Provider) Launch(ctx context.Context, spec launcher.Spec) (launcher.Instance, error) {
	spec, selfTag := vmnode.WithNodeIPsCommand(spec, nodeIPsCommand)
	lp, err := p.plan(ctx, spec, false)
	if err != nil {
		return launcher.Instance{}, err
	}
	id, err := p.run(ctx, lp, spec)
	if err != nil {
		return launcher.Instance{}, err
	}
	insts, err := p.waitRunning(ctx, lp.region, []string{id})
	if err == nil {
		err = p.admitInstances(ctx, lp, insts)
	}
	if err == nil && selfTag {
		err = p.tagNodes(ctx, lp.region, insts)
	}
	if err != nil {
		if ctx.Err() == nil {
			p.cleanUp(err, func() { p.terminateQuietly(lp.region, []string{id}) })
		}
		return launcher.Instance{}, err
	}
	lp.setWindow(insts)
	return insts[0], nil
}

// admitInstances lets the controller reach the running instances' service port when no proxy
// source is configured (its address is known only once an instance has one to route to).
func (p *Provider) admitInstances(ctx context.Context, lp launchPlan, insts []launcher.Instance) error {
	for _, in := range insts {
		host, _, err := net.SplitHostPort(in.Endpoint)
		if err != nil {
			continue
		}
		if _, err := p.ensureIngress(ctx, lp.region, lp.port, host); err != nil {
			return err
		}
	}
	return nil
}

// run is one RunInstances call for one instance.
func (p *Provider) run(ctx context.Context, lp launchPlan, spec launcher.Spec) (string, error) {
	ud, err := userData(ctx, spec, lp.port, p.bootOptions())
	if err != nil {
		return "", err
	}
	instanceTags := tags(spec, lp.port, lp.placementGroup)
	volumes, err := p.rootVolume(ctx, p.clients[lp.region], lp.ami, spec.Resources)
	if err != nil {
		return "", err
	}
	in := &ec2.RunInstancesInput{
		BlockDeviceMappings: volumes,
		ImageId:             awssdk.String(lp.ami),
		InstanceType:        types.InstanceType(lp.instanceType),
		MinCount:            awssdk.Int32(1),
		MaxCount:            awssdk.Int32(1),
		UserData:            awssdk.String(ud),
		SecurityGroupIds:    slices.DeleteFunc([]string{lp.securityGroup, lp.jobGroup}, func(g string) bool { return g == "" }),
		ClientToken:         awssdk.String(randomHex(16)),
		TagSpecifications: []types.TagSpecification{{
			ResourceType: types.ResourceTypeInstance, Tags: instanceTags,
		}},
		// The replica manager owns the lifecycle: a VM that shuts itself down is gone. A job's
		// node powers off when its run ends (job.go).
		InstanceInitiatedShutdownBehavior: types.ShutdownBehaviorTerminate,
		MetadataOptions:                   metadataOptions(spec.Job != nil),
		IamInstanceProfile:                p.mountProfile(spec),
	}
	if lp.zone != "" || lp.placementGroup != "" {
		in.Placement = &types.Placement{}
		if lp.zone != "" {
			in.Placement.AvailabilityZone = awssdk.String(lp.zone)
		}
		if lp.placementGroup != "" {
			in.Placement.GroupName = awssdk.String(lp.placementGroup)
		}
	}
	if spec.Placement.Spot {
		// No MaxPrice: EC2 caps a spot bid at the on-demand price, which is what the optimizer
		// compared spot against.
		in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{
			MarketType: types.MarketTypeSpot,
			SpotOptions: &types.SpotMarketOptions{
				SpotInstanceType:             types.SpotInstanceTypeOneTime,
				InstanceInterruptionBehavior: types.InstanceInterruptionBehaviorTerminate,
			},
		}
		// The spot request carries the instance's tags too, so that Notices finds the
		// interruption warnings of Ferry's requests by tag.
		in.TagSpecifications = append(in.TagSpecifications, types.TagSpecification{
			ResourceType: types.ResourceTypeSpotInstancesRequest, Tags: instanceTags,
		})
	}
	where := lp.region
	if lp.zone != "" {
		where = lp.zone
	}
	market := "on-demand"
	if spec.Placement.Spot {
		market = "spot"
	}
	if lp.reservation != nil {
		reserve(in, lp.reservation)
		market = "reserved (" + lp.reservation.id + ")"
	}
	out, err := p.clients[lp.region].RunInstances(ctx, in)
	if err != nil {
		return "", classify(err, fmt.Sprintf("run %s %s in %s", market, lp.instanceType, where))
	}
	if len(out.Instances) != 1 || out.Instances[0].InstanceId == nil {
		return "", fmt.Errorf("%s: run %s in %s: EC2 returned %d instances", InfraName, lp.instanceType, where, len(out.Instances))
	}
	id := *out.Instances[0].InstanceId
	p.log.Info("ran instance", zap.String("id", id), zap.String("name", spec.Name), zap.String("zone", where),
		zap.String("instance_type", lp.instanceType), zap.String("market", market))
	return id, nil
}

// waitRunning polls DescribeInstances until every instance runs with a private IP, one ends,
// LaunchTimeout passes or ctx ends. The wait starts at PollInterval and grows by half up to
// maxPollInterval.
func (p *Provider) waitRunning(ctx context.Context, region string, ids []string) ([]launcher.Instance, error) {
	wctx, cancel := context.WithTimeout(ctx, p.opts.LaunchTimeout)
	defer cancel()
	c := p.clients[region]
	wait := p.opts.PollInterval
	var last string
	for {
		out, err := c.DescribeInstances(wctx, &ec2.DescribeInstancesInput{InstanceIds: ids})
		switch {
		case err == nil:
			insts, done, err := p.started(region, ids, out)
			if err != nil || done {
				return insts, err
			}
			last = "pending"
		case errorCode(err) == "InvalidInstanceID.NotFound":
			// EC2 is eventually consistent: a new instance may not be visible yet.
			last = "not visible yet"
		case wctx.Err() == nil:
			err = classify(err, "describe instances")
			if !errors.Is(err, launcher.ErrThrottled) {
				return nil, err
			}
			// Throttled even after the SDK's retries: EC2 is up and the VM is most likely
			// starting; poll again, later, rather than give up a launch that went through.
			last = "unknown (throttled: " + err.Error() + ")"
			wait = maxPollInterval
		}
		t := time.NewTimer(wait)
		select {
		case <-wctx.Done():
			t.Stop()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("%w: %s: %s still %s after %v", launcher.ErrNoCapacity, InfraName, strings.Join(ids, ", "), last, p.opts.LaunchTimeout)
		case <-t.C:
		}
		wait = min(wait*3/2, maxPollInterval)
	}
}

// started reads one DescribeInstances answer during launch: done once all run with an IP, an
// error once any has ended (preempted, no capacity, or otherwise).
func (p *Provider) started(region string, ids []string, out *ec2.DescribeInstancesOutput) ([]launcher.Instance, bool, error) {
	byID := map[string]types.Instance{}
	for _, r := range out.Reservations {
		for _, in := range r.Instances {
			byID[awssdk.ToString(in.InstanceId)] = in
		}
	}
	insts := make([]launcher.Instance, 0, len(ids))
	for _, id := range ids {
		in, ok := byID[id]
		if !ok || in.State == nil {
			return nil, false, nil
		}
		switch in.State.Name {
		case types.InstanceStateNameRunning:
			if awssdk.ToString(in.PrivateIpAddress) == "" {
				return nil, false, nil
			}
		case types.InstanceStateNamePending:
			return nil, false, nil
		default:
			code, msg := stateReason(in)
			if code == reasonInstanceShutdown && hasTag(in, launcher.LabelJob) {
				// A job's node that ran and powered off between two polls.
				break
			}
			kind := errors.New("ended while starting")
			switch code {
			case reasonSpotTermination:
				kind = launcher.ErrPreempted
			case reasonNoCapacity:
				kind = launcher.ErrNoCapacity
			}
			return nil, false, fmt.Errorf("%w: %s: instance %s is %s while starting: %s", kind, InfraName, id, in.State.Name, msg)
		}
		insts = append(insts, p.instance(region, in))
	}
	return insts, true, nil
}

func hasTag(in types.Instance, key string) bool {
	for _, t := range in.Tags {
		if awssdk.ToString(t.Key) == key {
			return true
		}
	}
	return false
}

func stateReason(in types.Instance) (code, message string) {
	if in.StateReason != nil {
		code, message = awssdk.ToString(in.StateReason.Code), awssdk.ToString(in.StateReason.Message)
	}
	if message == "" {
		message = awssdk.ToString(in.StateTransitionReason)
	}
	if message == "" {
		message = code
	}
	return code, message
}

// instance maps an EC2 instance to a launcher.Instance.
func (p *Provider) instance(region string, in types.Instance) launcher.Instance {
	tagMap := map[string]string{}
	for _, t := range in.Tags {
		tagMap[awssdk.ToString(t.Key)] = awssdk.ToString(t.Value)
	}
	out := launcher.Instance{
		ID:     InfraName + "/" + region + "/" + awssdk.ToString(in.InstanceId),
		Name:   tagMap[tagName],
		Labels: map[string]string{},
		Infra:  InfraName,
		Region: region,
		Spot:   in.InstanceLifecycle == types.InstanceLifecycleTypeSpot,
	}
	for k, v := range tagMap {
		switch {
		case k == tagName, k == tagPort, k == tagPrice, k == tagPlacementGroup, k == tagNodeIPs, strings.HasPrefix(k, "aws:"):
		default:
			out.Labels[k] = v
		}
	}
	out.PricePerHour, _ = strconv.ParseFloat(tagMap[tagPrice], 64)
	if in.Placement != nil {
		out.Zone = awssdk.ToString(in.Placement.AvailabilityZone)
	}
	if in.LaunchTime != nil {
		out.LaunchedAt = *in.LaunchTime
	}
	if ip := awssdk.ToString(in.PrivateIpAddress); ip != "" {
		out.IP = ip
		port := tagMap[tagPort]
		if port == "" {
			port = strconv.Itoa(DefaultPort)
		}
		out.Endpoint = ip + ":" + port
	}
	var state types.InstanceStateName
	if in.State != nil {
		state = in.State.Name
	}
	code, msg := stateReason(in)
	switch state {
	case types.InstanceStateNamePending:
		out.State = launcher.StatePending
	case types.InstanceStateNameRunning:
		out.State = launcher.StateRunning
	default:
		out.State = launcher.StateTerminated
		out.Reason = string(state) + ": " + msg
		switch {
		case code == reasonSpotTermination:
			out.State = launcher.StatePreempted
		case in.InstanceLifecycle == types.InstanceLifecycleTypeCapacityBlock && strings.HasPrefix(code, "Server."):
			// EC2 ended it with its capacity block: gone like a preempted spot instance.
			out.State, out.Reason = launcher.StatePreempted, blockReason(in)
		}
	}
	return out
}

// withExitCode adds the exit status a job's node marked before it powered off (job.go). While
// EC2 has not posted it yet (console output lags on instances other than Nitro), a node still
// shutting down is reported running, so that it is not taken for lost; once terminated
// without a marked status, it is terminated with no exit code.
func (p *Provider) withExitCode(ctx context.Context, region string, in types.Instance, out launcher.Instance) launcher.Instance {
	if out.Labels[launcher.LabelJob] == "" || out.State != launcher.StateTerminated {
		return out
	}
	if code, _ := stateReason(in); code != reasonInstanceShutdown {
		return out
	}
	if rc, ok := p.exitCode(ctx, region, awssdk.ToString(in.InstanceId)); ok {
		out.ExitCode = &rc
		out.Reason = "exited with status " + strconv.Itoa(rc)
		return out
	}
	if in.State.Name == types.InstanceStateNameShuttingDown {
		out.State = launcher.StateRunning
		out.Reason = "shutting down; its exit status is not in its console output yet"
		return out
	}
	out.Reason += " (powered off without an exit status in its console output)"
	return out
}

// parseID splits "aws/REGION/INSTANCE-ID".
var _ launcher.Locator = (*Provider)(nil)

// Locate is the region of an instance id ("aws/REGION/ID"): EC2's API is regional.
func (p *Provider) Locate(id string) (region, zone string) {
	region, _, err := p.parseID(id)
	if err != nil {
		return "", ""
	}
	return region, ""
}

func (p *Provider) parseID(id string) (region, instanceID string, err error) {
	rest, ok := strings.CutPrefix(id, InfraName+"/")
	region, instanceID, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || !strings.HasPrefix(instanceID, "i-") || strings.Contains(instanceID, "/") {
		return "", "", fmt.Errorf("%w: %q is not an instance of %s (aws/REGION/i-...)", launcher.ErrInvalid, id, InfraName)
	}
	if _, err := p.client(region); err != nil {
		return "", "", err
	}
	return region, instanceID, nil
}

// Terminate terminates the instance. One that is already gone (unknown to EC2, or
// terminated) is not an error.
func (p *Provider) Terminate(ctx context.Context, id string) error {
	region, iid, err := p.parseID(id)
	if err != nil {
		return err
	}
	_, err = p.clients[region].TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{iid}})
	if err != nil && errorCode(err) != "InvalidInstanceID.NotFound" {
		return classify(err, "terminate "+iid)
	}
	p.log.Info("terminated instance", zap.String("id", id))
	return nil
}

// cleanUp runs a failed launch's clean-up (terminate what it started, delete its placement
// group): before the launch returns when it failed for its own reasons, so that the caller
// finds nothing left behind; in the background when EC2 itself failed (unavailable or
// throttled), since the clean-up's calls would wait out the same failure, for up to
// cleanupTimeout, while the caller should be trying another zone or infra. What the
// background clean-up cannot stop carries Ferry's labels, and List shows it.
func (p *Provider) cleanUp(launchErr error, cleanup func()) {
	if errors.Is(launchErr, launcher.ErrUnavailable) || errors.Is(launchErr, launcher.ErrThrottled) {
		go cleanup()
		return
	}
	cleanup()
}

// terminateQuietly terminates instances of a failed launch, outliving the launch's ctx.
func (p *Provider) terminateQuietly(region string, ids []string) {
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	_, err := p.clients[region].TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: ids})
	if err != nil && errorCode(err) != "InvalidInstanceID.NotFound" {
		p.log.Warn("terminate instances of a failed launch", zap.Strings("ids", ids), zap.Error(err))
	}
}

// List returns Ferry's instances whose tags include selector, in every configured region, those
// in a capacity block with the block's WindowEnd (reservations.go).
// Instances that ended are reported as StatePreempted (spot termination) or StateTerminated
// with EC2's reason while EC2 still shows them (about an hour), except those terminated through
// the API (Terminate, or a person in the console): they are already gone for the caller.
//
// Regions are listed at once (perRegion), and one that fails or has not answered when ctx ends
// is a launcher.Gap{Infra: "aws", Region: r} in a launcher.PartialList error returned with what
// the other regions listed, so that callers treat its instances as unknown rather than gone.
// Only when every region fails for a reason that is not the infra's failing (the credentials,
// say) is that reason returned alone (regionsError).
func (p *Provider) List(ctx context.Context, selector map[string]string) ([]launcher.Instance, error) {
	filters := []types.Filter{{Name: awssdk.String("tag:" + launcher.LabelOwner), Values: []string{"true"}}}
	for _, k := range slices.Sorted(maps.Keys(selector)) {
		filters = append(filters, types.Filter{Name: awssdk.String("tag:" + k), Values: []string{selector[k]}})
	}
	out, gaps := perRegion(ctx, p.opts.Regions, func(ctx context.Context, region string) ([]launcher.Instance, error) {
		return p.listRegion(ctx, region, filters)
	})
	return out, p.regionsError(gaps)
}

// listRegion lists Ferry's instances in one region whose tags match filters.
func (p *Provider) listRegion(ctx context.Context, region string, filters []types.Filter) ([]launcher.Instance, error) {
	var out []launcher.Instance
	var inBlocks []blockInstance
	err := p.describe(ctx, region, filters, func(in types.Instance) {
		if in.State != nil && in.State.Name == types.InstanceStateNameTerminated {
			if code, _ := stateReason(in); code == reasonUserShutdown {
				return
			}
		}
		if cr := awssdk.ToString(in.CapacityReservationId); cr != "" && in.InstanceLifecycle == types.InstanceLifecycleTypeCapacityBlock {
			inBlocks = append(inBlocks, blockInstance{index: len(out), region: region, reservation: cr})
		}
		out = append(out, p.withExitCode(ctx, region, in, p.instance(region, in)))
	})
	if err != nil {
		return nil, err
	}
	p.setWindowEnds(ctx, out, inBlocks)
	p.adoptIngress(ctx, out)
	return out, nil
}

// describe pages through DescribeInstances with filters.
func (p *Provider) describe(ctx context.Context, region string, filters []types.Filter, each func(types.Instance)) error {
	pages := ec2.NewDescribeInstancesPaginator(p.clients[region], &ec2.DescribeInstancesInput{Filters: filters, MaxResults: awssdk.Int32(1000)})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return classify(err, "describe instances in "+region)
		}
		for _, r := range page.Reservations {
			for _, in := range r.Instances {
				each(in)
			}
		}
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}
