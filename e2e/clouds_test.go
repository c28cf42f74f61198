package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
	"github.com/ferryserve/ferry/launcher/catalog"
	"github.com/ferryserve/ferry/launcher/gcp/fakecompute"
)

// fakeClouds runs the in-project EC2 and Compute endpoints for one test; their VMs run their
// boot scripts (here `ferry replica-sim`) on loopback addresses of their own.
type fakeClouds struct {
	ec2 *fakeec2.Server
	gce *fakecompute.Server
	url string // the Compute endpoint
}

func startFakeClouds(t *testing.T) *fakeClouds {
	t.Helper()
	vmEnv := []string{"PATH=" + filepath.Dir(ferryBin) + string(os.PathListSeparator) + os.Getenv("PATH")}
	ec2, err := fakeec2.New(fakeec2.Options{LogDir: t.TempDir(), Env: vmEnv, Subnet: nextEC2Subnet()})
	if err != nil {
		t.Fatal(err)
	}
	// Every zone the catalog knows in GCP, as the provider may list any of its region's.
	var zones []string
	for _, r := range catalog.Default().Rows() {
		if r.Cloud == catalog.GCP && !slices.Contains(zones, r.Zone) {
			zones = append(zones, r.Zone)
		}
	}
	gce := fakecompute.New(fakecompute.Options{Project: "ferry-e2e", Zones: zones, Dir: t.TempDir(), Env: vmEnv})
	srv := httptest.NewServer(gce)
	t.Cleanup(func() {
		srv.Close()
		gce.Close()
		_ = ec2.Close()
	})
	return &fakeClouds{ec2: ec2, gce: gce, url: srv.URL}
}

// ec2Subnet is the counter nextEC2Subnet walks, from a random start, so that two test binaries
// on one machine rarely walk the same subnets.
var ec2Subnet = func() *atomic.Int64 {
	var n atomic.Int64
	n.Store(rand.Int64N(ec2Subnets))
	return &n
}()

// ec2Subnets is how many loopback /16s fakeec2 chooses from, 127.64 to 127.249.
const ec2Subnets = 186

// nextEC2Subnet gives each fake EC2 of this test binary a loopback /16 of its own. fakeec2 picks
// one of 186 at random, and its VMs' addresses count up from .0.1 in it, so two fake clouds in
// parallel tests could give their VMs the same address and port; it may also pick 127.66, where
// fakecompute's VMs are.
func nextEC2Subnet() string {
	for {
		if a := 64 + ec2Subnet.Add(1)%ec2Subnets; a != 66 {
			return fmt.Sprintf("127.%d", a)
		}
	}
}

// config enables both fake clouds in one region each.
func (f *fakeClouds) config() string {
	return fmt.Sprintf(`aws:
  regions: [us-east-1]
  endpoint: %s
  amis: {us-east-1: ami-0fe771}
gcp:
  project: ferry-e2e
  regions: [us-central1]
  endpoint: %s
`, f.ec2.URL(), f.url)
}

