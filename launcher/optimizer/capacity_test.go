package optimizer

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

var capNow = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)

// block is an AWS capacity block offering for p5.48xlarge (8×H100) in us-east-1.
func block(id string, start, end time.Time, count, inUse int) launcher.Offering {
	return launcher.Offering{InstanceType: "p5.48xlarge", Accelerator: "H100", AcceleratorCount: 8, VCPUs: 192, MemoryGiB: 2048,
		Region: "us-east-1", Zone: "us-east-1a", Total: -1, Free: -1,
		Reservation: &launcher.ReservationOffer{ID: id, Start: start, End: end, Count: count, InUse: inUse, Kind: launcher.KindAWSCapacityBlock}}
}

// flexStart is a queued p5.48xlarge offering at the catalog's on-demand price.
func flexStart(wait time.Duration) launcher.Offering {
	return launcher.Offering{InstanceType: "p5.48xlarge", Accelerator: "H100", AcceleratorCount: 8, VCPUs: 192, MemoryGiB: 2048,
		Region: "us-east-1", PricePerHour: 98.32, QueueWait: wait, Total: -1, Free: -1}
}

func h100(t *testing.T, cp *configs.Capacity) configs.Resources {
	return configs.Resources{Infra: "aws", Accelerators: accs(t, "H100:8"), Capacity: cp}
}

