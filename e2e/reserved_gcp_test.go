package e2e

import (
	"context"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"
)

// gcpZones are the fake's zones of the region the e2e config enables for GCP.
var gcpZones = []string{"us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"}

// futureReservation asks the fake, through the real SDK client, for a calendar-mode block of
// count a3-highgpu-8g VMs in zone from start to end; its reservation is named name+"-res".
func (f *fakeClouds) futureReservation(t *testing.T, zone, name string, count int64, start, end time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := compute.NewFutureReservationsRESTClient(ctx, option.WithEndpoint(f.url), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	op, err := c.Insert(ctx, &computepb.InsertFutureReservationRequest{Project: "ferry-e2e", Zone: zone, FutureReservationResource: &computepb.FutureReservation{
		Name: proto.String(name), ReservationName: proto.String(name + "-res"), ReservationMode: proto.String("CALENDAR"),
		TimeWindow: &computepb.FutureReservationTimeWindow{StartTime: proto.String(start.UTC().Format(time.RFC3339)), EndTime: proto.String(end.UTC().Format(time.RFC3339))},
		SpecificSkuProperties: &computepb.FutureReservationSpecificSKUProperties{TotalCount: proto.Int64(count),
			InstanceProperties: &computepb.AllocationSpecificSKUAllocationReservedInstanceProperties{MachineType: proto.String("a3-highgpu-8g")}}}})
	if err == nil {
		err = op.Wait(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
}

const reservedJobYAML = `name: in-block
resources:
  infra: gcp
  instance_type: a3-highgpu-8g
  accelerators: H100:8
  capacity:
    mode: reserved
    reservation: e2e-block
job:
  grace_period_seconds: 6
run: |
  trap 'echo "got SIGTERM: $(cat "$FERRY_PREEMPTION_FILE")"; sleep 1; echo "checkpoint saved"; exit 0' TERM
  echo "training in the block"
  while :; do sleep 0.2; done
`

// A job in a GCP calendar reservation (a future reservation, through the real SDK, on the fake
// Compute Engine): before the window it is PENDING, saying why and since when, with no node;
// then the window is moved to open at once and last 40 s (scripted time); at its start its node runs, bound to the reservation;
// its grace period before the end the run gets SIGTERM with the seconds left and checkpoints
// before the VM goes, and the job ends with its window.
func TestJobInGCPCalendarReservation(t *testing.T) {
	t.Parallel()
	clouds := startFakeClouds(t)
	e := newEnv(t)
	// The window lead (replicas are replaced that long before a window ends, and the optimizer
	// takes no window shorter) is shortened with the window.
	e.extraEnv = append(append([]string{}, awsEnv...), "FERRY_JOB_RETRY_INTERVAL=500ms", "FERRY_JOB_WATCH_INTERVAL=200ms", "FERRY_WINDOW_LEAD=5s")
	writeFile(t, filepath.Join(e.home, "config.yaml"), clouds.config())
	start := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	clouds.futureReservation(t, "us-central1-b", "e2e-block", 1, start, start.Add(time.Hour))
	file := filepath.Join(t.TempDir(), "reserved.yaml")
	writeFile(t, file, reservedJobYAML)

	// The listing reads it through the provider's Reservations.
	list := e.mustRun("show-gpus", "--reservations")
	if !strings.Contains(list, "e2e-block-res") || !strings.Contains(list, "gcp-future-reservation") || !strings.Contains(list, "a3-highgpu-8g") {
		t.Errorf("show-gpus --reservations lacks the future reservation:\n%s", list)
	}

	id := e.launchDetached(file)
	j := e.waitJob(id, time.Minute, "pending for the window", func(j jobView) bool {
		return j.State == "PENDING" && strings.Contains(j.Reason, "starts at "+start.Format(time.RFC3339))
	})
	if !strings.Contains(j.Reason, "since ") || len(j.Nodes) != 0 {
		t.Errorf("a job waiting for its window: %+v; want no nodes and since when", j)
	}
	// Scripted time: the window opens in 2 s and lasts 40 s.
	start = time.Now().Add(2 * time.Second).UTC().Truncate(time.Second)
	end := start.Add(40 * time.Second)
	if err := clouds.gce.SetWindow("us-central1-b", "e2e-block", start, end); err != nil {
		t.Fatal(err)
	}

	j = e.waitJob(id, time.Minute, "runs in the window", func(j jobView) bool { return j.State == "RUNNING" && len(j.Nodes) == 1 })
	node := j.Nodes[0].InstanceID
	name := node[strings.LastIndex(node, "/")+1:]
	vm, zone, ok := clouds.gce.Instance(name)
	if !ok || zone != "us-central1-b" {
		t.Fatalf("node %s not in the reservation's zone: %v %s", node, ok, zone)
	}
	created, _ := time.Parse(time.RFC3339, vm.GetCreationTimestamp())
	if created.Before(start) {
		t.Errorf("the node's VM was made at %s, before the window's start %s", created, start)
	}
	if vm.GetScheduling().GetProvisioningModel() != "RESERVATION_BOUND" || !slices.Equal(vm.GetReservationAffinity().GetValues(), []string{"e2e-block-res"}) {
		t.Errorf("node scheduling %v, affinity %v: want bound to e2e-block-res", vm.GetScheduling(), vm.GetReservationAffinity())
	}

	// The end: SIGTERM with the grace left, a checkpoint, then the VM goes.
	eventually(t, time.Minute, "the run stopped before the window's end", func() (bool, string) {
		log := clouds.gce.SerialOutput(zone, name)
		return strings.Contains(log, "checkpoint saved"), lastLines(log, 3)
	})
	log := clouds.gce.SerialOutput(zone, name)
	if !strings.Contains(log, "got SIGTERM: FERRY_PREEMPTION_GRACE_SECONDS=") || !strings.Contains(log, "capacity window end") {
		t.Errorf("the run was not told the window's end:\n%s", lastLines(log, 8))
	}
	eventually(t, time.Minute, "the VM deleted at the window's end", func() (bool, string) {
		_, _, ok := clouds.gce.Instance(name)
		return !ok, "still there"
	})
	// The jobs manager ends the job at its window (FAILED: the program did not finish by itself).
	e.waitJob(id, time.Minute, "ended with its window", func(j jobView) bool {
		return j.State == "FAILED" && strings.Contains(j.Reason, "reservation") && len(j.Nodes) == 0
	})
}

const flexGangYAML = `name: flex-gang
num_nodes: 2
resources:
  infra: gcp
  instance_type: a3-highgpu-8g
  accelerators: H100:8
  capacity:
    mode: queued
    max_wait: 10m
    max_run_duration: 1h
run: |
  echo "rank $SKYPILOT_NODE_RANK started at $(date +%s.%N); peers: $(echo $SKYPILOT_NODE_IPS)"
`

// A 2-node job queued for GCP flex-start capacity while the zones have no on-demand a3 left:
// PENDING with the queue's words while its VMs wait, then, when the fake's queue gives them
// (all at once, after a scripted delay), both ranks start knowing each other and the job
// succeeds.
func TestFlexStartGangOnGCP(t *testing.T) {
	t.Parallel()
	clouds := startFakeClouds(t)
	for _, z := range gcpZones {
		clouds.gce.SetCapacity(z, "a3-highgpu-8g", 0)
	}
	clouds.gce.SetFlexStartDelay(8 * time.Second)
	e := newEnv(t)
	e.extraEnv = append(append([]string{}, awsEnv...), "FERRY_JOB_RETRY_INTERVAL=500ms", "FERRY_JOB_WATCH_INTERVAL=200ms")
	writeFile(t, filepath.Join(e.home, "config.yaml"), clouds.config())
	file := filepath.Join(t.TempDir(), "flex.yaml")
	writeFile(t, file, flexGangYAML)

	id := e.launchDetached(file)
	e.waitJob(id, time.Minute, "pending in the flex-start queue", func(j jobView) bool {
		return j.State == "PENDING" && strings.Contains(j.Reason, "flex-start") && strings.Contains(j.Reason, "since ")
	})
	queued := 0
	for _, z := range gcpZones {
		queued += clouds.gce.FlexQueued(z)
	}
	if queued != 2 {
		t.Errorf("%d VMs in the flex-start queue while the job is pending, want its 2", queued)
	}
	j := e.waitJob(id, 2*time.Minute, "succeeds", func(j jobView) bool { return j.State == "SUCCEEDED" })
	if j.Attempt != 1 {
		t.Errorf("attempt %d: the queued request was made again", j.Attempt)
	}
	var ips []string
	for rank := range 2 {
		out := e.mustRun("jobs", "logs", strconv.FormatInt(id, 10), "--node", strconv.Itoa(rank))
		i := strings.Index(out, "peers: ")
		if i < 0 {
			t.Fatalf("rank %d:\n%s", rank, out)
		}
		line, _, _ := strings.Cut(out[i:], "\n")
		ips = append(ips, line)
	}
	if ips[0] != ips[1] || len(strings.Fields(ips[0])) != 3 {
		t.Errorf("the ranks disagree on their peers or lack one: %q", ips)
	}
}
