package infra

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
)

// reserverCloud is a cloud provider that holds reservations: the listing and the offerings
// the optimizer ranks. Launching is not this test's (the cloud helpers test theirs).
type reserverCloud struct {
	launcher.Provider
	list []launcher.ReservationOffer
	err  error
}

func (r reserverCloud) Reservations(context.Context) ([]launcher.ReservationOffer, error) {
	return r.list, r.err
}

func (r reserverCloud) Offerings(context.Context) ([]launcher.Offering, error) {
	var out []launcher.Offering
	for i := range r.list {
		res := r.list[i]
		out = append(out, launcher.Offering{InstanceType: res.InstanceType, Accelerator: res.Accelerator, AcceleratorCount: 8,
			VCPUs: 208, MemoryGiB: 1872, Region: res.Region, Zone: res.Zone, Total: -1, Free: -1, Reservation: &res})
	}
	return out, r.err
}

func TestReservationsAndReservedPlan(t *testing.T) {
	ec2, err := fakeec2.New(fakeec2.Options{LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ec2.Close()
	s := openWithFakeAWS(t, ec2)
	now := time.Now()
	block := launcher.ReservationOffer{ID: "a3-block", Start: now.Add(-time.Hour), End: now.Add(5 * time.Hour), Count: 2, InUse: 0,
		Kind: launcher.KindGCPFutureReservation, Region: "us-central1", Zone: "us-central1-a", InstanceType: "a3-highgpu-8g", Accelerator: "H100"}
	s.clouds = append(s.clouds, cloud{name: "gcp", provider: reserverCloud{list: []launcher.ReservationOffer{block}}, regions: []string{"us-central1"}})
	ctx := context.Background()

	list, errs := s.Reservations(ctx)
	if len(errs) != 0 || len(list) != 1 || list[0].ID != "a3-block" || list[0].Infra != "gcp" {
		t.Fatalf("Reservations = %+v, %v; want gcp's a3-block (fake EC2 holds none here)", list, errs)
	}

	// An on-demand task ignores the block; a queued one takes it first, at $0.
	r := configs.Resources{Infra: "gcp", Accelerators: []configs.Accelerator{{Name: "H100", Count: 8}}}
	cands, err := s.Plan(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if cands[0].Placement.Reservation != "" {
		t.Fatalf("on-demand plan starts with %+v", cands[0].Placement)
	}
	r.Capacity = &configs.Capacity{Mode: configs.CapacityQueued}
	cands, err = s.Plan(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if p := cands[0].Placement; p.Reservation != "a3-block" || p.PricePerHour != 0 || p.Zone != "us-central1-a" || len(cands) < 2 {
		t.Fatalf("queued plan starts with %+v (of %d), want a3-block at $0 then on-demand rows", p, len(cands))
	}

	// A cloud that cannot answer is reported, not fatal.
	s.clouds[len(s.clouds)-1].provider = reserverCloud{err: errors.New("permission denied")}
	list, errs = s.Reservations(ctx)
	if len(list) != 0 || errs["gcp"] == nil {
		t.Fatalf("Reservations = %+v, %v; want gcp's error", list, errs)
	}
}

// TestWindowLeadAppliesToServicesOnly: a capacity block with five minutes left is no place for
// a service's replica (it would be replaced at once: the plan says so), but a job in reserved
// mode takes it and runs to its end.
func TestWindowLeadAppliesToServicesOnly(t *testing.T) {
	ec2, err := fakeec2.New(fakeec2.Options{LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ec2.Close()
	s := openWithFakeAWS(t, ec2)
	now := time.Now()
	block := launcher.ReservationOffer{ID: "cb-ending", Start: now.Add(-time.Hour), End: now.Add(5 * time.Minute), Count: 1,
		Kind: launcher.KindAWSCapacityBlock, Region: "us-central1", Zone: "us-central1-a", InstanceType: "a3-highgpu-8g", Accelerator: "H100"}
	s.clouds = append(s.clouds, cloud{name: "gcp", provider: reserverCloud{list: []launcher.ReservationOffer{block}}, regions: []string{"us-central1"}})
	ctx := context.Background()

	job := configs.Resources{Infra: "gcp", Accelerators: []configs.Accelerator{{Name: "H100", Count: 8}},
		Capacity: &configs.Capacity{Mode: configs.CapacityReserved, Reservation: "cb-ending"}}
	cands, err := s.Plan(ctx, job)
	if err != nil || cands[0].Placement.Reservation != "cb-ending" {
		t.Fatalf("job plan: %+v, %v; want the ending block", cands, err)
	}
	service := job
	service.Capacity = &configs.Capacity{Mode: configs.CapacityReserved, Reservation: "cb-ending", NoQueue: true}
	_, err = s.Plan(ctx, service)
	if err == nil || !strings.Contains(err.Error(), "within 10m of the start") {
		t.Fatalf("service plan: %v, want the block left out for ending within the replicas' lead", err)
	}
}