// awsEnv gives the controller static credentials for the fake (and keeps the SDK off the
// instance metadata service).
var awsEnv = []string{"AWS_ACCESS_KEY_ID=AKIAFERRYE2E", "AWS_SECRET_ACCESS_KEY=ferry-e2e-secret",
	"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}

// preempt takes a spot VM away the way its cloud does.
func (f *fakeClouds) preempt(t *testing.T, instanceID string) {
	t.Helper()
	name := instanceID[strings.LastIndex(instanceID, "/")+1:]
	var err error
	switch {
	case strings.HasPrefix(instanceID, "aws/"):
		err = f.ec2.Preempt(name)
	case strings.HasPrefix(instanceID, "gcp/"):
		err = f.gce.Preempt(name)
	default:
		err = fmt.Errorf("not a cloud instance: %s", instanceID)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// failZone makes launches in one zone fail with the cloud's capacity error.
func (f *fakeClouds) failZone(infra, zone string) {
	if infra == "aws" {
		f.ec2.FailZone(zone, "InsufficientInstanceCapacity")
		return
	}
	f.gce.InjectFault(zone, fakecompute.Fault{Code: fakecompute.CodeZoneResourcePoolExhausted})
}

// plainCompletion sends one non-streamed chat completion and checks it succeeded.
func plainCompletion(endpoint string) error {
	body := `{"model":"ferry-sim-1b","messages":[{"role":"user","content":"steady"}],"max_tokens":4}`
	client := &http.Client{Timeout: time.Minute}
	resp, err := client.Post(endpoint+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, raw)
	}
	return nil
}

// steadyLoad is 4 closed-loop clients sending non-streamed completions (at most 2,000 each).
type steadyLoad struct {
	sent, failed atomic.Int64
	firstErr     atomic.Value
	stop         func()
}

func startSteadyLoad(endpoint string) *steadyLoad {
	l := &steadyLoad{}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				select {
				case <-done:
					return
				default:
				}
				l.sent.Add(1)
				if err := plainCompletion(endpoint); err != nil {
					l.failed.Add(1)
					l.firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
	l.stop = sync.OnceFunc(func() { close(done); wg.Wait() })
	return l
}

const spotYAML = `name: spotty
resources:
  use_spot: true
  any_of:
    - infra: aws
      accelerators: A10G:1
    - infra: gcp
      accelerators: L4:1
envs:
  MODEL: ferry-sim-1b
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 120
  replica_policy:
    min_replicas: 3
    max_replicas: 3
    dynamic_ondemand_fallback: true
    spot_placer: dynamic_fallback
  ports: 8080
run: ferry replica-sim --model $MODEL
`

// TestSpotOnFakeClouds is issue 6's acceptance run on the fake clouds: spot replicas of an
// any_of AWS/GCP service spread over zones, the cheapest zone's capacity error fails over, and a
// preempted replica is replaced in another zone while an on-demand one covers the gap, with no
// non-streamed request failing under steady load.
func TestSpotOnFakeClouds(t *testing.T) {
	t.Parallel()
	clouds := startFakeClouds(t)
	e := newEnv(t)
	e.extraEnv = awsEnv
	writeFile(t, filepath.Join(e.home, "config.yaml"), clouds.config())
	file := filepath.Join(t.TempDir(), "spotty.yaml")
	writeFile(t, file, spotYAML)

	// The market moves: EC2's live spot price for g5.xlarge in use1-az5 drops far below the
	// catalog's, and the plan follows DescribeSpotPriceHistory.
	clouds.ec2.SetSpotPrice("use1-az5", "g5.xlarge", 0.0912)
	plan := e.mustRun("serve", "up", file, "--dry-run")
	if !regexp.MustCompile(`(?m)^aws\s+g5\.xlarge\[Spot\].*\$ 0\.09\s+✔`).MatchString(plan) {
		t.Fatalf("the plan does not choose the live spot price of 0.0912:\n%s", plan)
	}
	// The optimizer's cheapest spot zone has no capacity.
	first := regexp.MustCompile(`(?m)^(aws|gcp)\s+\S+\[Spot\]\s.*?\s(\S+)/(\S+)\s+\$`).FindStringSubmatch(plan)
	if first == nil {
		t.Fatalf("no spot row in the plan:\n%s", plan)
	}
	fullInfra, fullZone := first[1], first[3]
	clouds.failZone(fullInfra, fullZone)
	t.Logf("cheapest spot zone %s/%s has no capacity", fullInfra, fullZone)

	e.mustRun("serve", "up", file, "-y")
	spotZones := func(st serviceStatus) (zones map[string]int, ready int) {
		zones = map[string]int{}
		for _, r := range st.Replicas {
			if r.Spot && r.Status == "READY" {
				zones[r.Infra+"/"+r.Zone]++
				ready++
			}
		}
		return zones, ready
	}
	liveOnDemand := func(st serviceStatus) int {
		n := 0
		for _, r := range st.Replicas {
			if !r.Spot && (r.Status == "READY" || r.Status == "STARTING" || r.Status == "PROVISIONING") {
				n++
			}
		}
		return n
	}
	var st serviceStatus
	eventually(t, 120*time.Second, "3 READY spot replicas in 3 zones, fallback on-demand gone", func() (bool, string) {
		var err error
		if st, err = e.status("spotty"); err != nil {
			return false, err.Error()
		}
		zones, ready := spotZones(st)
		return ready == 3 && len(zones) == 3 && liveOnDemand(st) == 0, fmt.Sprintf("spot READY by zone %v, live on-demand %d", zones, liveOnDemand(st))
	})
	zones, _ := spotZones(st)
	if zones[fullInfra+"/"+fullZone] > 0 {
		t.Fatalf("a replica in %s/%s, the zone without capacity", fullInfra, fullZone)
	}
	chatPlain(t, st.Endpoint)

	// Steady non-streamed load while one spot replica is preempted.
	endpoint := st.Endpoint // st is rewritten below while the clients run
	load := startSteadyLoad(endpoint)
	defer load.stop()

	type victimReplica struct {
		id             int
		instance, zone string
	}
	pick := func(st serviceStatus, infra string) (v victimReplica) {
		for _, r := range st.Replicas {
			if r.Spot && r.Status == "READY" && (infra == "" || r.Infra == infra) {
				return victimReplica{r.ID, r.InstanceID, r.Infra + "/" + r.Zone}
			}
		}
		t.Fatalf("no READY spot replica on %q to preempt: %+v", infra, st.Replicas)
		return v
	}
	victim := pick(st, "")
	preemptedAt := time.Now()
	clouds.preempt(t, victim.instance)
	eventually(t, 120*time.Second, "the preempted replica replaced in another zone, 3 spot READY again", func() (bool, string) {
		var err error
		if st, err = e.status("spotty"); err != nil {
			return false, err.Error()
		}
		zones, ready := spotZones(st)
		preempted := false
		for _, r := range st.Replicas {
			preempted = preempted || (r.ID == victim.id && r.Status == "PREEMPTED")
		}
		return preempted && ready == 3 && zones[victim.zone] == 0,
			fmt.Sprintf("victim %d PREEMPTED %v; spot READY by zone %v", victim.id, preempted, zones)
	})
	// The on-demand fallback covered the gap: launched, and scaled down again once spot was
	// READY. It lives a few seconds, which status polls on a loaded host can miss, so the
	// controller's log of its launches says.
	if covers := onDemandLaunches(t, e, "spotty", preemptedAt); len(covers) == 0 {
		t.Fatal("no on-demand replica launched to cover the preempted spot replica")
	} else {
		t.Logf("on-demand cover launched after the preemption: %v", covers)
	}
	load.stop()
	if load.failed.Load() > 0 {
		t.Fatalf("%d of %d requests failed during the preemption; first: %v", load.failed.Load(), load.sent.Load(), load.firstErr.Load())
	}
	t.Logf("%d requests during the preemption, none failed", load.sent.Load())

	// EC2's interruption warning: the warned replica keeps serving while its replacement and
	// the on-demand fallback start, before EC2 reclaims it. The fake's notice is 20 s (EC2's
	// is 2 minutes); the provider polls every 5 s.
	const notice = 20 * time.Second
	load = startSteadyLoad(endpoint)
	defer load.stop()
	warned := pick(st, "aws")
	// Taken before the warning: EC2 reclaims the instance no sooner than notice after it, so a
	// replacement launched only once the instance is gone is launched after warnedAt+notice.
	warnedAt := time.Now()
	if err := clouds.ec2.PreemptWithNotice(warned.instance[strings.LastIndex(warned.instance, "/")+1:], notice); err != nil {
		t.Fatal(err)
	}
	// Its replacement READY, the warned replica drains and Ferry terminates it (or EC2 reclaims
	// it first, if the replacement is slower than the notice).
	eventually(t, 120*time.Second, "the warned replica gone and replaced, 3 spot READY again", func() (bool, string) {
		var err error
		if st, err = e.status("spotty"); err != nil {
			return false, err.Error()
		}
		zones, ready := spotZones(st)
		warnedStatus := "gone"
		for _, r := range st.Replicas {
			if r.ID == warned.id {
				warnedStatus = r.Status
			}
		}
		gone := warnedStatus == "gone" || warnedStatus == "PREEMPTED"
		return gone && ready == 3 && liveOnDemand(st) == 0, fmt.Sprintf("warned %d %s; spot READY by zone %v; live on-demand %d", warned.id, warnedStatus, zones, liveOnDemand(st))
	})
	// The handover, judged from the controller's own record of its replicas' changes, in the
	// order it made them: a status poll (a CLI run, a second or more on a loaded host) can miss
	// the whole of it, since the fake clouds' replacements are READY within a second of their
	// launch and the warned replica retired at once.
	checkWarnedHandover(t, e, "spotty", warned.id, warnedAt, notice)
	load.stop()
	if load.failed.Load() > 0 {
		t.Fatalf("%d of %d requests failed during the warned preemption; first: %v", load.failed.Load(), load.sent.Load(), load.firstErr.Load())
	}
	t.Logf("%d requests during the warned preemption, none failed", load.sent.Load())
	eventually(t, 10*time.Second, "the warning acted on in the controller log", func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(e.home, "controller.log"))
		return err == nil && strings.Contains(string(b), "spot interruption notice: replacing the replica"), "no such line yet"
	})

	// The preemption was surfaced as an event, from the cloud's notice.
	eventually(t, 30*time.Second, "a preemption notice in the controller log", func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(e.home, "controller.log"))
		return err == nil && strings.Contains(string(b), "spot preemption notice") && strings.Contains(string(b), victim.instance[strings.LastIndex(victim.instance, "/")+1:]), "no notice yet"
	})

	table := e.mustRun("serve", "status", "spotty", "-v")
	for _, want := range []string{"COST ($/hr)", "spot", "PREEMPTED", "us-"} {
		if !strings.Contains(table, want) {
			t.Errorf("serve status -v lacks %q:\n%s", want, table)
		}
	}

	e.mustRun("serve", "down", "spotty", "-y")
	eventually(t, 60*time.Second, "serve down leaves no VM running", func() (bool, string) {
		running := 0
		for _, in := range clouds.ec2.Instances() {
			if in.State == "running" || in.State == "pending" {
				running++
			}
		}
		return running == 0, fmt.Sprintf("%d EC2 instances running", running)
	})
}

