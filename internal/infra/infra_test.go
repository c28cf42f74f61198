package infra

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
	"github.com/ferryserve/ferry/launcher/fakefault"
)

// openWithFakeAWS opens a Set whose only cloud is the fake EC2 in two regions.
func openWithFakeAWS(t *testing.T, ec2 *fakeec2.Server) *Set {
	t.Helper()
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIATEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none")) // no Kubernetes here
	h := home.Home{Dir: t.TempDir()}
	cfg := fmt.Sprintf("aws:\n  regions: [us-east-1, us-west-2]\n  endpoint: %s\n", ec2.URL())
	if err := os.WriteFile(ConfigPath(h), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(h, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if len(s.Problems) > 0 {
		t.Fatalf("problems: %v", s.Problems)
	}
	return s
}

// TestPlanRanksSpotRegions: a region whose spot placement score is low is tried after the
// others, however cheap; and plans carry the account's zone names.
func TestPlanRanksSpotRegions(t *testing.T) {
	ec2, err := fakeec2.New(fakeec2.Options{LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ec2.Close()
	r := configs.Resources{Infra: "aws", UseSpot: true, Accelerators: []configs.Accelerator{{Name: "A10G", Count: 1}}}
	ctx := context.Background()

	cands, err := openWithFakeAWS(t, ec2).Plan(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	// By the catalog, g5.xlarge spot is cheapest in us-west-2 (usw2-az2, $0.357).
	if p := cands[0].Placement; p.Region != "us-west-2" || p.Zone != ec2.ZoneNames("us-west-2")["usw2-az2"] {
		t.Fatalf("first %+v, want us-west-2's usw2-az2 by its zone name", p)
	}

	// us-west-2's spot capacity is gone: its score drops to 1 and its zones go last.
	for id := range ec2.ZoneNames("us-west-2") {
		ec2.FailZone(id, "InsufficientInstanceCapacity")
	}
	cands, err = openWithFakeAWS(t, ec2).Plan(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	seenWest := false
	for _, c := range cands {
		switch {
		case c.Placement.Region == "us-west-2":
			seenWest = true
		case seenWest:
			t.Fatalf("%s after a us-west-2 placement: the low-score region must come last", c.Placement.Region)
		}
	}
	if cands[0].Placement.Region != "us-east-1" || !seenWest {
		t.Fatalf("first %+v, want us-east-1 first and us-west-2 still listed", cands[0].Placement)
	}
}

// TestPlanSkipsADownInfra: an infra whose breaker is open is neither asked nor planned, and
// Down says why; once it answers again it is planned as before.
func TestPlanSkipsADownInfra(t *testing.T) {
	ec2, err := fakeec2.New(fakeec2.Options{LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ec2.Close()
	s := openWithFakeAWS(t, ec2)
	r := configs.Resources{Infra: "aws", Accelerators: []configs.Accelerator{{Name: "A10G", Count: 1}}}
	ctx := context.Background()
	if _, err := s.Plan(ctx, r); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		s.Provisioner.Health().Observe("aws", "", fmt.Errorf("%w: 503 Unavailable", launcher.ErrUnavailable))
	}
	if _, err := s.Plan(ctx, r); err == nil || !strings.Contains(err.Error(), "aws down since") {
		t.Fatalf("plan with aws down: %v, want it refused saying aws is down", err)
	}
	down := s.Down(r)
	if len(down) != 1 || down[0].Infra != "aws" || down[0].State != launcher.InfraDown {
		t.Fatalf("Down = %+v, want aws", down)
	}
	if got := s.Down(configs.Resources{Infra: configs.InfraLocal}); len(got) != 0 {
		t.Fatalf("Down for a local task = %+v, want none", got)
	}
	s.Provisioner.Health().Observe("aws", "", nil)
	if cands, err := s.Plan(ctx, r); err != nil || len(cands) == 0 || cands[0].Placement.Infra != "aws" {
		t.Fatalf("plan after aws answered: %v, %v", cands, err)
	}
}

// TestPlanChargesAFailingRegionToThatRegion: a region whose reservations cannot be listed is a
// gap of the plan's capacity question, charged to that region's breaker: after many plans the
// infra is still up and planned, and the other region's placements are still offered.
func TestPlanChargesAFailingRegionToThatRegion(t *testing.T) {
	ec2, err := fakeec2.New(fakeec2.Options{LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ec2.Close()
	s := openWithFakeAWS(t, ec2)
	ec2.Outages().Set(fakefault.Fault{Status: 503, Region: "us-west-2", Ops: []string{"DescribeCapacityReservations"}})
	r := configs.Resources{Infra: "aws", Accelerators: []configs.Accelerator{{Name: "A10G", Count: 1}},
		Capacity: &configs.Capacity{Mode: configs.CapacityQueued}}
	ctx := context.Background()
	for range 5 {
		cands, err := s.Plan(ctx, r)
		if err != nil || len(cands) == 0 {
			t.Fatalf("plan with one region's reservations failing: %v, %v", cands, err)
		}
	}
	if down := s.Down(r); len(down) != 0 {
		t.Fatalf("Down = %+v: one region's failing reservations must not take aws down", down)
	}
	var west launcher.InfraState
	for _, st := range s.Provisioner.Health().States() {
		if st.Infra == "aws" && st.Zone == "us-west-2" {
			west = st
		}
	}
	if west.Failures == 0 {
		t.Errorf("us-west-2's breaker saw no failure (%+v): the gap was charged elsewhere", west)
	}
}
