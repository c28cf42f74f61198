// Package fakecompute is an in-process Compute Engine: an HTTP server that speaks the Compute
// REST/JSON API v1 for the subset Ferry's GCP provider calls through the real
// cloud.google.com/go/compute REST clients — instances insert/get/list/delete, zone and global
// operations get/list/wait, firewalls insert/get/update/delete, zones list/get.
//
// Bodies are the API's JSON (computepb messages through protojson, the same encoding the
// client uses), HTTP errors are Google's JSON error envelope, and failed operations carry
// error.errors[].code with httpErrorStatusCode as GCP's do. The fake models per-zone capacity
// per machine type (ZONE_RESOURCE_POOL_EXHAUSTED), a GPU quota per region (QUOTA_EXCEEDED),
// GPU machines that must terminate on host maintenance (UNSUPPORTED_OPERATION), Spot VMs and
// their preemption (Preempt), insert failures per zone (InjectFault), outages of any method in
// any zone — error statuses, throttling, hangs (Outages, outages.go) — bearer tokens that are refused, and
// firewall rules with GCP's validation and defaults (priority 1000; an ingress rule naming no
// source admits 0.0.0.0/0), which tests read back; traffic to VMs is not filtered.
//
// A VM boots by running its startup-script metadata with bash as a local process in a session
// of its own (the session is the machine), with FERRY_HOST set to the VM's own loopback address
// (127.66.0.0/16, also its networkInterfaces[0].networkIP, bindable, so VMs reach each other
// on it), so a replica on the fake cloud really serves. Its output goes to a log file under
// Options.Dir, which is the VM's serial port 1 (instances.getSerialPortOutput, by byte offset,
// the last 1 MiB) and is kept after the VM stops. Delete, preemption and Close kill the
// session. A guest that powers off (poweroff, shutdown or halt on the VM's PATH stand in for
// the guest's) stops the VM once its script ends: STOPPING, then TERMINATED, as on GCE.
//
// Each VM reaches its metadata server (instance attributes, which setMetadata changes after
// insert, and instance/preempted) at the URL in its FERRY_GCE_METADATA_URL, served by this
// handler under /_metadata/ (metadata.go), and gets a state directory and a disk root of its
// own (FERRY_STATE_DIR, FERRY_VM_ROOT). PreemptWithNotice preempts a Spot VM with GCE's notice
// (Options.PreemptionNotice); Preempt stops it at once.
package fakecompute

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/ferryserve/ferry/launcher/fakefault"
	"github.com/ferryserve/ferry/launcher/internal/fakevm"
)

// DefaultZones are the zones a Server serves when Options.Zones is empty: catalog zones.
var DefaultZones = []string{"us-central1-a", "us-central1-b", "us-central1-c", "us-east1-b", "us-east1-c",
	"us-west1-a", "us-west1-b", "europe-west4-a", "asia-east1-a"}

// PreemptionNotice is how long Compute Engine lets a Spot VM run once its preemption starts.
const PreemptionNotice = 30 * time.Second

// Operation types GCP records; PreemptedOperation is the one a Spot VM's preemption leaves.
const (
	PreemptedOperation = "compute.instances.preempted"
	waitLimit          = 2 * time.Minute // GCP's operations.wait returns by then even if not DONE
	killWait           = 10 * time.Second
	timeLayout         = "2006-01-02T15:04:05.000-07:00"
	maxBody            = 4 << 20 // the largest request body read
)

// Options configures a Server.
type Options struct {
	// Project is the one project served; requests for another get 404. Default "ferry-fake".
	Project string
	// Zones served; default DefaultZones.
	Zones []string
	// Dir holds each VM's startup script, working directory and log. Required for VMs to boot.
	Dir string
	// OpDelay is how long an operation stays RUNNING before it is DONE (so clients really wait).
	// Zero means DefaultOpDelay; negative means operations are DONE in the insert response.
	OpDelay time.Duration
	// DeniedTokens maps bearer tokens to the status they get: 401 (invalid credentials) or 403
	// (permission denied). Any other token, or none, is accepted.
	DeniedTokens map[string]int
	// Env is added to every VM process's environment (after the server's own).
	Env []string
	// PreemptionNotice is how long a VM runs after PreemptWithNotice, GCE's 30 s by default;
	// tests shorten it. VMs are told it in FERRY_GCE_PREEMPTION_NOTICE_SECONDS.
	PreemptionNotice time.Duration
	// ServiceAccountToken is the access token a VM with a service account gets from its
	// metadata server; default DefaultServiceAccountToken.
	ServiceAccountToken string
}

// DefaultServiceAccountToken is Options.ServiceAccountToken's default.
const DefaultServiceAccountToken = "fake-gce-sa-token"

// DefaultPreemptionNotice is how long GCE lets a Spot VM run after its preemption notice.
const DefaultPreemptionNotice = 30 * time.Second

// DefaultOpDelay is Options.OpDelay's default.
const DefaultOpDelay = 20 * time.Millisecond

