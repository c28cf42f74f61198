package vmnode

import (
	"strings"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// EnvFakeNFSRoot, set in a fake cloud VM's environment, stands for the shared filesystem that
// CheckpointShell mounts: a host directory that the fake's VMs of one region share, as the
// VMs of one region reach one EFS or Filestore.
const EnvFakeNFSRoot = "FERRY_FAKE_NFS_ROOT"

// CheckpointMountPoint is where a cloud job node mounts the shared checkpoint filesystem.
const CheckpointMountPoint = "/mnt/ferry-checkpoints"

// CheckpointShell is the part of a cloud job node's boot script that makes
// FERRY_CHECKPOINT_DIR. With nfs ("server:/export": an EFS file system, a Filestore share,
// any NFSv4 server the VMs reach), it is the job's claim directory on that filesystem, mounted
// at CheckpointMountPoint, which every node of the gang and every later gang of the job in
// reach of it sees: a recovery in another zone of the region resumes from it. Without nfs it
// is dir on the VM's own disk (under $FERRY_VM_ROOT on the fakes), which survives a restart of
// the program and not a recovery, and the node says so in its log.
func CheckpointShell(nfs, claim, dir string) string {
	var b strings.Builder
	if nfs != "" && claim != "" {
		b.WriteString("ferry_nfs=" + CheckpointMountPoint + "\n")
		b.WriteString(`if [ -n "${` + EnvFakeNFSRoot + `:-}" ]; then` + "\n")
		b.WriteString(`  ferry_nfs="$` + EnvFakeNFSRoot + `"` + "\n")
		b.WriteString("else\n")
		b.WriteString(`  mkdir -p "$ferry_nfs"` + "\n")
		b.WriteString(`  mountpoint -q "$ferry_nfs" || mount -t nfs4 -o nfsvers=4.1,hard,timeo=600,retrans=2 ` + nodefiles.ShellQuote(nfs) + ` "$ferry_nfs"` + "\n")
		b.WriteString("fi\n")
		b.WriteString("export " + launcher.EnvCheckpointDir + `="$ferry_nfs"/` + nodefiles.ShellQuote(claim) + "\n")
	} else {
		if dir == "" {
			return ""
		}
		if !strings.HasPrefix(dir, "/") {
			dir = "/" + dir
		}
		b.WriteString("export " + launcher.EnvCheckpointDir + `="${FERRY_VM_ROOT:-}"` + nodefiles.ShellQuote(dir) + "\n")
		b.WriteString(`echo "ferry: no checkpoint_nfs is configured for this cloud: $` + launcher.EnvCheckpointDir +
			` is on this VM's disk and does not survive a recovery"` + "\n")
	}
	b.WriteString(`mkdir -p "$` + launcher.EnvCheckpointDir + `"` + "\n")
	return b.String()
}
