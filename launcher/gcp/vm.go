package gcp

import (
	"context"
	"crypto/rand"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/nodefiles"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

// acceleratorTypes maps the catalog's GPU names that attach to n1 machines to GCP
// accelerator type names.
var acceleratorTypes = map[string]string{
	"T4":   "nvidia-tesla-t4",
	"V100": "nvidia-tesla-v100",
	"P100": "nvidia-tesla-p100",
	"P4":   "nvidia-tesla-p4",
	"K80":  "nvidia-tesla-k80",
}

// builtinGPUFamilies are machine families whose GPUs come with the machine type.
var builtinGPUFamilies = []string{"a2-", "a3-", "a4-", "g2-", "g4-"}

func portOf(spec launcher.Spec) int {
	if spec.Port > 0 {
		return spec.Port
	}
	return DefaultPort
}

// instanceFor builds the VM resource for spec in zone.
func (p *Provider) instanceFor(ctx context.Context, spec launcher.Spec, zone string) (*computepb.Instance, error) {
	name, err := vmName(spec.Name)
	if err != nil {
		return nil, err
	}
	pl := spec.Placement
	machineType := pl.InstanceType
	if machineType == "" {
		machineType = DefaultMachineType
	}
	accelerators, err := guestAccelerators(pl, machineType, zone)
	if err != nil {
		return nil, err
	}
	hasGPU := pl.Accelerator != "" && pl.AcceleratorCount > 0 || builtinGPU(machineType)
	disk, err := p.bootDisk(spec, zone, hasGPU)
	if err != nil {
		return nil, err
	}
	meta, err := metadataFor(ctx, spec, hasGPU, vmnode.BootOptions{Buckets: p.opts.Buckets, NFS: p.opts.CheckpointNFS, GCSToken: true})
	if err != nil {
		return nil, err
	}
	tags := []string{networkTag, portTag(portOf(spec))}
	if spec.Job != nil {
		tags = append(tags, jobTag)
	}
	return &computepb.Instance{
		Name:              proto.String(name),
		MachineType:       proto.String("zones/" + zone + "/machineTypes/" + machineType),
		GuestAccelerators: accelerators,
		Scheduling:        scheduling(pl.Spot, hasGPU),
		Labels:            encodeLabels(ownedLabels(spec.Labels)),
		Metadata:          meta,
		Tags:              &computepb.Tags{Items: tags},
		NetworkInterfaces: []*computepb.NetworkInterface{p.networkInterface()},
		Disks:             []*computepb.AttachedDisk{disk},
		ServiceAccounts:   serviceAccounts(spec),
	}, nil
}

// serviceAccounts gives a VM with gs:// file_mounts the project's default service account:
// its startup script fetches copied objects with that account's metadata token
// (nodefiles.FilesShell), so the account must be able to read the buckets, with the read-only
// storage scope; a VM that mounts a gs:// bucket (MOUNT, MOUNT_CACHED: nodefiles.MountScript)
// gets the read-write scope, and the account must be able to write it.
func serviceAccounts(spec launcher.Spec) []*computepb.ServiceAccount {
	scope := ""
	for dst, src := range spec.FileMounts {
		switch {
		case !strings.HasPrefix(src, "gs://"):
		case spec.MountModes[dst] != "":
			scope = "https://www.googleapis.com/auth/devstorage.read_write"
		case scope == "":
			scope = "https://www.googleapis.com/auth/devstorage.read_only"
		}
	}
	if scope == "" {
		return nil
	}
	return []*computepb.ServiceAccount{{Email: proto.String("default"), Scopes: []string{scope}}}
}

// builtinGPU reports whether machineType's GPUs come with it, so none are attached.
func builtinGPU(machineType string) bool {
	return slices.ContainsFunc(builtinGPUFamilies, func(f string) bool { return strings.HasPrefix(machineType, f) })
}

// guestAccelerators is the GPUs to attach to the VM: the placement's, unless its machine
// type has GPUs of its own.
func guestAccelerators(pl launcher.Placement, machineType, zone string) ([]*computepb.AcceleratorConfig, error) {
	if pl.Accelerator == "" || pl.AcceleratorCount <= 0 || builtinGPU(machineType) {
		return nil, nil
	}
	if pl.AcceleratorCount != math.Trunc(pl.AcceleratorCount) {
		return nil, fmt.Errorf("gcp: %w: %v %s: GPUs attach whole", launcher.ErrInvalid, pl.AcceleratorCount, pl.Accelerator)
	}
	accType, ok := acceleratorTypes[strings.ToUpper(pl.Accelerator)]
	if !ok {
		accType = "nvidia-" + strings.ToLower(pl.Accelerator)
	}
	return []*computepb.AcceleratorConfig{{
		AcceleratorType:  proto.String("zones/" + zone + "/acceleratorTypes/" + accType),
		AcceleratorCount: proto.Int32(int32(pl.AcceleratorCount)),
	}}, nil
}

// bootDisk is the VM's boot disk: the spec's image, else the provider's image for the
// machine (with or without GPU drivers), deleted with the VM.
func (p *Provider) bootDisk(spec launcher.Spec, zone string, hasGPU bool) (*computepb.AttachedDisk, error) {
	image := spec.Resources.ImageID
	switch {
	case vmnode.DockerImage(spec) != "" && hasGPU:
		// The container runs on the default image, which the startup script gives docker.
		image = p.opts.GPUImage
	case vmnode.DockerImage(spec) != "":
		image = p.opts.Image
	case image == "" && hasGPU:
		image = p.opts.GPUImage
	case image == "":
		image = p.opts.Image
	}
	diskGB := int64(spec.Resources.DiskSize)
	if diskGB <= 0 {
		diskGB = DefaultDiskSizeGB
	}
	return &computepb.AttachedDisk{
		Boot:       proto.Bool(true),
		AutoDelete: proto.Bool(true),
		InitializeParams: &computepb.AttachedDiskInitializeParams{
			SourceImage: proto.String(image),
			DiskSizeGb:  proto.Int64(diskGB),
			DiskType:    proto.String("zones/" + zone + "/diskTypes/" + diskType(spec.Resources.DiskTier)),
		},
	}, nil
}

// diskType is the persistent disk type of a disk_tier, after SkyPilot's GCP mapping (low
// pd-standard, medium pd-balanced, high pd-ssd). ultra and best are pd-ssd too: pd-extreme, the
// one faster type, attaches only to n2 machines with 64+ vCPUs and the m series, none of which
// is in Ferry's catalog, so asking for it would fail every launch.
func diskType(tier string) string {
	switch tier {
	case configs.DiskTierLow:
		return "pd-standard"
	case configs.DiskTierHigh, configs.DiskTierUltra, configs.DiskTierBest:
		return "pd-ssd"
	}
	return "pd-balanced"
}

// ownedLabels is the spec's labels plus the owner label, by which List finds Ferry's VMs.
func ownedLabels(specLabels map[string]string) map[string]string {
	labels := map[string]string{}
	for k, v := range specLabels {
		labels[k] = v
	}
	labels[launcher.LabelOwner] = "true"
	return labels
}

// metadataFor is the VM's metadata: the startup script that runs the task, and the port and
// price that List reads back.
func metadataFor(ctx context.Context, spec launcher.Spec, hasGPU bool, o vmnode.BootOptions) (*computepb.Metadata, error) {
	script, err := startupScript(ctx, spec, o)
	if err != nil {
		return nil, err
	}
	meta := []*computepb.Items{
		{Key: proto.String(metaStartup), Value: proto.String(script)},
		{Key: proto.String(metaPort), Value: proto.String(strconv.Itoa(portOf(spec)))},
		{Key: proto.String(metaPrice), Value: proto.String(strconv.FormatFloat(spec.Placement.PricePerHour, 'f', -1, 64))},
	}
	if hasGPU {
		meta = append(meta, &computepb.Items{Key: proto.String("install-nvidia-driver"), Value: proto.String("True")})
	}
	return &computepb.Metadata{Items: meta}, nil
}

// scheduling is how GCP treats the VM on host maintenance and, for spot, on preemption.
func scheduling(spot, hasGPU bool) *computepb.Scheduling {
	if spot {
		// STOP, not DELETE: the stopped VM stays listed as preempted until the replica manager
		// terminates it, so the preemption is seen even across a controller restart.
		return &computepb.Scheduling{
			ProvisioningModel:         proto.String("SPOT"),
			InstanceTerminationAction: proto.String("STOP"),
			AutomaticRestart:          proto.Bool(false),
			OnHostMaintenance:         proto.String("TERMINATE"),
		}
	}
	sched := &computepb.Scheduling{AutomaticRestart: proto.Bool(true), OnHostMaintenance: proto.String("MIGRATE")}
	if hasGPU {
		// GCP cannot live-migrate a VM with GPUs.
		sched.OnHostMaintenance = proto.String("TERMINATE")
	}
	return sched
}

// networkInterface attaches the VM to the provider's network, with a public address when the
// provider is set to give one.
func (p *Provider) networkInterface() *computepb.NetworkInterface {
	nic := &computepb.NetworkInterface{Network: proto.String("global/networks/" + p.opts.Network)}
	if p.opts.PublicIP {
		nic.AccessConfigs = []*computepb.AccessConfig{{Name: proto.String("External NAT"), Type: proto.String("ONE_TO_ONE_NAT")}}
	}
	return nic
}

func portTag(port int) string { return "ferry-port-" + strconv.Itoa(port) }

var envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// startupScript is the VM's startup-script metadata: the environment, then the task.
//
// Known limitation: environment values, secrets (Spec.SecretEnvs) included, are written into
// the metadata, which anyone with compute.instances.get on the project can read, and so can
// any process on the VM, containers included, from the metadata server: it asks only for the
// Metadata-Flavor: Google header, which stops forged requests that cannot set headers, and
// GCE has no hop limit nor a way to turn it off per key. Keeping them apart needs Secret
// Manager and a service account on the VM; until then, treat the project's viewers and
// everything the replica runs as able to read a task's secrets.
func startupScript(ctx context.Context, spec launcher.Spec, o vmnode.BootOptions) (string, error) {
	var b strings.Builder
	b.WriteString("#!/usr/bin/env bash\n# Ferry startup script (GCP startup-script metadata): environment, then setup and run.\n")
	keys := make([]string, 0, len(spec.Envs))
	for k := range spec.Envs {
		if !envKeyRE.MatchString(k) {
			return "", fmt.Errorf("gcp: %w: environment variable name %q", launcher.ErrInvalid, k)
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.WriteString("export " + k + "=" + nodefiles.ShellQuote(spec.Envs[k]) + "\n")
	}
	b.WriteString("export FERRY_PORT=" + strconv.Itoa(portOf(spec)) + "\n")
	b.WriteString("export FERRY_HOST=${FERRY_HOST:-0.0.0.0}\n")
	o.Watch = watchFor(spec)
	o.FilesLimit = metadataValueLimit - b.Len()
	boot, err := vmnode.Boot(ctx, InfraName, spec, o)
	if err != nil {
		return "", err
	}
	b.WriteString(boot)
	if b.Len() > metadataValueLimit {
		return "", fmt.Errorf("%w: %s: the startup script is %d bytes, over GCE's 256 KiB limit on a metadata value; put the workdir and file_mounts in a bucket and mount that, or move setup into a script on the image", nodefiles.ErrFiles, InfraName, b.Len())
	}
	return b.String(), nil
}

// metadataValueLimit is GCE's bound on one metadata value (the startup script).
const metadataValueLimit = nodefiles.GCPMetadataLimit

// vmName makes an RFC 1035 name (lowercase letter first, [-a-z0-9], at most 63) from the
// spec's name, with a random suffix so a relaunch never collides with a VM still deleting.
func vmName(name string) (string, error) {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case r == '-' || r == '_' || r == '.' || r == '/':
			b.WriteByte('-')
		}
	}
	base := strings.Trim(b.String(), "-")
	if base == "" {
		return "", fmt.Errorf("gcp: %w: instance name %q has no letters or digits", launcher.ErrInvalid, name)
	}
	if base[0] < 'a' || base[0] > 'z' {
		base = "ferry-" + base
	}
	if len(base) > 56 {
		base = strings.TrimRight(base[:56], "-")
	}
	return base + "-" + randomSuffix(), nil
}

const suffixAlphabet = "bcdfghjklmnpqrstvwxz2456789"

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = suffixAlphabet[int(b[i])%len(suffixAlphabet)]
	}
	return string(b[:])
}
