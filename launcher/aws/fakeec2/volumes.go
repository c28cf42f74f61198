package fakeec2

import (
	"strconv"
)

// RootVolume is the boot volume RunInstances' BlockDeviceMapping asked for (zero when it asked
// for none and the image's default applies).
type RootVolume struct {
	DeviceName string
	SizeGiB    int
	Type       string
	Iops       int
	Throughput int
}

// defaultRootDevice is the root device of every image the fake knows (Ubuntu's and the Deep
// Learning AMIs' name).
const defaultRootDevice = "/dev/sda1"

// EBS volume limits as EC2 validates them (docs.aws.amazon.com/ebs/latest/userguide/ebs-volume-types.html).
var volumeLimits = map[string]struct{ minGiB, maxGiB, minIops, maxIops, perGiB int }{
	"standard": {1, 1024, 0, 0, 0},
	"gp2":      {1, 16384, 0, 0, 0},
	"gp3":      {1, 16384, 3000, 16000, 500},
	"io1":      {4, 16384, 100, 64000, 50},
	"io2":      {4, 16384, 100, 64000, 500},
}

// rootVolume reads BlockDeviceMapping.1 of a RunInstances request and checks it as EC2 does:
// the device must be the image's root device, and size, IOPS and throughput within the type's
// limits.
func rootVolume(p params) (RootVolume, *APIError) {
	const pre = "BlockDeviceMapping.1."
	v := RootVolume{DeviceName: p.get(pre + "DeviceName")}
	if v.DeviceName == "" {
		return RootVolume{}, nil
	}
	if v.DeviceName != defaultRootDevice {
		return v, apiErr("InvalidBlockDeviceMapping", "The device %s is not the image's root device (%s)", v.DeviceName, defaultRootDevice)
	}
	v.Type = p.get(pre + "Ebs.VolumeType")
	if v.Type == "" {
		v.Type = "gp2"
	}
	lim, ok := volumeLimits[v.Type]
	if !ok {
		return v, apiErr("InvalidParameterValue", "Value (%s) for parameter volumeType is invalid.", v.Type)
	}
	v.SizeGiB, _ = strconv.Atoi(p.get(pre + "Ebs.VolumeSize"))
	v.Iops, _ = strconv.Atoi(p.get(pre + "Ebs.Iops"))
	v.Throughput, _ = strconv.Atoi(p.get(pre + "Ebs.Throughput"))
	switch {
	case v.SizeGiB < lim.minGiB || v.SizeGiB > lim.maxGiB:
		return v, apiErr("InvalidParameterValue", "Volume of size %dGB is out of range for %s: %d-%dGB.", v.SizeGiB, v.Type, lim.minGiB, lim.maxGiB)
	case lim.maxIops == 0 && v.Iops != 0:
		return v, apiErr("InvalidParameterCombination", "The parameter iops is not supported for %s volumes.", v.Type)
	case (v.Type == "io1" || v.Type == "io2") && v.Iops == 0:
		return v, apiErr("InvalidParameterCombination", "The parameter iops must be specified for %s volumes.", v.Type)
	case v.Iops != 0 && (v.Iops < lim.minIops || v.Iops > lim.maxIops || v.Iops > lim.perGiB*v.SizeGiB):
		return v, apiErr("InvalidParameterValue", "Volume iops of %d is out of range for a %dGB %s volume.", v.Iops, v.SizeGiB, v.Type)
	case v.Throughput != 0 && (v.Type != "gp3" || v.Throughput < 125 || v.Throughput > 1000):
		return v, apiErr("InvalidParameterValue", "Throughput %d is not valid for a %s volume.", v.Throughput, v.Type)
	}
	return v, nil
}
