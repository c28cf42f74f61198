// Package fakeec2 is an in-process stand-in for Amazon EC2: an HTTP server that speaks the EC2
// Query API (form-encoded POST, XML answers in EC2's namespace, EC2's error envelope and HTTP
// statuses) for the subset Ferry's AWS provider calls, so tests drive the real aws-sdk-go-v2
// client. It is loopback only.
//
// What it models: regions and zones from the price catalog (AZ IDs like use1-az4, with
// account-style zone names that deliberately do not follow ID order), per-zone capacity per
// instance type, a per-region vCPU quota for on-demand instances (VcpuLimitExceeded) and a
// spot instance count limit (MaxSpotInstanceCountExceeded), spot prices from the catalog,
// security groups (ingress rules per source, CIDR block or security group, with descriptions,
// authorized and revoked as EC2 does), placement groups, each instance's metadata-service options (RunInstances'
// MetadataOptions, validated and reported), injected errors per zone, and spot preemption: a spot
// instance has a one-time spot request (DescribeSpotInstanceRequests), which shows EC2's
// interruption warning while the instance runs out its notice (PreemptWithNotice). Capacity
// Reservations and Capacity Blocks for ML (reservations.go, capacityblocks.go): scripted
// offerings, purchases, launches into a reservation counted against it, and a block's instances
// terminated before its end, as EC2 does.
//
// A VM "boots" by running its user-data with bash as a local process in a session of its own
// (the session is the machine: everything the user-data starts, in whatever process group,
// dies with it), with FERRY_HOST set to a loopback address (127.A.x.y, from a /16 the server
// owns) that is also the instance's private IP and is bindable, so a server started by the
// user-data is reachable at privateIp:port exactly as on a VPC, and VMs talk to each other on
// their private IPs. Output goes to LogDir/<instance-id>.log, which is the instance's console
// output (GetConsoleOutput, base64, the last 64 KiB) and is kept after the instance ends.
// Terminating or preempting an instance, or closing the server, sends SIGTERM to its session
// and SIGKILL after KillGrace.
//
// A guest that powers off (poweroff, shutdown or halt on the VM's PATH, which stand in for
// the guest's) shuts the instance down once its user-data ends: shutting-down, then
// terminated, with state reason Client.InstanceInitiatedShutdown, as EC2 does with
// InstanceInitiatedShutdownBehavior terminate. A user-data that just ends leaves the instance
// running, as on EC2.
//
// Each VM reaches its instance metadata service (IMDSv2 tokens, instance tags when
// InstanceMetadataTags is enabled, spot/instance-action once warned) at the URL in its
// FERRY_IMDS_ENDPOINT, served by this server (imds.go), and gets a state directory and a
// disk root of its own (FERRY_STATE_DIR, FERRY_VM_ROOT) so that VMs on one host do not share
// a disk. CreateTags tags instances after launch.
//
// Outages (Outages, faults.go): the fault switch of launcher/fakefault turns matching API
// requests into EC2's answers in an outage (503 Unavailable, 500 InternalError, throttling
// with RequestLimitExceeded), late answers, or connections that never answer, per action,
// region or zone, for tests and for `ferry fakecloud --fault`.
//
// Credentials: every request must carry a SigV4 Authorization header; signatures are not
// verified. The region is read from the header's credential scope, so one server is every
// region. Access keys in Options.BadAccessKeys get AuthFailure, in DeniedAccessKeys
// UnauthorizedOperation.
package fakeec2

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryserve/ferry/launcher/catalog"
	"github.com/ferryserve/ferry/launcher/fakefault"
)

