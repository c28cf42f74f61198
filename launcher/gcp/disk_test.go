package gcp

import (
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// TestBootDiskTier: disk_tier picks the boot disk's type (SkyPilot's GCP mapping), and no tier
// keeps pd-balanced.
func TestBootDiskTier(t *testing.T) {
	p := &Provider{opts: Options{Image: "projects/p/global/images/base"}}
	for tier, want := range map[string]string{
		"": "pd-balanced", configs.DiskTierLow: "pd-standard", configs.DiskTierMedium: "pd-balanced",
		configs.DiskTierHigh: "pd-ssd", configs.DiskTierUltra: "pd-ssd", configs.DiskTierBest: "pd-ssd",
	} {
		disk, err := p.bootDisk(launcher.Spec{Resources: configs.Resources{DiskTier: tier, DiskSize: 100}}, "us-central1-a", false)
		if err != nil {
			t.Fatal(err)
		}
		got := disk.GetInitializeParams().GetDiskType()
		if got != "zones/us-central1-a/diskTypes/"+want {
			t.Errorf("tier %q: disk type %s, want %s", tier, got, want)
		}
		if disk.GetInitializeParams().GetDiskSizeGb() != 100 {
			t.Errorf("tier %q: size %d", tier, disk.GetInitializeParams().GetDiskSizeGb())
		}
	}
}