// onDemandLaunches lists the on-demand instances of service the providers launched since
// since, from their lines in the controller log ("ran instance" with its market on AWS,
// "launched" with its spot flag on GCP).
func onDemandLaunches(t *testing.T, e *env, service string, since time.Time) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.home, "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		var entry struct {
			TS       time.Time `json:"ts"`
			Logger   string    `json:"logger"`
			Msg      string    `json:"msg"`
			Name     string    `json:"name"`     // AWS: the instance's Name
			Market   string    `json:"market"`   // AWS
			Instance string    `json:"instance"` // GCP: the VM's name
			Spot     *bool     `json:"spot"`     // GCP
		}
		if json.Unmarshal([]byte(line), &entry) != nil || entry.TS.Before(since.Truncate(time.Millisecond)) {
			continue
		}
		switch {
		case entry.Logger == "aws" && entry.Msg == "ran instance" && entry.Market == "on-demand" && strings.HasPrefix(entry.Name, service+"-"):
			out = append(out, "aws/"+entry.Name)
		case entry.Logger == "gcp" && entry.Msg == "launched" && entry.Spot != nil && !*entry.Spot && strings.HasPrefix(entry.Instance, service+"-"):
			out = append(out, "gcp/"+entry.Instance)
		}
	}
	return out
}