// Options configures a Server. Zero values are usable.
type Options struct {
	// LogDir holds each VM's user-data and output; default a new temporary directory that
	// Close removes.
	LogDir string
	// Subnet is the loopback /16 VMs get addresses from, as "127.A"; default a random A in
	// [64, 250), so servers in parallel test processes rarely share one.
	Subnet string
	// BadAccessKeys are rejected with AuthFailure (401); DeniedAccessKeys with
	// UnauthorizedOperation (403) on every action but DescribeAvailabilityZones.
	BadAccessKeys    []string
	DeniedAccessKeys []string
	// DeniedActions are refused with UnauthorizedOperation for every key, as by an IAM policy
	// that lacks them.
	DeniedActions []string
	// VCPULimit is each region's on-demand vCPU quota over live instances; 0 is unlimited.
	VCPULimit int
	// SpotInstanceLimit is each region's limit on live spot instances; 0 is unlimited.
	SpotInstanceLimit int
	// DefaultCapacity is how many live instances of one type a zone holds; 0 is unlimited.
	// SetCapacity overrides it per zone and type.
	DefaultCapacity int
	// BootDelay is how long an instance stays pending; default 50ms.
	BootDelay time.Duration
	// ShutdownDelay is how long an instance stays shutting-down; default 50ms.
	ShutdownDelay time.Duration
	// KillGrace is how long a VM's processes get between SIGTERM and SIGKILL; default 2s.
	KillGrace time.Duration
	// Env is added to every VM's environment (after this process's own, e.g. PATH).
	Env []string
	// Catalog supplies zones, vCPUs and spot prices; default catalog.Default().
	Catalog *catalog.Catalog
	// Now is the clock; default time.Now.
	Now func() time.Time
	// MetadataDefaults are the account's instance-metadata defaults (what
	// ModifyInstanceMetadataDefaults sets) for the MetadataOptions fields RunInstances leaves
	// out; zero fields are EC2's own defaults (optional tokens, hop limit 1, endpoint enabled).
	MetadataDefaults MetadataOptions
	// InterruptionStatus is the status code a spot request gets at PreemptWithNotice's
	// warning: StatusNoCapacity (default), which EC2 documents for one-time requests whose
	// instances terminate on interruption, or StatusMarkedForTermination.
	InterruptionStatus string
	// CapacityBlockTerminationLead is how long before a capacity block's end its instances are
	// terminated; default DefaultCapacityBlockTerminationLead, EC2's 30 minutes (capacityblocks.go).
	CapacityBlockTerminationLead time.Duration
}

// Spot termination reason EC2 reports in an instance's StateReason.
const (
	ReasonSpotTermination = "Server.SpotInstanceTermination"
	ReasonUserShutdown    = "Client.UserInitiatedShutdown"
	ownerID               = "123456789012"
)

// Server is a fake EC2 endpoint. Create it with New and Close it when done.
type Server struct {
	opts Options
	// outages are the API-level faults set on this fake (Outages).
	outages fakefault.Switch
	ln      net.Listener
	srv     *http.Server
	tempDir bool
	// stopping is closed by Close, releasing requests held by a hang or delay fault.
	stopping  chan struct{}
	closeOnce sync.Once
	// held counts the requests a hang or delay fault holds now (Held).
	held atomic.Int64
	// calls counts API requests by action and region, faulted ones included (Calls).
	callsMu sync.Mutex
	calls   map[string]int

	mu         sync.Mutex
	regions    map[string]*region
	instances  map[string]*instance // by instance id
	order      []string             // instance ids in launch order
	zoneErrors map[string]*APIError // by zone id
	capacity   map[string]int       // "zoneID/type" -> live instances allowed
	// spotCapacity is zone ID → live spot instances allowed, of any type, not counting
	// those warned of their interruption.
	spotCapacity map[string]int
	spotPrices   map[string]float64 // "zoneID/type" -> price
	vcpus        map[string]int     // instance type -> vCPUs
	tokens       map[string]string  // client token -> reservation id
	nextIP       int
	closed       bool
	vms          sync.WaitGroup
	wakeups      map[*time.Timer]bool // pending reclaim checks, see wakeAfter
	imdsTokens   map[string]imdsToken // IMDSv2 session tokens
	wakeWG       sync.WaitGroup
	book         reservationBook // capacity reservations and blocks (reservations.go)
}

type region struct {
	name      string
	zones     []zone
	groups    map[string]*securityGroup  // by name
	placement map[string]*placementGroup // by name
}

type zone struct{ id, name string }

type securityGroup struct {
	id, name, description string
	rules                 []ingressRule
	tags                  map[string]string
}

type placementGroup struct {
	id, name, strategy string
	tags               map[string]string
}

