package aws

import (
	"context"
	"fmt"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// DefaultDiskSizeGB is the boot volume when the task sets disk_tier but no disk_size (SkyPilot's
// default disk size).
const DefaultDiskSizeGB = 256

// ebsSpec is one disk_tier as an EBS volume: SkyPilot's AWS mapping (sky/clouds/aws.py): low is
// magnetic, medium and high gp3 with provisioned IOPS and throughput (IOPS / 16 MiB/s), ultra
// (and best, the highest tier AWS has) io2.
type ebsSpec struct {
	volumeType       types.VolumeType
	iops, throughput int32
}

var ebsTiers = map[string]ebsSpec{
	configs.DiskTierLow:    {volumeType: types.VolumeTypeStandard},
	configs.DiskTierMedium: {volumeType: types.VolumeTypeGp3, iops: 3500, throughput: 3500 / 16},
	configs.DiskTierHigh:   {volumeType: types.VolumeTypeGp3, iops: 7000, throughput: 7000 / 16},
	configs.DiskTierUltra:  {volumeType: types.VolumeTypeIo2, iops: 20000},
	configs.DiskTierBest:   {volumeType: types.VolumeTypeIo2, iops: 20000},
}

// maxIopsPerGiB is EBS's cap on provisioned IOPS for gp3 and io2 (500 per GiB).
const maxIopsPerGiB = 500

// rootVolume is the boot volume for disk_size and disk_tier, on the image's root device; nil
// when the task sets neither (the image's default volume).
func (p *Provider) rootVolume(ctx context.Context, c *ec2.Client, ami string, r configs.Resources) ([]types.BlockDeviceMapping, error) {
	if r.DiskSize <= 0 && r.DiskTier == "" {
		return nil, nil
	}
	size := int32(r.DiskSize)
	if size <= 0 {
		size = DefaultDiskSizeGB
	}
	ebs := &types.EbsBlockDevice{VolumeSize: awssdk.Int32(size), DeleteOnTermination: awssdk.Bool(true)}
	if spec, ok := ebsTiers[r.DiskTier]; ok {
		ebs.VolumeType = spec.volumeType
		if spec.iops > 0 {
			ebs.Iops = awssdk.Int32(min(spec.iops, maxIopsPerGiB*size))
		}
		if spec.throughput > 0 {
			ebs.Throughput = awssdk.Int32(spec.throughput)
		}
	}
	device, err := p.rootDevice(ctx, c, ami)
	if err != nil {
		return nil, err
	}
	return []types.BlockDeviceMapping{{DeviceName: awssdk.String(device), Ebs: ebs}}, nil
}

// rootDevice is the image's root device name (/dev/sda1 on Ubuntu, /dev/xvda on Amazon Linux),
// which a boot volume's mapping must name; looked up once per image.
func (p *Provider) rootDevice(ctx context.Context, c *ec2.Client, ami string) (string, error) {
	if v, ok := p.rootDevices.Load(ami); ok {
		return v.(string), nil
	}
	out, err := c.DescribeImages(ctx, &ec2.DescribeImagesInput{ImageIds: []string{ami}})
	if err != nil {
		return "", classify(err, "find the image's root device")
	}
	if len(out.Images) == 0 || awssdk.ToString(out.Images[0].RootDeviceName) == "" {
		return "", fmt.Errorf("%w: %s: image %s has no root device to size (disk_size, disk_tier)", launcher.ErrInvalid, InfraName, ami)
	}
	device := awssdk.ToString(out.Images[0].RootDeviceName)
	p.rootDevices.Store(ami, device)
	return device, nil
}
