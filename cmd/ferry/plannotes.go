package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher/kubernetes"
	"github.com/ferryserve/ferry/launcher/optimizer"
)

// printPlanNotes says, under a plan, what the task's SkyPilot fields do with it that the table
// does not show: network_tier, config.kubernetes, a git workdir, an elastic job's sizes. A
// pod_config that cannot make a pod fails the plan, as its launch would.
func printPlanNotes(out io.Writer, task *configs.Task, cands []optimizer.Candidate) error {
	var notes []string
	if n := optimizer.NetworkNote(task.Resources, cands); n != "" {
		notes = append(notes, n)
	}
	if k := task.KubernetesConfig(); k != nil {
		if err := kubernetes.CheckPodConfig(k); err != nil {
			return err
		}
		notes = append(notes, kubernetesNote(k, cands))
	}
	if g := task.GitWorkdir; g != nil {
		notes = append(notes, fmt.Sprintf("workdir: %s is cloned on each node before setup (the node needs git; a private repository needs GIT_TOKEN or GIT_SSH_KEY as a secret)", g))
	}
	if j := task.Job; j != nil && j.Recovery.Elastic() {
		notes = append(notes, fmt.Sprintf("job_recovery: DYNAMIC_NODE_SET: the job runs on as many of its %d nodes as can be placed together, at least %d, and grows back when capacity returns (the gang restarts, from its checkpoint, at the larger size)",
			max(task.NumNodes, 1), j.Recovery.MinNodes))
	}
	for _, n := range notes {
		fmt.Fprintf(out, "Note: %s.\n", strings.TrimSuffix(n, "."))
	}
	return nil
}

// kubernetesNote says what config.kubernetes does with this plan.
func kubernetesNote(k *configs.KubernetesTaskConfig, cands []optimizer.Candidate) string {
	onKube := false
	for _, c := range cands {
		onKube = onKube || strings.HasPrefix(c.Placement.Infra, kubernetes.InfraName+"/")
	}
	if !onKube {
		return "config.kubernetes shapes Kubernetes pods, and no placement above is on Kubernetes: it changes nothing here"
	}
	var what []string
	if len(k.PodConfig) > 0 {
		what = append(what, "pod_config is merged into each pod")
	}
	if len(k.CustomMetadata) > 0 {
		what = append(what, "custom_metadata's labels and annotations are added")
	}
	if k.ProvisionTimeoutSeconds > 0 {
		what = append(what, fmt.Sprintf("a pod unschedulable for %ds moves the launch to the next placement", k.ProvisionTimeoutSeconds))
	}
	return "config.kubernetes: " + strings.Join(what, "; ")
}
