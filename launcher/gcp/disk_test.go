package gcp

import (
	"regexp"
	"testing"

	"github.com/google/go-cmp/cmp"

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

// TestTaskLabelsAreValidGCPLabels: every label configs accepts (Kubernetes' rules plus GCP's
// length and first letter) is a valid GCP label once encoded, and decodes back.
func TestTaskLabelsAreValidGCPLabels(t *testing.T) {
	task, err := configs.Parse("t.yaml", []byte(`run: x
resources:
  labels:
    team: ml
    app.example.com/engine: sglang
    cost_center: R-and-D.42
    a: ""
    z9: Model.Gemma_2B
`), configs.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	keyRE := regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)
	valueRE := regexp.MustCompile(`^[a-z0-9_-]{0,63}$`)
	enc := encodeLabels(task.Resources.Labels)
	for k, v := range enc {
		if !keyRE.MatchString(k) || !valueRE.MatchString(v) {
			t.Errorf("not a GCP label: %q=%q", k, v)
		}
	}
	if diff := cmp.Diff(task.Resources.Labels, decodeLabels(enc)); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
}