// Fault is an injected error for the next inserts in a zone: what GCP says about a request it
// accepted (capacity, quota). An outage of the API itself is set on Outages.
type Fault struct {
	// Code is an operation error code: CodeZoneResourcePoolExhausted, CodeQuotaExceeded,
	// CodeUnsupportedOperation, or any other.
	Code string
	// HTTP makes the insert fail synchronously with the code's HTTP form (Google's error
	// envelope) instead of returning an operation that fails.
	HTTP bool
	// Status overrides the HTTP status of the synchronous form (e.g. 403 PERMISSION_DENIED).
	Status int
	// Message; default is GCP's wording for the code.
	Message string
	// Times is how many inserts fail; 0 means until ClearFaults.
	Times int
}

// Server is the fake Compute API. It is an http.Handler (use httptest.NewServer); Close kills
// every VM process.
type Server struct {
	opts Options
	// outages are the API-level faults set on this fake (Outages); stop is closed by Close,
	// releasing the requests a hang holds.
	outages  fakefault.Switch
	stop     chan struct{}
	stopOnce sync.Once
	mux      *http.ServeMux

	mu sync.Mutex
	// metadataHost is host:port the server was last reached at, where VMs find their
	// metadata server (the fake is an http.Handler and does not know its listener).
	metadataHost string
	zones        map[string]*zoneState
	firewalls    map[string]*computepb.Firewall
	globalOps    map[string]*operation
	capacity     map[string]int // zone + "/" + machine type → max live instances
	// spotCapacity is zone → max live Spot VMs not yet told of their preemption.
	spotCapacity map[string]int
	timers       map[*time.Timer]bool
	gpuQuota     map[string]int // region → max GPUs in live instances
	faults       map[string][]*Fault
	closed       bool
	nextID       uint64
	// vms counts each booted VM until its script has ended, and each kill running in the
	// background (killLocked): Close waits for them, so that no VM process is left writing
	// in Options.Dir once it returns. Added to only with mu held and before closed is set.
	vms sync.WaitGroup
	// capacityState holds reservations and the flex-start queue (reservations.go, flexstart.go).
	capacityState
}

type zoneState struct {
	instances map[string]*instance
	ops       map[string]*operation
}

type instance struct {
	pb   *computepb.Instance
	gpus int
	vm   *fakevm.VM
	// preempting is true from a preemption's notice until the VM stops.
	preempting bool
}

type operation struct {
	pb   *computepb.Operation
	done chan struct{}
}

// New returns a Server; serve it with httptest.NewServer or http.Server on a loopback address.
func New(opts Options) *Server {
	if opts.Project == "" {
		opts.Project = "ferry-fake"
	}
	if len(opts.Zones) == 0 {
		opts.Zones = DefaultZones
	}
	if opts.OpDelay == 0 {
		opts.OpDelay = DefaultOpDelay
	}
	if opts.PreemptionNotice <= 0 {
		opts.PreemptionNotice = DefaultPreemptionNotice
	}
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	s := &Server{
		opts:         opts,
		stop:         make(chan struct{}),
		mux:          http.NewServeMux(),
		zones:        map[string]*zoneState{},
		firewalls:    map[string]*computepb.Firewall{},
		globalOps:    map[string]*operation{},
		capacity:     map[string]int{},
		spotCapacity: map[string]int{},
		timers:       map[*time.Timer]bool{},
		gpuQuota:     map[string]int{},
		faults:       map[string][]*Fault{},
		nextID:       binary.BigEndian.Uint64(seed[:]) >> 12,
	}
	for _, z := range opts.Zones {
		s.zones[z] = &zoneState{instances: map[string]*instance{}, ops: map[string]*operation{}}
	}
	p := "/compute/v1/projects/{project}/"
	s.route("GET "+p+"zones", OpZonesList, s.listZones)
	s.route("GET "+p+"zones/{zone}", OpZonesGet, s.getZone)
	s.route("POST "+p+"zones/{zone}/instances", OpInstancesInsert, s.insertInstance)
	s.route("GET "+p+"zones/{zone}/instances", OpInstancesList, s.listInstances)
	s.route("GET "+p+"zones/{zone}/instances/{name}", OpInstancesGet, s.getInstance)
	s.route("DELETE "+p+"zones/{zone}/instances/{name}", OpInstancesDelete, s.deleteInstance)
	s.route("POST "+p+"zones/{zone}/instances/{name}/setMetadata", OpInstancesSetMetadata, s.setMetadata)
	s.route("GET "+p+"zones/{zone}/instances/{name}/serialPort", OpInstancesGetSerialPort, s.getSerialPortOutput)
	s.mux.HandleFunc("GET "+metadataPrefix+"{zone}/{name}/computeMetadata/v1/{path...}", s.serveMetadata)
	s.route("GET "+p+"zones/{zone}/operations", OpZoneOperationsList, s.listZoneOperations)
	s.route("GET "+p+"zones/{zone}/operations/{op}", OpZoneOperationsGet, s.getZoneOperation)
	s.route("POST "+p+"zones/{zone}/operations/{op}/wait", OpZoneOperationsWait, s.getZoneOperation)
	s.route("POST "+p+"global/firewalls", OpFirewallsInsert, s.insertFirewall)
	s.route("GET "+p+"global/firewalls/{name}", OpFirewallsGet, s.getFirewall)
	s.route("PUT "+p+"global/firewalls/{name}", OpFirewallsUpdate, s.updateFirewall)
	s.route("DELETE "+p+"global/firewalls/{name}", OpFirewallsDelete, s.deleteFirewall)
	s.route("GET "+p+"global/operations/{op}", OpGlobalOperationsGet, s.getGlobalOperation)
	s.routeCapacity(p)
	s.route("POST "+p+"global/operations/{op}/wait", OpGlobalOperationsWait, s.getGlobalOperation)
	return s
}

