package testcluster

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The test cluster has no HAMi: its scheduler extender and device plugin need real GPUs. What
// stands in for HAMi's scheduler is a second, real kube-scheduler whose profiles are named as
// Ferry's pods ask (schedulerName) and score nodes only by NodeResourcesFit on HAMi's extended
// resources, which the nodes AddHAMiNode creates advertise in their allocatable:
//
//   - Binpack: MostAllocated, so a pod goes to the node whose GPU cores and memory are most
//     taken — HAMi's node-scheduler-policy binpack, per node;
//   - Spread: LeastAllocated — HAMi's spread, per node.
//
// Filtering is kube-scheduler's own accounting (a node whose free nvidia.com/gpucores or
// gpumem-percentage is short is infeasible), node affinity included. What it cannot do is what
// only HAMi does: read the per-pod policy annotation (a profile has one strategy, so a test
// picks the profile by schedulerName), choose devices inside a node (gpu-scheduler-policy, UUID
// pins, type matching by substring) and enforce the memory cap in the container.

// Scoring strategies of a sharing scheduler's profile.
const (
	Binpack = "MostAllocated"
	Spread  = "LeastAllocated"
)

// sharedResources are the extended resources a sharing profile scores on.
var sharedResources = []string{HAMiGPUCores, HAMiGPUMemPercentage, HAMiGPUMem}

// StartSharingScheduler starts a kube-scheduler with one profile per entry of profiles
// (schedulerName → Binpack or Spread) and waits until it serves. It runs until the cluster
// stops; leader election is off, so a second one with the same names would race it: start it
// once per cluster.
func (c *Cluster) StartSharingScheduler(ctx context.Context, profiles map[string]string) error {
	if len(profiles) == 0 {
		return fmt.Errorf("testcluster: a sharing scheduler needs at least one profile")
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n")
	fmt.Fprintf(&b, "leaderElection:\n  leaderElect: false\nclientConnection:\n  kubeconfig: %q\nprofiles:\n", c.kubeconfig)
	for _, name := range slices.Sorted(maps.Keys(profiles)) {
		strategy := profiles[name]
		if strategy != Binpack && strategy != Spread {
			return fmt.Errorf("testcluster: profile %s: strategy %q is neither Binpack nor Spread", name, strategy)
		}
		fmt.Fprintf(&b, "- schedulerName: %q\n  plugins:\n    score:\n      disabled: [{name: \"*\"}]\n      enabled: [{name: NodeResourcesFit, weight: 1}]\n", name)
		fmt.Fprintf(&b, "  pluginConfig:\n  - name: NodeResourcesFit\n    args:\n      scoringStrategy:\n        type: %s\n        resources:\n", strategy)
		for _, r := range sharedResources {
			fmt.Fprintf(&b, "        - {name: %q, weight: 1}\n", r)
		}
	}
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	cfgPath := filepath.Join(c.dir, "sharing-scheduler-"+tag+".yaml")
	if err := os.WriteFile(cfgPath, []byte(b.String()), 0o600); err != nil {
		return err
	}
	p, err := startProcess("sharing-scheduler", filepath.Join(c.dir, "sharing-scheduler-"+tag+".log"), nil,
		filepath.Join(c.binDir, "kube-scheduler"),
		"--config="+cfgPath,
		"--authentication-kubeconfig="+c.kubeconfig,
		"--authorization-kubeconfig="+c.kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(ports[0]))
	if err != nil {
		return err
	}
	c.extraMu.Lock()
	c.extra = append(c.extra, p)
	c.extraMu.Unlock()
	return waitReady(ctx, []check{{proc: p, ready: httpReady("https://127.0.0.1:"+strconv.Itoa(ports[0])+"/healthz", "", "ok")}}, defaultStartTimeout)
}
