package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher"
)

func TestWriteReservations(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	list := []launcher.ReservationOffer{
		{Infra: "aws", ID: "cr-0abc", Kind: launcher.KindAWSCapacityBlock, InstanceType: "p5.48xlarge", Accelerator: "H100", Zone: "us-east-1a",
			Start: now.Add(2 * time.Hour), End: now.Add(26 * time.Hour), Count: 2},
		{Infra: "gcp", ID: "a3-res", Name: "team-a3", Kind: launcher.KindGCPReservation, InstanceType: "a3-highgpu-8g", Accelerator: "H100",
			Region: "us-central1", Count: 4, InUse: 3},
		{Infra: "gcp", ID: "old", Kind: launcher.KindGCPFutureReservation, Start: now.Add(-48 * time.Hour), End: now.Add(-time.Hour), Count: 1},
	}
	var buf bytes.Buffer
	if err := writeReservations(&buf, list, map[string]error{"kubernetes/x": errors.New("unreachable")}, now); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"cr-0abc", "aws-capacity-block", "2026-11-26 14:00 – 2026-11-27 14:00", "starts in 2h0m", "0/2",
		"a3-res (team-a3)", "us-central1", "- – open", "active", "3/4",
		"ended", "kubernetes/x: unreachable",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("listing lacks %q:\n%s", want, out)
		}
	}
	buf.Reset()
	if err := writeReservations(&buf, nil, nil, now); err != nil || !strings.Contains(buf.String(), "none") {
		t.Errorf("empty listing: %q, %v", buf.String(), err)
	}
}