// Outages is the fake's outage switch: while a fault is set, the API requests it matches fail
// as a real endpoint fails (outages.go names the operations; launcher/fakefault the faults).
func (s *Server) Outages() *fakefault.Switch { return &s.outages }

// ServeHTTP authenticates the request and routes it; each API method meets the outage switch
// on its way (route).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, metadataPrefix) {
		// A VM's metadata server takes no credentials.
		s.mux.ServeHTTP(w, r)
		return
	}
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	switch s.opts.DeniedTokens[tok] {
	case 0:
	case http.StatusUnauthorized:
		apiError{code: 401, reason: "authError", status: "UNAUTHENTICATED",
			message: "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential."}.write(w)
		return
	default:
		apiError{code: 403, reason: "forbidden", status: "PERMISSION_DENIED",
			message: "Required 'compute.instances.list' permission for 'projects/" + s.opts.Project + "'"}.write(w)
		return
	}
	if rest, ok := strings.CutPrefix(r.URL.Path, "/compute/v1/projects/"); ok {
		if p, _, _ := strings.Cut(rest, "/"); p != s.opts.Project {
			errNotFound("projects/" + p).write(w)
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

// SetCapacity limits how many live (not TERMINATED) instances of machineType zone holds; an
// insert beyond it fails with ZONE_RESOURCE_POOL_EXHAUSTED. Negative removes the limit.
func (s *Server) SetCapacity(zone, machineType string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n < 0 {
		delete(s.capacity, zone+"/"+machineType)
		return
	}
	s.capacity[zone+"/"+machineType] = n
}

// SetSpotCapacity limits how many live Spot VMs zone holds, of any machine type, not counting
// those being preempted; an insert of a Spot VM beyond it fails with
// ZONE_RESOURCE_POOL_EXHAUSTED (a Spot stockout). Negative removes the limit.
func (s *Server) SetSpotCapacity(zone string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n < 0 {
		delete(s.spotCapacity, zone)
		return
	}
	s.spotCapacity[zone] = n
}

// SpotVM is a live Spot VM as SpotVMs lists it.
type SpotVM struct {
	Name, Zone string
	// Created orders VMs by age (creationTimestamp); Preempting is true once its preemption
	// started.
	Created    time.Time
	Preempting bool
}

// VM is one VM as the fake holds it: what a test asks of the cloud itself, not of Ferry.
type VM struct {
	Name, Zone, Status string
	Labels             map[string]string
}

// VMs lists every VM the fake holds, whatever its status, by zone and name.
func (s *Server) VMs() []VM {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []VM
	for z, zs := range s.zones {
		for _, in := range zs.instances {
			out = append(out, VM{Name: in.pb.GetName(), Zone: z, Status: in.pb.GetStatus(), Labels: maps.Clone(in.pb.GetLabels())})
		}
	}
	slices.SortFunc(out, func(a, b VM) int { return strings.Compare(a.Zone+"/"+a.Name, b.Zone+"/"+b.Name) })
	return out
}

// SpotVMs lists the live (not TERMINATED) Spot VMs, oldest first.
func (s *Server) SpotVMs() []SpotVM {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []SpotVM
	for z, zs := range s.zones {
		for _, in := range zs.instances {
			if in.pb.GetStatus() == "TERMINATED" || !isSpotVM(in.pb) {
				continue
			}
			created, _ := time.Parse(timeLayout, in.pb.GetCreationTimestamp())
			out = append(out, SpotVM{Name: in.pb.GetName(), Zone: z, Created: created, Preempting: in.preempting})
		}
	}
	slices.SortFunc(out, func(a, b SpotVM) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

func isSpotVM(pb *computepb.Instance) bool {
	return pb.GetScheduling().GetProvisioningModel() == "SPOT" || pb.GetScheduling().GetPreemptible()
}

// SetGPUQuota limits the GPUs (attached and built into a2/a3/g2 machine types) of live
// instances in region; an insert beyond it fails with QUOTA_EXCEEDED. Negative removes it.
func (s *Server) SetGPUQuota(region string, gpus int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gpus < 0 {
		delete(s.gpuQuota, region)
		return
	}
	s.gpuQuota[region] = gpus
}

// InjectFault makes the next inserts in zone fail as f says.
func (s *Server) InjectFault(zone string, f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[zone] = append(s.faults[zone], &f)
}

// ClearFaults removes every injected fault of zone.
func (s *Server) ClearFaults(zone string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.faults, zone)
}

// Instance returns a copy of the named instance as the API would, and its zone.
func (s *Server) Instance(name string) (*computepb.Instance, string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for z, zs := range s.zones {
		if in, ok := zs.instances[name]; ok {
			return proto.CloneOf(in.pb), z, true
		}
	}
	return nil, "", false
}

// LogPath is where the named VM's startup script writes its output.
func (s *Server) LogPath(zone, name string) string {
	return s.vmDir(zone, name) + ".log"
}

// Preempt reclaims a Spot VM as GCP does: its processes are killed, it goes to TERMINATED
// (or is deleted when its instanceTerminationAction is DELETE), and a DONE
// compute.instances.preempted operation targeting it is recorded in its zone.
func (s *Server) Preempt(name string) error { return s.PreemptWithNotice(name, 0) }

// PreemptWithNotice starts a Spot VM's preemption now, as GCP does, and ends it notice later:
// the compute.instances.preempted operation is recorded at once (what Ferry's preemption
// watcher reads), the VM is STOPPING through the notice (GCP's is 30 s,
// Options.PreemptionNotice, which the VM's environment tells its boot script) while its
// processes run on and its metadata server answers instance/preempted TRUE, then its
// processes are killed and it goes to TERMINATED, or is deleted with
// instanceTerminationAction DELETE. 0 does it all at once. From the start it no longer counts
// against the zone's SetSpotCapacity. GCE also sends the guest an ACPI shutdown at the notice,
// which makes the OS send SIGTERM to every process; the fake does not, so that only the VM's
// own watcher signals a job's program.
func (s *Server) PreemptWithNotice(name string, notice time.Duration) error {
	if notice < 0 {
		return fmt.Errorf("fakecompute: negative notice %v", notice)
	}
	s.mu.Lock()
	var (
		found *instance
		zone  string
	)
	for z, zs := range s.zones {
		if in, ok := zs.instances[name]; ok {
			found, zone = in, z
		}
	}
	if found == nil {
		s.mu.Unlock()
		return fmt.Errorf("fakecompute: no instance %q", name)
	}
	if !isSpotVM(found.pb) {
		s.mu.Unlock()
		return fmt.Errorf("fakecompute: %s is not a Spot VM", name)
	}
	if found.preempting {
		s.mu.Unlock()
		return fmt.Errorf("fakecompute: %s is already being preempted", name)
	}
	if found.pb.GetStatus() == "TERMINATED" {
		s.mu.Unlock()
		return fmt.Errorf("fakecompute: %s is already TERMINATED", name)
	}
	found.preempting = true
	op := s.newOperationLocked(zone, PreemptedOperation, found.pb)
	op.pb.User = proto.String("system")
	op.pb.StatusMessage = proto.String("Instance was preempted.")
	s.finishLocked(op)
	// GCE shows a preempted VM STOPPING through the notice; its metadata server answers
	// instance/preempted TRUE (metadata.go) and its processes run on until the notice ends.
	found.pb.Status = proto.String("STOPPING")
	if notice == 0 {
		v := s.stopPreemptedLocked(zone, name, found)
		s.mu.Unlock()
		v.Kill(killWait)
		return nil
	}
	var t *time.Timer
	t = time.AfterFunc(notice, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.timers, t)
		if s.closed {
			return
		}
		s.killLocked(s.stopPreemptedLocked(zone, name, found))
	})
	s.timers[t] = true
	s.mu.Unlock()
	return nil
}

// stopPreemptedLocked ends a preempted VM's run and returns its process for the caller to
// kill outside the lock.
func (s *Server) stopPreemptedLocked(zone, name string, in *instance) *fakevm.VM {
	in.pb.Status = proto.String("TERMINATED")
	in.pb.LastStopTimestamp = proto.String(time.Now().Format(timeLayout))
	in.preempting = false
	v := in.vm
	in.vm = nil
	if in.pb.GetScheduling().GetInstanceTerminationAction() == "DELETE" {
		delete(s.zones[zone].instances, name)
	}
	return v
}

// Close kills every VM process and waits for them all, also those of VMs already deleted
// whose kill is still under way, stops pending operations and drops the requests a hang holds
// (so that closing the HTTP listener, which is the caller's, does not wait on them; close this
// first). It may be called more than once.
func (s *Server) Close() {
	s.stopOnce.Do(func() { close(s.stop) })
	s.mu.Lock()
	s.closed = true
	for t := range s.timers {
		t.Stop()
	}
	clear(s.timers)
	var vms []*fakevm.VM
	for _, zs := range s.zones {
		for _, in := range zs.instances {
			if in.vm != nil {
				vms = append(vms, in.vm)
				in.vm = nil
			}
		}
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, v := range vms {
		wg.Go(func() { v.Kill(killWait) })
	}
	wg.Wait()
	// The VMs taken out of their instances before (deleted, preempted, at a window's end)
	// may still be being killed.
	s.vms.Wait()
}

func (s *Server) zone(w http.ResponseWriter, r *http.Request) (string, *zoneState, bool) {
	z := r.PathValue("zone")
	zs, ok := s.zones[z]
	if !ok {
		errNotFound("projects/" + s.opts.Project + "/zones/" + z).write(w)
	}
	return z, zs, ok
}

func regionOf(zone string) string {
	if i := strings.LastIndexByte(zone, '-'); i > 0 {
		return zone[:i]
	}
	return zone
}

func (s *Server) baseURL() string {
	return "https://compute.googleapis.com/compute/v1/projects/" + s.opts.Project
}

func (s *Server) zoneURL(zone string) string { return s.baseURL() + "/zones/" + zone }

func (s *Server) listZones(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	list := &computepb.ZoneList{Kind: proto.String("compute#zoneList"), Id: proto.String("projects/" + s.opts.Project + "/zones")}
	for _, z := range slices.Sorted(maps.Keys(s.zones)) {
		list.Items = append(list.Items, s.zonePB(z))
	}
	writeJSON(w, list)
}

func (s *Server) zonePB(z string) *computepb.Zone {
	return &computepb.Zone{Kind: proto.String("compute#zone"), Name: proto.String(z), Status: proto.String("UP"),
		Region: proto.String(s.baseURL() + "/regions/" + regionOf(z)), SelfLink: proto.String(s.zoneURL(z))}
}

func (s *Server) getZone(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	z, _, ok := s.zone(w, r)
	if ok {
		writeJSON(w, s.zonePB(z))
	}
}

// decodeBody reads a request body of at most 4 MiB into msg as the API's JSON; it answers 400
// and reports false when it cannot.
func decodeBody(w http.ResponseWriter, r *http.Request, msg proto.Message) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		errInvalid("read body: " + err.Error()).write(w)
		return false
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(body, msg); err != nil {
		errInvalid("Invalid JSON payload received. " + err.Error()).write(w)
		return false
	}
	return true
}

var nameRE = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

func (s *Server) insertInstance(w http.ResponseWriter, r *http.Request) {
	req := &computepb.Instance{}
	if !decodeBody(w, r, req) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.metadataHost = r.Host
	zone, zs, ok := s.zone(w, r)
	if !ok {
		return
	}
	if apiErr, bad := s.validateInsert(req); bad {
		apiErr.write(w)
		return
	}
	if f := s.takeFaultLocked(zone); f != nil {
		msg := f.Message
		if msg == "" {
			msg = defaultMessage(f.Code, zone)
		}
		if f.HTTP {
			e := httpFormOf(f.Code, msg)
			if f.Status != 0 {
				e.code = f.Status
			}
			e.write(w)
			return
		}
		s.writeFailedOpLocked(w, zone, req, f.Code, msg)
		return
	}
	if _, dup := zs.instances[req.GetName()]; dup {
		errConflict("projects/" + s.opts.Project + "/zones/" + zone + "/instances/" + req.GetName()).write(w)
		return
	}
	if bad, code, msg := s.checkReservationLocked(zone, req); bad != nil || code != "" {
		if bad != nil {
			bad.write(w)
		} else {
			s.writeFailedOpLocked(w, zone, req, code, msg)
		}
		return
	}
	machineType := lastSegment(req.GetMachineType())
	gpus := builtinGPUs(machineType)
	for _, a := range req.GetGuestAccelerators() {
		if !strings.HasPrefix(machineType, "n1-") {
			s.writeFailedOpLocked(w, zone, req, CodeUnsupportedOperation,
				fmt.Sprintf("Machine type %s does not support attaching accelerators.", machineType))
			return
		}
		gpus += int(a.GetAcceleratorCount())
	}
	if gpus > 0 && req.GetScheduling().GetOnHostMaintenance() != "TERMINATE" {
		s.writeFailedOpLocked(w, zone, req, CodeUnsupportedOperation,
			"Instances with guest accelerators do not support live migration.")
		return
	}
	if limit, ok := s.spotCapacity[zone]; ok && isSpotVM(req) {
		spot := 0
		for _, in := range zs.instances {
			if in.pb.GetStatus() != "TERMINATED" && !in.preempting && isSpotVM(in.pb) {
				spot++
			}
		}
		if spot >= limit {
			s.writeFailedOpLocked(w, zone, req, CodeZoneResourcePoolExhausted, defaultMessage(CodeZoneResourcePoolExhausted, zone))
			return
		}
	}
	live, regionGPUs := 0, 0
	for z, other := range s.zones {
		for _, in := range other.instances {
			if in.pb.GetStatus() == "TERMINATED" {
				continue
			}
			if z == zone && lastSegment(in.pb.GetMachineType()) == machineType {
				live++
			}
			if regionOf(z) == regionOf(zone) {
				regionGPUs += in.gpus
			}
		}
	}
	if limit, ok := s.capacity[zone+"/"+machineType]; ok && live >= limit && !reservedOrQueued(req) {
		s.writeFailedOpLocked(w, zone, req, CodeZoneResourcePoolExhausted, defaultMessage(CodeZoneResourcePoolExhausted, zone))
		return
	}
	if limit, ok := s.gpuQuota[regionOf(zone)]; ok && gpus > 0 && regionGPUs+gpus > limit {
		s.writeFailedOpLocked(w, zone, req, CodeQuotaExceeded,
			fmt.Sprintf("Quota 'NVIDIA_GPUS' exceeded.  Limit: %d.0 in region %s.", limit, regionOf(zone)))
		return
	}

	s.nextID++
	pb := proto.CloneOf(req)
	pb.Kind = proto.String("compute#instance")
	pb.Id = proto.Uint64(s.nextID)
	pb.Zone = proto.String(s.zoneURL(zone))
	pb.SelfLink = proto.String(s.zoneURL(zone) + "/instances/" + req.GetName())
	pb.MachineType = proto.String(s.zoneURL(zone) + "/machineTypes/" + machineType)
	pb.Status = proto.String("PROVISIONING")
	pb.CreationTimestamp = proto.String(time.Now().Format(timeLayout))
	if pb.Metadata == nil {
		pb.Metadata = &computepb.Metadata{}
	}
	pb.Metadata.Kind = proto.String("compute#metadata")
	pb.Metadata.Fingerprint = proto.String(newFingerprint())
	ip := nextAddr()
	if len(pb.NetworkInterfaces) == 0 {
		pb.NetworkInterfaces = []*computepb.NetworkInterface{{}}
	}
	nic := pb.NetworkInterfaces[0]
	nic.Name = proto.String("nic0")
	nic.NetworkIP = proto.String(ip)
	if nic.Network == nil {
		nic.Network = proto.String(s.baseURL() + "/global/networks/default")
	}
	for _, ac := range nic.AccessConfigs {
		ac.NatIP = proto.String(ip) // loopback stands in for the external address too
	}
	in := &instance{pb: pb, gpus: gpus}
	zs.instances[req.GetName()] = in
	op := s.newOperationLocked(zone, "insert", pb)
	if s.queueFlexLocked(zone, in) {
		s.afterDelay(op, func() {})
		writeJSON(w, op.pb)
		return
	}
	s.afterDelay(op, func() { s.runLocked(zone, in) })
	writeJSON(w, op.pb)
}

// runLocked starts a PROVISIONING VM that is still there: RUNNING, its script booted, and its
// run limit (maxRunDuration, a calendar reservation's end) scheduled.
func (s *Server) runLocked(zone string, in *instance) {
	if cur, ok := s.zones[zone].instances[in.pb.GetName()]; !ok || cur != in || in.pb.GetStatus() != "PROVISIONING" {
		return
	}
	in.pb.Status = proto.String("RUNNING")
	in.pb.LastStartTimestamp = proto.String(time.Now().Format(timeLayout))
	in.vm = s.boot(zone, in)
	s.scheduleEndLocked(zone, in)
}

// validateInsert checks what GCP rejects synchronously with 400.
func (s *Server) validateInsert(req *computepb.Instance) (apiError, bool) {
	if !nameRE.MatchString(req.GetName()) {
		return errInvalid(fmt.Sprintf("Invalid value for field 'resource.name': '%s'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'", req.GetName())), true
	}
	if req.GetMachineType() == "" {
		return errInvalid("Invalid value for field 'resource.machineType': ''. Machine type must be specified."), true
	}
	for k, v := range req.GetLabels() {
		if !labelRE.MatchString(k) || !labelValueRE.MatchString(v) {
			return errInvalid(fmt.Sprintf("Invalid value for field 'resource.labels': %q: %q. Label keys and values may contain only lowercase letters, digits, '_' and '-'.", k, v)), true
		}
	}
	sch := req.GetScheduling()
	if e, bad := validateFlex(req); bad {
		return e, true
	}
	if sch.GetProvisioningModel() == "SPOT" {
		if sch.GetAutomaticRestart() {
			return errInvalid("Invalid value for field 'resource.scheduling.automaticRestart': 'true'. Spot VMs cannot be automatically restarted."), true
		}
		if sch.GetOnHostMaintenance() == "MIGRATE" {
			return errInvalid("Invalid value for field 'resource.scheduling.onHostMaintenance': 'MIGRATE'. Spot VMs must terminate on host maintenance."), true
		}
	}
	return apiError{}, false
}

var (
	labelRE      = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)
	labelValueRE = regexp.MustCompile(`^[a-z0-9_-]{0,63}$`)
)

