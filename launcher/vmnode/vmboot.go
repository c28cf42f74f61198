package vmnode

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// DockerPrefix starts an image_id that names a container image ("docker:vllm/vllm-openai").
const DockerPrefix = "docker:"

// DockerImage is the container image spec asks for, "" when it asks for none.
func DockerImage(spec launcher.Spec) string {
	img, ok := strings.CutPrefix(spec.Resources.ImageID, DockerPrefix)
	if !ok {
		return ""
	}
	return img
}

// BootOptions is what a VM cloud gives Boot.
type BootOptions struct {
	// Buckets lists bucket mounts and makes their download URLs.
	Buckets nodefiles.Buckets
	// FilesLimit bounds the packed local files the boot script carries (nodefiles.FilesShell).
	FilesLimit int
	// GCSToken says the VM has a Google service account whose metadata token may read gs://
	// mounts, and mount them (GCP); elsewhere a gs:// copy is fetched with a token Buckets
	// gives (nodefiles.GCSReader), and a gs:// mount is refused.
	GCSToken bool
	// S3Role says the VM runs with an IAM instance profile whose role mounts s3:// buckets
	// (AWS with a mount instance profile configured); without it an s3:// mount is refused.
	S3Role bool
	// S3RoleHint says, in the refusal, how to give the VM that role.
	S3RoleHint string
	// NFS and Watch are a job node's (JobBoot).
	NFS   string
	Watch PreemptionWatch
}

// Boot is the part of a VM's boot script after its environment: the task's files
// (nodefiles.FilesShell), then the task, on the VM or, for an image_id docker:IMAGE, in that
// container as SkyPilot runs one: docker installed if missing, the image pulled, and the
// container run on the host's network (--net=host), with every GPU (--gpus all) where the VM
// has GPUs, the workdir, file mounts, state and checkpoint directories bound at the same paths,
// and the task's environment passed by name (values stay out of the command line). Setup and
// run both run inside it, and the container's exit status is the run's (a job node's exit
// marker).
func Boot(ctx context.Context, infra string, spec launcher.Spec, o BootOptions) (string, error) {
	files, err := nodefiles.SpecFiles(spec)
	if err != nil {
		return "", fmt.Errorf("%s: %w", infra, err)
	}
	var b strings.Builder
	if err := vmBuckets(infra, files, o); err != nil {
		return "", err
	}
	if err := nodefiles.CheckMounts(ctx, files, o.Buckets); err != nil {
		return "", fmt.Errorf("%s: %w", infra, err)
	}
	sh, err := nodefiles.FilesShell(ctx, infra, files, o.Buckets, o.FilesLimit)
	if err != nil {
		return "", err
	}
	if sh != "" {
		b.WriteString(filesFail(spec))
		if !o.GCSToken {
			// The token is a secret in the user-data, as the task's secrets are: it reads
			// the copied buckets for an hour at most.
			tok, err := gcsCopyToken(ctx, files, o.Buckets)
			if err != nil {
				return "", fmt.Errorf("%s: %w", infra, err)
			}
			if tok != "" {
				b.WriteString("ferry_gcs_token=" + nodefiles.ShellQuote(tok) + "\n")
			}
		}
		b.WriteString(sh)
	}
	if spec.Job != nil {
		boot, err := JobBoot(infra, spec, o.NFS, o.Watch)
		if err != nil {
			return "", err
		}
		b.WriteString(boot)
		return b.String(), nil
	}
	if DockerImage(spec) == "" {
		b.WriteString(nodefiles.RenderScript(spec))
		return b.String(), nil
	}
	script := nodefiles.RenderScript(spec)
	if strings.Contains(script, "\n"+vmJobEOF+"\n") {
		return "", fmt.Errorf("%w: %s: the task's script contains the line %s", launcher.ErrInvalid, infra, vmJobEOF)
	}
	b.WriteString("ferry_state=${FERRY_STATE_DIR:-/var/lib/ferry}\nmkdir -p \"$ferry_state\"\n")
	b.WriteString("cat > \"$ferry_state/task.sh\" <<'" + vmJobEOF + "'\n" + script + vmJobEOF + "\n")
	b.WriteString(dockerSetup(spec))
	b.WriteString("exec " + runCommand(spec, `"$ferry_state/task.sh"`) + "\n")
	return b.String(), nil
}

