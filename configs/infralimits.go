package configs

import "gopkg.in/yaml.v3"

// Limits of one infra that a launch would hit; checked here so --dry-run refuses what launch
// would. Both are AWS's (launcher/aws): a VM's task travels in EC2 user-data, and a job's gang
// shares its addresses through one tag.
const (
	// awsUserDataBytes is EC2's user-data limit.
	awsUserDataBytes = 16 << 10
	// awsMaxGang is launcher/aws's largest gang (its addresses go in one 256-character tag).
	awsMaxGang = 16
)

// checkInfraLimits reports a task every candidate of which is on AWS and that AWS cannot take.
func (c *checker) checkInfraLimits(t *Task, f map[string]entry) {
	for _, cand := range t.Resources.Candidates() {
		if cand.Cloud != "aws" {
			return
		}
	}
	size := len(t.Setup) + len(t.Run)
	for k, v := range t.Envs {
		size += len(k) + len(v) + len("export =''\n")
	}
	for k, v := range t.Secrets {
		size += len(k) + len(v) + len("export =''\n")
	}
	if size > awsUserDataBytes {
		c.errorf(nodeOf(f, "run"), "run", "on AWS a VM gets its task through EC2 user-data, at most %d bytes, and setup, run, envs and secrets take %d: move setup into a script on the image (image_id) or in workdir", awsUserDataBytes, size)
	}
	if t.Job != nil && t.NumNodes > awsMaxGang {
		c.errorf(nodeOf(f, "num_nodes"), "num_nodes", "a job's gang on AWS is at most %d nodes (got %d): lower num_nodes or let it run on Kubernetes or GCP", awsMaxGang, t.NumNodes)
	}
}

// nodeOf is the value node of key, or nil when the task does not write it.
func nodeOf(f map[string]entry, key string) *yaml.Node {
	if e, ok := f[key]; ok {
		return e.value
	}
	return nil
}