func (s *Server) takeFaultLocked(zone string) *Fault {
	fs := s.faults[zone]
	if len(fs) == 0 {
		return nil
	}
	f := *fs[0]
	if fs[0].Times > 0 {
		fs[0].Times--
		if fs[0].Times == 0 {
			s.faults[zone] = fs[1:]
		}
	}
	return &f
}

// writeFailedOpLocked answers an insert with an operation that ends DONE with the error, the
// way GCP reports capacity, quota and unsupported-configuration failures.
func (s *Server) writeFailedOpLocked(w http.ResponseWriter, zone string, req *computepb.Instance, code, msg string) {
	target := &computepb.Instance{Name: req.Name, SelfLink: proto.String(s.zoneURL(zone) + "/instances/" + req.GetName())}
	s.nextID++
	target.Id = proto.Uint64(s.nextID)
	op := s.newOperationLocked(zone, "insert", target)
	status, statusMsg := codeStatus(code)
	s.afterDelay(op, func() {
		op.pb.Error = &computepb.Error{Errors: []*computepb.Errors{{Code: proto.String(code), Message: proto.String(msg)}}}
		op.pb.HttpErrorStatusCode = proto.Int32(int32(status))
		op.pb.HttpErrorMessage = proto.String(statusMsg)
	})
	writeJSON(w, op.pb)
}