// New starts a Server on a free loopback port.
func New(opts Options) (*Server, error) {
	if opts.Catalog == nil {
		opts.Catalog = catalog.Default()
	}
	if opts.BootDelay <= 0 {
		opts.BootDelay = 50 * time.Millisecond
	}
	if opts.ShutdownDelay <= 0 {
		opts.ShutdownDelay = 50 * time.Millisecond
	}
	if opts.KillGrace <= 0 {
		opts.KillGrace = 2 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.CapacityBlockTerminationLead <= 0 {
		opts.CapacityBlockTerminationLead = DefaultCapacityBlockTerminationLead
	}
	switch opts.InterruptionStatus {
	case "":
		opts.InterruptionStatus = StatusNoCapacity
	case StatusNoCapacity, StatusMarkedForTermination:
	default:
		return nil, fmt.Errorf("fakeec2: interruption status %q is neither %s nor %s", opts.InterruptionStatus, StatusNoCapacity, StatusMarkedForTermination)
	}
	if opts.Subnet == "" {
		b := make([]byte, 1)
		_, _ = rand.Read(b)
		opts.Subnet = fmt.Sprintf("127.%d", 64+int(b[0])%186)
	}
	if ip := net.ParseIP(opts.Subnet + ".0.1"); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("fakeec2: subnet %q is not a loopback 127.A", opts.Subnet)
	}
	s := &Server{
		opts: opts, regions: map[string]*region{}, instances: map[string]*instance{},
		zoneErrors: map[string]*APIError{}, capacity: map[string]int{}, spotCapacity: map[string]int{}, spotPrices: map[string]float64{},
		vcpus: map[string]int{}, tokens: map[string]string{}, wakeups: map[*time.Timer]bool{}, imdsTokens: map[string]imdsToken{},
		stopping: make(chan struct{}), calls: map[string]int{},
	}
	if s.opts.LogDir == "" {
		dir, err := os.MkdirTemp("", "fakeec2-")
		if err != nil {
			return nil, fmt.Errorf("fakeec2: %w", err)
		}
		s.opts.LogDir, s.tempDir = dir, true
	} else if err := os.MkdirAll(s.opts.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("fakeec2: %w", err)
	}
	s.loadCatalog()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fakeec2: %w", err)
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// loadCatalog builds regions, zones, vCPUs and spot prices from the catalog's AWS rows. Zone
// names are assigned so that ID order and name order differ (use1-az1 is us-east-1b), as in a
// real account, so code that confuses the two fails against the fake.
func (s *Server) loadCatalog() {
	ids := map[string][]string{}
	for _, r := range s.opts.Catalog.Rows() {
		if r.Cloud != catalog.AWS {
			continue
		}
		if !slices.Contains(ids[r.Region], r.Zone) {
			ids[r.Region] = append(ids[r.Region], r.Zone)
		}
		s.vcpus[r.InstanceType] = int(r.VCPUs)
		if r.SpotPerHour > 0 {
			s.spotPrices[r.Zone+"/"+r.InstanceType] = r.SpotPerHour
		}
	}
	for name, zs := range ids {
		slices.Sort(zs)
		reg := &region{name: name, groups: map[string]*securityGroup{}, placement: map[string]*placementGroup{}}
		for i, id := range zs {
			reg.zones = append(reg.zones, zone{id: id, name: name + string(rune('a'+(i+1)%len(zs)))})
		}
		s.regions[name] = reg
	}
}

// URL is the endpoint to give the SDK (BaseEndpoint).
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// LogDir is where VMs' user-data and logs are written.
func (s *Server) LogDir() string { return s.opts.LogDir }

// Close stops serving (requests a hang fault holds are dropped), cancels scheduled reclaims,
// kills every VM and waits for their processes to end.
func (s *Server) Close() error {
	err := s.srv.Close()
	s.closeOnce.Do(func() { close(s.stopping) })
	s.mu.Lock()
	s.closed = true
	s.stopWakeups()
	for _, in := range s.instances {
		if in.vm != nil {
			in.vm.kill(s.opts.KillGrace)
		}
	}
	s.mu.Unlock()
	s.wakeWG.Wait()
	s.vms.Wait()
	if s.tempDir {
		_ = os.RemoveAll(s.opts.LogDir)
	}
	return err
}

// ZoneNames returns region's zones as AZ ID → zone name.
func (s *Server) ZoneNames(regionName string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	if reg := s.regions[regionName]; reg != nil {
		for _, z := range reg.zones {
			out[z.id] = z.name
		}
	}
	return out
}

// SetCapacity sets how many live instances of instanceType zone (an AZ ID or name) holds.
func (s *Server) SetCapacity(zone, instanceType string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.capacity[s.zoneID(zone)+"/"+instanceType] = n
}

// SetSpotCapacity sets how many live spot instances zone (an AZ ID or name) holds, of any
// type, not counting those already warned of their interruption: a spot RunInstances beyond
// it fails with InsufficientInstanceCapacity, as EC2 answers when a pool runs out. On-demand
// launches are not affected. Negative removes the limit.
func (s *Server) SetSpotCapacity(zone string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n < 0 {
		delete(s.spotCapacity, s.zoneID(zone))
		return
	}
	s.spotCapacity[s.zoneID(zone)] = n
}

// SetSpotPrice sets the spot price of instanceType in zone (an AZ ID or name).
func (s *Server) SetSpotPrice(zone, instanceType string, price float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.spotPrices[s.zoneID(zone)+"/"+instanceType] = price
}

// FailZone makes every RunInstances into zone (an AZ ID or name) fail with code (for example
// InsufficientInstanceCapacity or SpotMaxPriceTooLow) until ClearZone. An empty code clears.
func (s *Server) FailZone(zone, code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.zoneID(zone)
	if code == "" {
		delete(s.zoneErrors, id)
		return
	}
	s.zoneErrors[id] = apiErr(code, "Injected failure in %s: %s", id, code)
}

// ClearZone removes FailZone's error.
func (s *Server) ClearZone(zone string) { s.FailZone(zone, "") }

// zoneID maps a zone name to its ID; an ID (or unknown string) is returned as is.
func (s *Server) zoneID(z string) string {
	for _, reg := range s.regions {
		for _, zz := range reg.zones {
			if zz.name == z {
				return zz.id
			}
		}
	}
	return z
}

// Outages is the fake's outage switch: while a fault is set, the API requests it matches fail
// as a real endpoint fails (launcher/fakefault; faults.go says how EC2's are answered).
func (s *Server) Outages() *fakefault.Switch { return &s.outages }

// ServeHTTP answers one EC2 Query API request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reqID := newID("")
	if rest, ok := strings.CutPrefix(r.URL.Path, imdsPrefix); ok {
		s.serveIMDS(w, r, rest)
		return
	}
	if r.Method != http.MethodPost {
		writeError(w, reqID, apiErr("InvalidAction", "Only POST is supported"))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	if err := r.ParseForm(); err != nil {
		writeError(w, reqID, apiErr("MalformedQueryString", "%v", err))
		return
	}
	p := params(r.PostForm)
	akid, regionName, aerr := s.authorize(r.Header.Get("Authorization"))
	if aerr != nil {
		writeError(w, reqID, aerr)
		return
	}
	action := p.get("Action")
	s.countCall(action, regionName)
	if f, ok := s.outages.Match(s.faultRequest(action, regionName, p)); ok {
		if (f.Delay > 0 || f.Hang) && !s.hold(r, f) {
			panic(http.ErrAbortHandler) // nobody to answer: drop the connection
		}
		if aerr := faultError(f); aerr != nil {
			writeError(w, reqID, aerr)
			return
		}
	}
	if slices.Contains(s.opts.DeniedAccessKeys, akid) && action != "DescribeAvailabilityZones" || slices.Contains(s.opts.DeniedActions, action) {
		writeError(w, reqID, apiErr("UnauthorizedOperation", "You are not authorized to perform this operation. User: arn:aws:iam::%s:user/%s is not authorized to perform: ec2:%s", ownerID, akid, action))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	reg := s.regions[regionName]
	if reg == nil {
		writeError(w, reqID, apiErr("AuthFailure", "AWS was not able to validate the provided access credentials (unknown region %q)", regionName))
		return
	}
	s.advance()
	m := meta{Xmlns: Namespace, RequestID: reqID}
	var (
		out any
		err *APIError
	)
	switch action {
	case "RunInstances":
		out, err = s.runInstances(m, reg, p)
	case "DescribeInstances":
		out, err = s.describeInstances(m, reg, p)
	case "TerminateInstances":
		out, err = s.terminateInstances(m, reg, p)
	case "DescribeAvailabilityZones":
		out, err = s.describeAvailabilityZones(m, reg, p)
	case "DescribeImages":
		out, err = s.describeImages(m, p)
	case "DescribeSpotInstanceRequests":
		out, err = s.describeSpotInstanceRequests(m, reg, p)
	case "DescribeSpotPriceHistory":
		out, err = s.describeSpotPriceHistory(m, reg, p)
	case "CreateSecurityGroup":
		out, err = s.createSecurityGroup(m, reg, p)
	case "DescribeSecurityGroups":
		out, err = s.describeSecurityGroups(m, reg, p)
	case "AuthorizeSecurityGroupIngress":
		out, err = s.authorizeSecurityGroupIngress(m, reg, p)
	case "RevokeSecurityGroupIngress":
		out, err = s.revokeSecurityGroupIngress(m, reg, p)
	case "CreatePlacementGroup":
		out, err = s.createPlacementGroup(m, reg, p)
	case "DescribePlacementGroups":
		out, err = s.describePlacementGroups(m, reg, p)
	case "DeletePlacementGroup":
		out, err = s.deletePlacementGroup(m, reg, p)
	case "GetConsoleOutput":
		out, err = s.getConsoleOutput(m, reg, p)
	case "CreateTags":
		out, err = s.createTags(m, reg, p)
	case "GetSpotPlacementScores":
		out, err = s.getSpotPlacementScores(m, p)
	case "DescribeCapacityReservations":
		out, err = s.describeCapacityReservations(m, reg, p)
	case "DescribeCapacityBlockOfferings":
		out, err = s.describeCapacityBlockOfferings(m, reg, p)
	case "PurchaseCapacityBlock":
		out, err = s.purchaseCapacityBlock(m, reg, p)
	default:
		err = apiErr("InvalidAction", "The action %s is not valid for this web service.", action)
	}
	if err != nil {
		writeError(w, reqID, err)
		return
	}
	writeXML(w, http.StatusOK, out)
}

func (s *Server) countCall(action, regionName string) {
	s.callsMu.Lock()
	defer s.callsMu.Unlock()
	s.calls[action+"/"+regionName]++
}

// Calls is how many requests for action in regionName the server has received (answered,
// faulted or held): a test tells a caller that backs off from one that hammers a failing
// endpoint.
func (s *Server) Calls(action, regionName string) int {
	s.callsMu.Lock()
	defer s.callsMu.Unlock()
	return s.calls[action+"/"+regionName]
}

// authorize reads the access key and region from a SigV4 Authorization header:
// "AWS4-HMAC-SHA256 Credential=AKID/DATE/REGION/ec2/aws4_request, SignedHeaders=..., Signature=...".
func (s *Server) authorize(h string) (akid, regionName string, err *APIError) {
	if h == "" {
		return "", "", apiErr("MissingAuthenticationToken", "Request is missing Authentication Token")
	}
	_, cred, ok := strings.Cut(h, "Credential=")
	if !strings.HasPrefix(h, "AWS4-HMAC-SHA256 ") || !ok {
		return "", "", apiErr("AuthFailure", "AWS was not able to validate the provided access credentials")
	}
	cred, _, _ = strings.Cut(cred, ",")
	parts := strings.Split(cred, "/")
	if len(parts) != 5 || parts[3] != "ec2" {
		return "", "", apiErr("AuthFailure", "AWS was not able to validate the provided access credentials")
	}
	if slices.Contains(s.opts.BadAccessKeys, parts[0]) {
		return "", "", apiErr("AuthFailure", "AWS was not able to validate the provided access credentials")
	}
	return parts[0], parts[2], nil
}

// newID returns prefix and 17 hex digits, the shape of EC2's long resource ids.
func newID(prefix string) string {
	b := make([]byte, 9)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)[:17]
}

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

var errClosed = errors.New("fakeec2: server closed")