// dockerSetup installs docker where the VM lacks it, pulls the task's image and builds the
// container's command line in the array ferry_docker (runCommand runs it).
func dockerSetup(spec launcher.Spec) string {
	img := DockerImage(spec)
	if img == "" {
		return ""
	}
	var b strings.Builder
	b.WriteString(`command -v docker >/dev/null || { echo "ferry: installing docker"; curl -fsSL https://get.docker.com | sh; }
echo "ferry: pulling "` + nodefiles.ShellQuote(img) + `
docker pull ` + nodefiles.ShellQuote(img) + ` || { echo "ferry: docker pull failed" >&2; exit 1; }
ferry_docker=(docker run --rm --net=host)
`)
	if spec.Placement.Accelerator != "" && spec.Placement.AcceleratorCount > 0 {
		b.WriteString("ferry_docker+=(--gpus all)\n")
	}
	b.WriteString(`ferry_docker+=(-v "$ferry_state:$ferry_state")` + "\n")
	if spec.Workdir != "" {
		b.WriteString(`ferry_docker+=(-v "$` + nodefiles.EnvWorkdir + `:$` + nodefiles.EnvWorkdir + `")` + "\n")
	}
	for _, dst := range slices.Sorted(maps.Keys(spec.FileMounts)) {
		rel, inHome, err := nodefiles.RemotePath(dst)
		if err != nil {
			continue // nodefiles.SpecFiles refused it already
		}
		in := "/" + nodefiles.ShellQuote(rel)
		if inHome {
			in = `"$ferry_home"/` + nodefiles.ShellQuote(rel)
		}
		// The VM's copy is under the files root; in the container it is at the mount's path.
		b.WriteString(`ferry_docker+=(-v "$ferry_files"` + in + `:` + in + `)` + "\n")
	}
	b.WriteString(`[ -z "${` + launcher.EnvCheckpointDir + `:-}" ] || ferry_docker+=(-v "$` + launcher.EnvCheckpointDir + `:$` + launcher.EnvCheckpointDir + `")` + "\n")
	envs := slices.Sorted(maps.Keys(spec.Envs))
	envs = append(envs, "FERRY_PORT", "FERRY_HOST", nodefiles.EnvFilesRoot, nodefiles.EnvWorkdir, launcher.EnvCheckpointDir)
	if spec.Job != nil {
		envs = append(envs, EnvPreemptionFile)
	}
	b.WriteString("ferry_docker+=(")
	for i, k := range slices.Compact(envs) {
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString("-e " + k)
	}
	b.WriteString(" " + nodefiles.ShellQuote(img) + ")\n")
	return b.String()
}

// runCommand runs the script at path (a shell word): with bash on the VM, or in the task's
// container (dockerSetup).
func runCommand(spec launcher.Spec, path string) string {
	if DockerImage(spec) == "" {
		return "bash " + path
	}
	return `"${ferry_docker[@]}" bash ` + path
}

// filesFail defines ferry_files_fail: a replica's boot stops there (the replica never becomes
// ready, its console says why); a job node ends as a failed setup, with its exit marker, so
// the job fails instead of waiting.
func filesFail(spec launcher.Spec) string {
	if spec.Job == nil {
		return "ferry_files_fail() { echo \"ferry: files: $1 failed\" >&2; exit 1; }\n"
	}
	return "ferry_files_fail() { echo \"ferry: files: $1 failed\" >&2; echo \"" + ExitMarker + strconv.Itoa(launcher.ExitSetupFailed) + "\"; poweroff; exit 1; }\n"
}

// vmBuckets checks that a VM on infra can reach f's buckets: a mount needs the VM's own
// credentials for its cloud (nodefiles.MountFits, and an instance profile on AWS); a gs://
// copy the VM's service account, or a token from the controller's Google credentials.
func vmBuckets(infra string, f nodefiles.Files, o BootOptions) error {
	for _, m := range f.Mounts {
		switch {
		case m.Bucket == nil:
		case m.Mounted():
			if err := nodefiles.MountFits(m, infra); err != nil {
				return fmt.Errorf("%s: %w", infra, err)
			}
			if m.Bucket.Scheme == "s3" && !o.S3Role {
				return fmt.Errorf("%w: %s: file_mounts.%s: %s (mode %s) is mounted with the VM's own AWS credentials, an IAM instance profile whose role can read and write the bucket, and none is configured: %s; or write mode: COPY", nodefiles.ErrFiles, infra, m.Dst, m.Src, m.Mode, o.S3RoleHint)
			}
		case m.Bucket.Scheme == "gs" && !o.GCSToken:
			if _, ok := o.Buckets.(nodefiles.GCSReader); !ok {
				return fmt.Errorf("%w: %s: file_mounts.%s: %s needs Google credentials to fetch, which %s VMs do not have and the controller cannot lend; copy the data to s3:// (presigned downloads work anywhere)", nodefiles.ErrFiles, infra, m.Dst, m.Src, infra)
			}
		}
	}
	return nil
}

// gcsCopyToken is the token a VM without a Google service account fetches f's gs:// copies
// with, from b (nodefiles.GCSReader); "" when f copies none.
func gcsCopyToken(ctx context.Context, f nodefiles.Files, b nodefiles.Buckets) (string, error) {
	var us []nodefiles.BucketURL
	for _, m := range f.Mounts {
		if m.Bucket != nil && m.Bucket.Scheme == "gs" && !m.Mounted() {
			us = append(us, *m.Bucket)
		}
	}
	if len(us) == 0 {
		return "", nil
	}
	r, ok := b.(nodefiles.GCSReader)
	if !ok {
		return "", fmt.Errorf("%w: the bucket client cannot lend a token for gs://", nodefiles.ErrFiles)
	}
	tok, err := r.GCSReadToken(ctx, us)
	if err != nil {
		return "", fmt.Errorf("%w: %s cannot be fetched on a VM without Google credentials: the controller could not lend it a token (%v); give the controller Application Default Credentials, or copy the data to s3://", nodefiles.ErrFiles, us[0], err)
	}
	return tok, nil
}