func (s *Server) newOperationLocked(zone, kind string, target *computepb.Instance) *operation {
	s.nextID++
	now := time.Now()
	name := fmt.Sprintf("operation-%d-%x", now.UnixMilli(), s.nextID)
	pb := &computepb.Operation{
		Kind:          proto.String("compute#operation"),
		Id:            proto.Uint64(s.nextID),
		Name:          proto.String(name),
		OperationType: proto.String(kind),
		TargetLink:    target.SelfLink,
		TargetId:      target.Id,
		Status:        computepb.Operation_RUNNING.Enum(),
		Progress:      proto.Int32(0),
		InsertTime:    proto.String(now.Format(timeLayout)),
		StartTime:     proto.String(now.Format(timeLayout)),
		User:          proto.String("ferry@" + s.opts.Project + ".iam.gserviceaccount.com"),
	}
	op := &operation{pb: pb, done: make(chan struct{})}
	if zone == "" {
		pb.SelfLink = proto.String(s.baseURL() + "/global/operations/" + name)
		s.globalOps[name] = op
	} else {
		pb.Zone = proto.String(s.zoneURL(zone))
		pb.SelfLink = proto.String(s.zoneURL(zone) + "/operations/" + name)
		s.zones[zone].ops[name] = op
	}
	return op
}