// replicaTransition is one "replica status" line of the controller log.
type replicaTransition struct {
	TS      time.Time `json:"ts"`
	Msg     string    `json:"msg"`
	Service string    `json:"service"`
	Replica int       `json:"replica"`
	From    string    `json:"from"`
	To      string    `json:"to"`
	Reason  string    `json:"reason"`
}

// replicaTransitions reads service's replica status changes from the controller log, in the
// order the controller logged them.
func replicaTransitions(t *testing.T, e *env, service string) []replicaTransition {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.home, "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	var out []replicaTransition
	for _, line := range strings.Split(string(b), "\n") {
		var tr replicaTransition
		if json.Unmarshal([]byte(line), &tr) == nil && tr.Msg == "replica status" && tr.Service == service {
			out = append(out, tr)
		}
	}
	return out
}

// checkWarnedHandover checks what Ferry did with a replica warned of its reclaim at warnedAt,
// notice ahead: replacements (a spot one and the on-demand fallback) launched within the
// notice, and the warned replica serving until one of them was READY, unless the cloud
// reclaimed it first at the notice's end.
func checkWarnedHandover(t *testing.T, e *env, service string, warned int, warnedAt time.Time, notice time.Duration) {
	t.Helper()
	since := warnedAt.Truncate(time.Millisecond) // the log's timestamps are in milliseconds
	reclaim := warnedAt.Add(notice)
	var trs []replicaTransition
	left := -1 // index in trs of the warned replica leaving READY
	eventually(t, 10*time.Second, "the warned replica leaving READY in the controller log", func() (bool, string) {
		trs = replicaTransitions(t, e, service)
		left = slices.IndexFunc(trs, func(tr replicaTransition) bool {
			return tr.Replica == warned && tr.From == "READY" && !tr.TS.Before(since)
		})
		return left >= 0, fmt.Sprintf("%d replica status lines", len(trs))
	})
	launched := map[int]time.Time{} // replicas launched after the warning
	firstReady, firstReadyAt := -1, time.Time{}
	for i, tr := range trs {
		if tr.To == "PROVISIONING" && tr.From == "" && !tr.TS.Before(since) {
			launched[tr.Replica] = tr.TS
		}
		if _, ok := launched[tr.Replica]; ok && tr.To == "READY" && firstReady < 0 {
			firstReady, firstReadyAt = i, tr.TS
		}
	}
	var inNotice []int
	var all []string
	for id, at := range launched {
		if at.Before(reclaim) {
			inNotice = append(inNotice, id)
		}
		all = append(all, fmt.Sprintf("%d after %v", id, at.Sub(warnedAt).Round(time.Millisecond)))
	}
	slices.Sort(inNotice)
	slices.Sort(all)
	if len(inNotice) < 2 {
		t.Fatalf("replicas launched within the %v notice: %v, want a spot replacement and the on-demand fallback (launched since the warning: %v)", notice, inNotice, all)
	}
	out := trs[left]
	switch {
	case out.To == "PREEMPTED":
		// EC2 took it at the notice's end before a replacement was READY: allowed, but not
		// sooner (Ferry reading the warning as the preemption itself).
		if out.TS.Before(reclaim.Truncate(time.Millisecond)) {
			t.Fatalf("the warned replica %d PREEMPTED %v after the warning, before the notice's end (%v)", warned, out.TS.Sub(warnedAt).Round(time.Millisecond), notice)
		}
	case firstReady < 0 || firstReady > left:
		first := "none"
		if firstReady >= 0 {
			first = fmt.Sprintf("replica %d after %v", trs[firstReady].Replica, firstReadyAt.Sub(warnedAt).Round(time.Millisecond))
		}
		t.Fatalf("the warned replica %d went %s (%q) %v after the warning, before any replacement was READY (the first READY: %s)",
			warned, out.To, out.Reason, out.TS.Sub(warnedAt).Round(time.Millisecond), first)
	}
	t.Logf("after the warning: replicas %v launched within the notice, the first READY after %v, the warned replica %d %s after %v",
		inNotice, firstReadyAt.Sub(warnedAt).Round(time.Millisecond), warned, out.To, out.TS.Sub(warnedAt).Round(time.Millisecond))
}

