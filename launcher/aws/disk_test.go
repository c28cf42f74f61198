package aws

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
)

// TestRootVolumeFromDiskSizeAndTier launches through the SDK against the fake EC2, which checks
// the mapping as EC2 does (the image's root device, each type's size and IOPS limits): disk_size
// and disk_tier become the boot volume, SkyPilot's tier mapping, and nothing set keeps the
// image's default volume.
func TestRootVolumeFromDiskSizeAndTier(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	tests := []struct {
		size int
		tier string
		want fakeec2.RootVolume
	}{
		{want: fakeec2.RootVolume{}},
		{size: 100, want: fakeec2.RootVolume{DeviceName: "/dev/sda1", SizeGiB: 100, Type: "gp2"}},
		{tier: configs.DiskTierLow, want: fakeec2.RootVolume{DeviceName: "/dev/sda1", SizeGiB: DefaultDiskSizeGB, Type: "standard"}},
		{size: 50, tier: configs.DiskTierMedium, want: fakeec2.RootVolume{DeviceName: "/dev/sda1", SizeGiB: 50, Type: "gp3", Iops: 3500, Throughput: 218}},
		{size: 100, tier: configs.DiskTierHigh, want: fakeec2.RootVolume{DeviceName: "/dev/sda1", SizeGiB: 100, Type: "gp3", Iops: 7000, Throughput: 437}},
		{size: 500, tier: configs.DiskTierUltra, want: fakeec2.RootVolume{DeviceName: "/dev/sda1", SizeGiB: 500, Type: "io2", Iops: 20000}},
		// io2 allows 500 IOPS per GiB: a small disk gets what its size allows.
		{size: 20, tier: configs.DiskTierBest, want: fakeec2.RootVolume{DeviceName: "/dev/sda1", SizeGiB: 20, Type: "io2", Iops: 10000}},
	}
	for i, tc := range tests {
		s := spec("disk-"+string(rune('a'+i)), "exec ferry replica-sim", false)
		s.Resources = configs.Resources{DiskSize: tc.size, DiskTier: tc.tier}
		inst, err := e.p.Launch(context.Background(), s)
		if err != nil {
			t.Fatalf("size %d tier %q: %v", tc.size, tc.tier, err)
		}
		if diff := cmp.Diff(tc.want, fakeInstance(t, e.fake, inst.ID).Root); diff != "" {
			t.Errorf("size %d tier %q: root volume (-want +got):\n%s", tc.size, tc.tier, diff)
		}
		if err := e.p.Terminate(context.Background(), inst.ID); err != nil {
			t.Fatal(err)
		}
	}
}