// afterDelay runs effect under s.mu and marks op DONE after Options.OpDelay (at once when it is
// negative, so the insert response itself is DONE).
func (s *Server) afterDelay(op *operation, effect func()) {
	if s.opts.OpDelay < 0 {
		effect()
		s.finishLocked(op)
		return
	}
	time.AfterFunc(s.opts.OpDelay, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.closed {
			effect()
		}
		s.finishLocked(op)
	})
}

func (s *Server) finishLocked(op *operation) {
	op.pb.Status = computepb.Operation_DONE.Enum()
	op.pb.Progress = proto.Int32(100)
	op.pb.EndTime = proto.String(time.Now().Format(timeLayout))
	close(op.done)
}

func lastSegment(url string) string {
	return url[strings.LastIndexByte(url, '/')+1:]
}

var suffixGPUs = regexp.MustCompile(`-(\d+)g$`)

// builtinGPUs is the number of GPUs a machine type comes with (a2, a3: the "-Ng" suffix; g2 by
// size), 0 for machine types that take attached GPUs or none.
func builtinGPUs(machineType string) int {
	switch {
	case strings.HasPrefix(machineType, "a2-"), strings.HasPrefix(machineType, "a3-"):
		if m := suffixGPUs.FindStringSubmatch(machineType); m != nil {
			n, _ := strconv.Atoi(m[1])
			return n
		}
	case strings.HasPrefix(machineType, "g2-standard-"):
		switch machineType {
		case "g2-standard-24":
			return 2
		case "g2-standard-48":
			return 4
		case "g2-standard-96":
			return 8
		}
		return 1
	}
	return 0
}

