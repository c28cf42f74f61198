package aws

import (
	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/nodefiles"
	"github.com/ferryserve/ferry/launcher/vmnode"
)

// A VM that mounts s3:// buckets (MOUNT, MOUNT_CACHED: launcher/nodefiles/mounts.go) runs with
// Options.MountInstanceProfile: goofys and rclone on it sign with its role's credentials,
// which the instance metadata service serves (IMDSv2, hop limit 1: a container behind a bridge
// gets none, but a docker: task runs with --net=host). A VM that mounts nothing gets no
// profile: the presigned URLs of copied objects need none. gs:// cannot be mounted on EC2.

// bootOptions are what every VM's boot script is made with.
func (p *Provider) bootOptions() vmnode.BootOptions {
	return vmnode.BootOptions{Buckets: p.opts.Buckets, NFS: p.opts.CheckpointNFS,
		S3Role:     p.opts.MountInstanceProfile != "",
		S3RoleHint: "set aws.mount_instance_profile in Ferry's config to an IAM instance profile whose role may s3:ListBucket, s3:GetObject, s3:PutObject and s3:DeleteObject on it"}
}

// mountProfile is the instance profile spec's VM runs with: the mount profile when it mounts
// an s3:// bucket, else none.
func (p *Provider) mountProfile(spec launcher.Spec) *types.IamInstanceProfileSpecification {
	if p.opts.MountInstanceProfile == "" {
		return nil
	}
	files, err := nodefiles.SpecFiles(spec)
	if err != nil {
		return nil // the boot script's checks refused it already
	}
	for _, m := range files.Mounts {
		if m.Mounted() && m.Bucket.Scheme == "s3" {
			return &types.IamInstanceProfileSpecification{Name: awssdk.String(p.opts.MountInstanceProfile)}
		}
	}
	return nil
}
