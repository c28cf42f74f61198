package e2e

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
	"github.com/ferryserve/ferry/launcher/catalog"
)

const blockYAML = `name: blocky
resources:
  infra: aws
  accelerators: A10G:1
  capacity:
    mode: queued
envs:
  MODEL: ferry-sim-1b
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 120
  replicas: 1
  ports: 8080
run: ferry replica-sim --model $MODEL
`

// TestServiceReplacedBeforeCapacityBlockEnds is issue 21's AWS acceptance run: a service whose
// capacity may be reserved lands in the account's EC2 Capacity Block (first, at $0), and
// before EC2 begins terminating the block's instances Ferry has replaced the replica with an
// on-demand one, READY before the old one drains, with no request failing under steady load.
//
// The block is offered by the fake and bought with `ferry capacity-blocks buy`: active now, and
// ending so that EC2's terminations (30 minutes before its end, as on EC2) begin 11 minutes
// from now; the provider warns of them
// (and the replicas' default lead is) 10 minutes ahead, so the block's replica serves about a
// minute before its replacement starts.
func TestServiceReplacedBeforeCapacityBlockEnds(t *testing.T) {
	t.Parallel()
	clouds := startFakeClouds(t)
	e := newEnv(t)
	e.extraEnv = awsEnv
	writeFile(t, filepath.Join(e.home, "config.yaml"), clouds.config())
	file := filepath.Join(t.TempDir(), "blocky.yaml")
	writeFile(t, file, blockYAML)

	zone := ""
	for _, r := range catalog.Default().Rows() {
		if r.Cloud == catalog.AWS && r.Region == "us-east-1" && r.InstanceType == "g5.xlarge" {
			zone = r.Zone
			break
		}
	}
	// The account buys the block through Ferry, which never buys one unasked.
	now := time.Now()
	terminates := now.Add(launcher.DefaultWindowLead + time.Minute)
	offering, err := clouds.ec2.OfferCapacityBlock(fakeec2.BlockOffering{Zone: zone, InstanceType: "g5.xlarge", InstanceCount: 1,
		Start: now, End: terminates.Add(fakeec2.DefaultCapacityBlockTerminationLead), UpfrontFee: 31.5})
	if err != nil {
		t.Fatal(err)
	}
	offers := e.mustRun("capacity-blocks", "--instance-type", "g5.xlarge", "--count", "1", "--duration", "1d")
	if !strings.Contains(offers, offering) || !strings.Contains(offers, "31.50 USD") {
		t.Fatalf("capacity-blocks does not list the offering %s:\n%s", offering, offers)
	}
	bought := regexp.MustCompile(`Bought (cr-[0-9a-f]+)`).FindStringSubmatch(e.mustRun("capacity-blocks", "buy", offering, "--yes"))
	if bought == nil {
		t.Fatal("capacity-blocks buy printed no reservation")
	}
	block := bought[1]
	if list := e.mustRun("show-gpus", "--reservations"); !strings.Contains(list, block) || !strings.Contains(list, "aws-capacity-block") {
		t.Fatalf("show-gpus --reservations does not list %s:\n%s", block, list)
	}
	plan := e.mustRun("serve", "up", file, "--dry-run")
	first := ""
	for _, line := range strings.Split(plan, "\n") {
		if strings.HasPrefix(line, "aws ") {
			first = line
			break
		}
	}
	if !strings.Contains(first, "g5.xlarge") || !strings.Contains(first, "0.00") {
		t.Fatalf("the plan's first AWS row is not the capacity block at $0:\n%s", plan)
	}

	e.mustRun("serve", "up", file, "-y")
	var st serviceStatus
	var inBlock struct {
		id       int
		instance string
	}
	eventually(t, 120*time.Second, "one READY replica in the capacity block", func() (bool, string) {
		if st, err = e.status("blocky"); err != nil {
			return false, err.Error()
		}
		for _, r := range st.Replicas {
			if r.Status == "READY" && reservationOf(clouds.ec2, r.InstanceID) == block {
				inBlock.id, inBlock.instance = r.ID, r.InstanceID
				return true, ""
			}
		}
		return false, fmt.Sprintf("replicas %+v", st.Replicas)
	})
	chatPlain(t, st.Endpoint)
	load := startSteadyLoad(st.Endpoint)
	defer load.stop()

	// The warning comes about a minute after the launch; the replacement must serve and the
	// block's replica be gone before EC2 would terminate it.
	// Not before the lead either: the block's replica serves its window until then.
	var replacement string
	var replacedAt time.Time
	eventually(t, time.Until(terminates), "the block's replica replaced by a READY one outside the block, and gone", func() (bool, string) {
		if st, err = e.status("blocky"); err != nil {
			return false, err.Error()
		}
		oldStatus, ready := "gone", ""
		for _, r := range st.Replicas {
			if r.ID != inBlock.id && replacedAt.IsZero() {
				replacedAt = time.Now()
			}
			switch {
			case r.ID == inBlock.id:
				oldStatus = r.Status
			case r.Status == "READY" && reservationOf(clouds.ec2, r.InstanceID) == "":
				ready = r.InstanceID
			}
		}
		if oldStatus != "READY" && oldStatus != "gone" && ready == "" {
			t.Fatalf("the block's replica %d is %s with no READY replacement", inBlock.id, oldStatus)
		}
		replacement = ready
		return ready != "" && oldStatus == "gone", fmt.Sprintf("block replica %d %s; READY outside the block %q", inBlock.id, oldStatus, ready)
	})
	load.stop()
	if early := terminates.Add(-launcher.DefaultWindowLead).Sub(replacedAt); early > 5*time.Second {
		t.Errorf("the replacement appeared %v before the lead began", early.Round(time.Second))
	}
	if time.Now().After(terminates) {
		t.Fatalf("replaced only after EC2 began terminating the block's instances (%s)", terminates.Format(time.RFC3339))
	}
	for _, in := range clouds.ec2.Instances() {
		if "aws/us-east-1/"+in.ID == inBlock.instance && in.StateReason != fakeec2.ReasonUserShutdown {
			t.Fatalf("the block's instance ended with %q, not terminated by Ferry", in.StateReason)
		}
	}
	if load.failed.Load() > 0 {
		t.Fatalf("%d of %d requests failed while the block's replica was replaced; first: %v", load.failed.Load(), load.sent.Load(), load.firstErr.Load())
	}
	t.Logf("replica %d in %s replaced by %s %v before the block's terminations; %d requests, none failed",
		inBlock.id, block, replacement, time.Until(terminates).Round(time.Second), load.sent.Load())
	e.mustRun("serve", "down", "blocky", "-y")
}

// reservationOf is the Capacity Reservation the fake says an instance ("aws/REGION/ID") runs in.
func reservationOf(fake *fakeec2.Server, instanceID string) string {
	for _, in := range fake.Instances() {
		if instanceID != "" && strings.HasSuffix(instanceID, "/"+in.ID) {
			return in.Reservation
		}
	}
	return ""
}