func (s *Server) getInstance(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	zone, zs, ok := s.zone(w, r)
	if !ok {
		return
	}
	in, ok := zs.instances[r.PathValue("name")]
	if !ok {
		errNotFound("projects/" + s.opts.Project + "/zones/" + zone + "/instances/" + r.PathValue("name")).write(w)
		return
	}
	writeJSON(w, in.pb)
}

func (s *Server) listInstances(w http.ResponseWriter, r *http.Request) {
	terms, err := parseFilter(r.URL.Query().Get("filter"))
	if err != nil {
		errInvalid(err.Error()).write(w)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, zs, ok := s.zone(w, r)
	if !ok {
		return
	}
	var items []*computepb.Instance
	for _, name := range slices.Sorted(maps.Keys(zs.instances)) {
		pb := zs.instances[name].pb
		ok, err := matches(terms, func(field string) (string, bool) {
			if k, isLabel := strings.CutPrefix(field, "labels."); isLabel {
				return pb.GetLabels()[k], true
			}
			switch field {
			case "name":
				return pb.GetName(), true
			case "status":
				return pb.GetStatus(), true
			}
			return "", false
		})
		if err != nil {
			errInvalid(err.Error()).write(w)
			return
		}
		if ok {
			items = append(items, pb)
		}
	}
	page, next, err := paginate(r, items)
	if err != nil {
		errInvalid(err.Error()).write(w)
		return
	}
	writeJSON(w, &computepb.InstanceList{Kind: proto.String("compute#instanceList"), Items: page, NextPageToken: next})
}

// paginate serves maxResults items from the offset in pageToken.
func paginate[T any](r *http.Request, items []T) ([]T, *string, error) {
	q := r.URL.Query()
	max := 500
	if v := q.Get("maxResults"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, nil, fmt.Errorf("invalid value for field 'maxResults': %q", v)
		}
		if n > 0 && n < max {
			max = n
		}
	}
	start := 0
	if v := q.Get("pageToken"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > len(items) {
			return nil, nil, fmt.Errorf("invalid value for field 'pageToken': %q", v)
		}
		start = n
	}
	end := min(start+max, len(items))
	if end < len(items) {
		return items[start:end], proto.String(strconv.Itoa(end)), nil
	}
	return items[start:end], nil, nil
}