func TestPlanCapacityPrefersUnusedReservation(t *testing.T) {
	awsCap := aws
	awsCap.Offerings = []launcher.Offering{
		flexStart(90 * time.Minute),
		block("cr-full", capNow.Add(-time.Hour), capNow.Add(3*time.Hour), 2, 2),
		block("cr-later", capNow.Add(time.Hour), capNow.Add(5*time.Hour), 4, 0),
		block("cr-free", capNow.Add(-time.Hour), capNow.Add(6*time.Hour), 2, 1),
	}
	cands, err := PlanCapacity(h100(t, &configs.Capacity{Mode: configs.CapacityQueued, MaxWait: 2 * time.Hour}), []Infra{awsCap}, CapacityOptions{Now: capNow})
	if err != nil {
		t.Fatal(err)
	}
	// The active block with room first (free), then the one opening in an hour, then the
	// catalog's on-demand rows, then the queue.
	got := cands[0].Placement
	if got.Reservation != "cr-free" || got.PricePerHour != 0 || cands[0].Wait != 0 || !got.WindowEnd.Equal(capNow.Add(6*time.Hour)) {
		t.Fatalf("first candidate %+v (wait %v), want the unused block cr-free at $0", got, cands[0].Wait)
	}
	if cands[1].Placement.Reservation != "cr-later" || cands[1].Wait != time.Hour {
		t.Errorf("second candidate %+v (wait %v), want cr-later after a 1h wait", cands[1].Placement, cands[1].Wait)
	}
	for _, c := range cands {
		if c.Placement.Reservation == "cr-full" {
			t.Error("a fully used block is a candidate")
		}
	}
	onDemand, last := cands[2].Placement, cands[len(cands)-1]
	if onDemand.Reservation != "" || onDemand.Queued || onDemand.InstanceType != "p5.48xlarge" || onDemand.PricePerHour == 0 {
		t.Errorf("third candidate %+v, want an on-demand catalog row", onDemand)
	}
	if !last.Placement.Queued || last.Wait != 90*time.Minute {
		t.Errorf("last candidate %+v (wait %v), want the queue", last.Placement, last.Wait)
	}

	// The plan table says so: the chosen block, its window, the waits.
	var buf bytes.Buffer
	if err := WriteTable(&buf, cands, 0, 0); err != nil {
		t.Fatal(err)
	}
	table := buf.String()
	for _, want := range []string{"WAIT", "WINDOW", "p5.48xlarge[Reserved cr-free]", "11-26 11:00–18:00 UTC", "1h", "~90m"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

func TestPlanCapacityModes(t *testing.T) {
	awsCap := aws
	awsCap.Offerings = []launcher.Offering{
		flexStart(3 * time.Hour),
		block("cr-a", capNow.Add(30*time.Minute), capNow.Add(2*time.Hour), 1, 0),
		block("cr-b", time.Time{}, time.Time{}, 1, 0),
	}
	infras := []Infra{awsCap}
	tests := map[string]struct {
		cp   *configs.Capacity
		want []string // reservation ids, "od" (on-demand) or "queued", first few in order
		none bool
	}{
		"no capacity: reservations and queues are not Plan's": {cp: nil, want: []string{"od"}},
		"on_demand: the same":                           {cp: &configs.Capacity{Mode: configs.CapacityOnDemand}, want: []string{"od"}},
		"reserved any: only reservations, active first": {cp: &configs.Capacity{Mode: configs.CapacityReserved, Reservation: "any"}, want: []string{"cr-b", "cr-a"}},
		"reserved by name":                              {cp: &configs.Capacity{Mode: configs.CapacityReserved, Reservation: "cr-a"}, want: []string{"cr-a"}},
		"max_run_duration longer than the window":       {cp: &configs.Capacity{Mode: configs.CapacityReserved, Reservation: "any", MaxRunDuration: 2 * time.Hour}, want: []string{"cr-b"}},
		"window opens after max_wait":                   {cp: &configs.Capacity{Mode: configs.CapacityReserved, Reservation: "cr-a", MaxWait: 10 * time.Minute}, none: true},
		"queued: the 3h queue is past max_wait":         {cp: &configs.Capacity{Mode: configs.CapacityQueued, MaxWait: time.Hour}, want: []string{"cr-b", "cr-a", "od"}},
		"a queued service never queues":                 {cp: &configs.Capacity{Mode: configs.CapacityQueued, NoQueue: true}, want: []string{"cr-b", "cr-a", "od"}},
		"queued without a limit ends in the queue":      {cp: &configs.Capacity{Mode: configs.CapacityQueued}, want: []string{"cr-b", "cr-a", "od"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cands, err := PlanCapacity(h100(t, tc.cp), infras, CapacityOptions{Now: capNow})
			if tc.none {
				var nc *NoCandidateError
				if !errors.As(err, &nc) || !strings.Contains(err.Error(), "beyond max_wait 10m") {
					t.Fatalf("err = %v, want a NoCandidateError saying the window opens too late", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			queued := false
			for _, c := range cands {
				switch p := c.Placement; {
				case p.Reservation != "":
					got = append(got, p.Reservation)
				case p.Queued:
					queued = true
				case len(got) == 0 || got[len(got)-1] != "od":
					got = append(got, "od")
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("order %v, want %v", got, tc.want)
			}
			wantQueue := tc.cp != nil && tc.cp.Mode == configs.CapacityQueued && tc.cp.MaxWait == 0 && !tc.cp.NoQueue
			if queued != wantQueue {
				t.Errorf("queued candidate present = %v, want %v", queued, wantQueue)
			}
			if wantQueue && !cands[len(cands)-1].Placement.Queued {
				t.Error("the queued candidate is not last")
			}
		})
	}
}

func TestPlanCapacityKubernetesQueue(t *testing.T) {
	// A context whose A100 node pool exists only once its queue provisions it: an on-demand
	// task does not fit it; a queued one does, after the context's ready nodes (none here).
	gke := Infra{Name: "kubernetes/gke", Kind: Kubernetes, Offerings: []launcher.Offering{
		{VCPUs: 8, MemoryGiB: 32, Total: -1, Free: -1},
		{Accelerator: "A100", AcceleratorCount: 8, QueueWait: 20 * time.Minute, Total: -1, Free: -1},
	}}
	r := configs.Resources{Infra: "kubernetes", Accelerators: accs(t, "A100:2")}
	if _, err := PlanCapacity(r, []Infra{gke}, CapacityOptions{Now: capNow}); err == nil {
		t.Fatal("an on-demand task was planned onto a queued node pool")
	}
	r.Capacity = &configs.Capacity{Mode: configs.CapacityQueued}
	cands, err := PlanCapacity(r, []Infra{gke}, CapacityOptions{Now: capNow})
	if err != nil {
		t.Fatal(err)
	}
	if len(cands) != 1 || !cands[0].Placement.Queued || cands[0].Placement.Infra != "kubernetes/gke" || cands[0].Placement.AcceleratorCount != 2 {
		t.Fatalf("candidates %+v, want one queued kubernetes/gke placement of 2 A100", cands)
	}
}

func TestPlanCapacityReservedNoneSaysWhy(t *testing.T) {
	_, err := PlanCapacity(h100(t, &configs.Capacity{Mode: configs.CapacityReserved, Reservation: "any"}), []Infra{aws}, CapacityOptions{Now: capNow})
	var nc *NoCandidateError
	if !errors.As(err, &nc) || !strings.Contains(err.Error(), "no enabled infra offers a reservation") {
		t.Fatalf("err = %v", err)
	}
}

// A window that ends within the replicas' lead is left: a replica would be replaced as soon
// as it started there.
func TestPlanCapacityLeavesWindowsShorterThanTheLead(t *testing.T) {
	awsCap := aws
	awsCap.Offerings = []launcher.Offering{
		block("cr-ending", capNow.Add(-time.Hour), capNow.Add(5*time.Minute), 2, 0),
		block("cr-short", capNow.Add(time.Hour), capNow.Add(time.Hour+10*time.Minute), 2, 0),
		block("cr-long", capNow.Add(-time.Hour), capNow.Add(2*time.Hour), 2, 0),
	}
	cp := &configs.Capacity{Mode: configs.CapacityReserved, Reservation: "any"}
	cands, err := PlanCapacity(h100(t, cp), []Infra{awsCap}, CapacityOptions{Now: capNow, MinWindow: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(cands) != 1 || cands[0].Placement.Reservation != "cr-long" {
		t.Fatalf("candidates %+v, want cr-long alone", cands)
	}
	cp.Reservation = "cr-ending"
	_, err = PlanCapacity(h100(t, cp), []Infra{awsCap}, CapacityOptions{Now: capNow, MinWindow: 10 * time.Minute})
	if err == nil || !strings.Contains(err.Error(), "within 10m of the start") {
		t.Fatalf("err = %v, want the window too short for the lead", err)
	}
}

// TestPlanCapacityOfferingOfAnotherShapeIsNoCandidate: a reservation of another accelerator
// (L4 offered, H100 asked) is neither a candidate nor a reason; before, it became a blank
// placement ranked first, and the plan table a blank row.
func TestPlanCapacityOfferingOfAnotherShapeIsNoCandidate(t *testing.T) {
	awsCap := aws
	l4 := block("cr-l4", capNow.Add(-time.Hour), capNow.Add(3*time.Hour), 2, 0)
	l4.InstanceType, l4.Accelerator, l4.AcceleratorCount = "g6.xlarge", "L4", 1
	awsCap.Offerings = []launcher.Offering{l4, block("cr-h100", capNow.Add(-time.Hour), capNow.Add(3*time.Hour), 2, 0)}
	cands, err := PlanCapacity(h100(t, &configs.Capacity{Mode: configs.CapacityReserved}), []Infra{awsCap}, CapacityOptions{Now: capNow})
	if err != nil {
		t.Fatal(err)
	}
	if len(cands) != 1 || cands[0].Placement.Reservation != "cr-h100" {
		t.Fatalf("candidates %+v, want the H100 reservation alone", cands)
	}
	for _, c := range cands {
		if c.Placement.Infra == "" || c.Placement.InstanceType == "" {
			t.Errorf("a blank placement: %+v", c)
		}
	}
	// Only the L4 reservation: no candidate, and the reason is not a blank one.
	awsCap.Offerings = []launcher.Offering{l4}
	_, err = PlanCapacity(h100(t, &configs.Capacity{Mode: configs.CapacityReserved}), []Infra{awsCap}, CapacityOptions{Now: capNow})
	var nc *NoCandidateError
	if !errors.As(err, &nc) {
		t.Fatalf("only another shape's reservation: %v, want a NoCandidateError", err)
	}
}

// TestPlanCapacityInstanceTypeWithoutAccelerators: a task that names its instance type and no
// accelerators takes that type's reservation and queue, as Plan takes its on-demand rows.
func TestPlanCapacityInstanceTypeWithoutAccelerators(t *testing.T) {
	awsCap := aws
	awsCap.Offerings = []launcher.Offering{block("cr-p5", capNow.Add(-time.Hour), capNow.Add(3*time.Hour), 2, 0), flexStart(30 * time.Minute)}
	r := configs.Resources{Infra: "aws", InstanceType: "p5.48xlarge", Capacity: &configs.Capacity{Mode: configs.CapacityQueued}}
	cands, err := PlanCapacity(r, []Infra{awsCap}, CapacityOptions{Now: capNow})
	if err != nil {
		t.Fatal(err)
	}
	first, last := cands[0].Placement, cands[len(cands)-1].Placement
	if first.Reservation != "cr-p5" || first.Accelerator != "H100" || first.AcceleratorCount != 8 {
		t.Errorf("first candidate %+v, want the p5.48xlarge block with its 8 H100s", first)
	}
	if !last.Queued || last.InstanceType != "p5.48xlarge" {
		t.Errorf("last candidate %+v, want the p5.48xlarge queue", last)
	}
}