const burstCloudYAML = `name: overflow
resources:
  infra: "*"
  accelerators: L4:1
envs:
  REPLICA_SIM_ARGS: --model ferry-sim-1b
service:
  readiness_probe: /health
  replicas: 2
  ports: 8080
run: ferry replica-sim --model ferry-sim-1b
`

// TestKubernetesFullBurstsToCheapestCloudZone: with the cluster's one L4 taken, the second
// replica goes to the cheapest cloud zone the optimizer lists after the cluster.
func TestKubernetesFullBurstsToCheapestCloudZone(t *testing.T) {
	k := newKubeEnv(t, "NVIDIA-L4", 1, 1, 2)
	clouds := startFakeClouds(t)
	k.extraEnv = awsEnv
	cfg, err := os.ReadFile(filepath.Join(k.home, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(k.home, "config.yaml"), string(cfg)+clouds.config())
	file := filepath.Join(t.TempDir(), "overflow.yaml")
	writeFile(t, file, burstCloudYAML)

	plan := k.mustRun("serve", "up", file, "--dry-run")
	rows := regexp.MustCompile(`(?m)^(kubernetes/\S+|aws|gcp)\s+(\S+)\s.*?\s(\S+)\s+\$\s*([0-9.]+)`).FindAllStringSubmatch(plan, -1)
	if len(rows) < 2 || !strings.HasPrefix(rows[0][1], "kubernetes/") || rows[1][1] == "" {
		t.Fatalf("plan does not put the cluster first, then a cloud:\n%s", plan)
	}
	cheapest := rows[1]
	t.Logf("after the cluster, the cheapest: %s %s %s at $%s/h", cheapest[1], cheapest[2], cheapest[3], cheapest[4])

	k.mustRun("serve", "up", file, "-y")
	st, err := k.status("overflow")
	if err != nil {
		t.Fatal(err)
	}
	byInfra := map[string][]string{}
	for _, r := range st.Replicas {
		if r.Status == "READY" {
			byInfra[r.Infra] = append(byInfra[r.Infra], r.Zone)
		}
	}
	if len(byInfra["kubernetes/"+k.cluster.Context()]) != 1 || len(byInfra[cheapest[1]]) != 1 {
		t.Fatalf("READY replicas by infra %v, want 1 pod and 1 on %s", byInfra, cheapest[1])
	}
	if zone := byInfra[cheapest[1]][0]; !strings.HasSuffix(cheapest[3], "/"+zone) {
		t.Fatalf("burst replica in %s, want the cheapest zone %s", zone, cheapest[3])
	}
	chatPlain(t, st.Endpoint)
	k.mustRun("serve", "down", "overflow", "-y")
}