// instanceAt is the instance the request's path names ({zone}, {name}), or a 404 (or the
// zone's error) already written. Called with s.mu held.
func (s *Server) instanceAt(w http.ResponseWriter, r *http.Request) (zone string, in *instance, ok bool) {
	zone, zs, ok := s.zone(w, r)
	if !ok {
		return "", nil, false
	}
	name := r.PathValue("name")
	if in, ok = zs.instances[name]; !ok {
		errNotFound("projects/" + s.opts.Project + "/zones/" + zone + "/instances/" + name).write(w)
	}
	return zone, in, ok
}

func (s *Server) deleteInstance(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	zone, in, ok := s.instanceAt(w, r)
	if !ok {
		s.mu.Unlock()
		return
	}
	in.pb.Status = proto.String("STOPPING")
	v := in.vm
	in.vm = nil
	op := s.newOperationLocked(zone, "delete", in.pb)
	s.mu.Unlock()
	v.Kill(killWait)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.afterDelay(op, func() {
		if zs := s.zones[zone]; zs.instances[in.pb.GetName()] == in {
			delete(zs.instances, in.pb.GetName())
		}
	})
	writeJSON(w, op.pb)
}

func (s *Server) listZoneOperations(w http.ResponseWriter, r *http.Request) {
	terms, err := parseFilter(r.URL.Query().Get("filter"))
	if err != nil {
		errInvalid(err.Error()).write(w)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, zs, ok := s.zone(w, r)
	if !ok {
		return
	}
	var items []*computepb.Operation
	for _, op := range zs.ops {
		pb := op.pb
		ok, err := matches(terms, func(field string) (string, bool) {
			switch field {
			case "operationType":
				return pb.GetOperationType(), true
			case "targetLink":
				return pb.GetTargetLink(), true
			case "targetId":
				return strconv.FormatUint(pb.GetTargetId(), 10), true
			case "status":
				return pb.GetStatus().String(), true
			case "name":
				return pb.GetName(), true
			}
			return "", false
		})
		if err != nil {
			errInvalid(err.Error()).write(w)
			return
		}
		if ok {
			items = append(items, pb)
		}
	}
	sort.Slice(items, func(i, j int) bool { return items[i].GetId() < items[j].GetId() })
	page, next, err := paginate(r, items)
	if err != nil {
		errInvalid(err.Error()).write(w)
		return
	}
	writeJSON(w, &computepb.OperationList{Kind: proto.String("compute#operationList"), Items: page, NextPageToken: next})
}

// getZoneOperation serves operations.get and, for POST .../wait, operations.wait: it returns
// when the operation is DONE or after GCP's two-minute limit, whichever is first.
func (s *Server) getZoneOperation(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	zone, zs, ok := s.zone(w, r)
	if !ok {
		s.mu.Unlock()
		return
	}
	op, ok := zs.ops[r.PathValue("op")]
	s.mu.Unlock()
	if !ok {
		errNotFound("projects/" + s.opts.Project + "/zones/" + zone + "/operations/" + r.PathValue("op")).write(w)
		return
	}
	s.serveOperation(w, r, op)
}

func (s *Server) getGlobalOperation(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	op, ok := s.globalOps[r.PathValue("op")]
	s.mu.Unlock()
	if !ok {
		errNotFound("projects/" + s.opts.Project + "/global/operations/" + r.PathValue("op")).write(w)
		return
	}
	s.serveOperation(w, r, op)
}

func (s *Server) serveOperation(w http.ResponseWriter, r *http.Request, op *operation) {
	if strings.HasSuffix(r.URL.Path, "/wait") {
		ctx, cancel := context.WithTimeout(r.Context(), waitLimit)
		defer cancel()
		select {
		case <-op.done:
		case <-ctx.Done():
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	writeJSON(w, op.pb)
}

func writeJSON(w http.ResponseWriter, m proto.Message) {
	b, err := protojson.Marshal(m)
	if err != nil {
		apiError{code: 500, reason: "backendError", status: "INTERNAL", message: err.Error()}.write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_, _ = w.Write(b)
}

// addrCounter hands out VM addresses in 127.66.0.0/16. It starts at a random offset so two
// test processes on one host rarely collide.
var addrCounter = func() *atomic.Uint32 {
	var c atomic.Uint32
	var b [2]byte
	_, _ = rand.Read(b[:])
	c.Store(uint32(binary.BigEndian.Uint16(b[:])) % (256 * 254))
	return &c
}()

// nextAddr is a fresh 127.66.x.y with y in 1..254.
func nextAddr() string {
	n := addrCounter.Add(1) % (256 * 254)
	return fmt.Sprintf("127.66.%d.%d", n/254, n%254+1)
}

func (s *Server) vmDir(zone, name string) string {
	return s.opts.Dir + string(os.PathSeparator) + zone + "-" + name
}
