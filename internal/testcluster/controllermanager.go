package testcluster

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The test cluster runs no kube-controller-manager unless Options.ControllerManager asks for
// one: most tests create pods themselves and would only pay for its informers. With it, a
// Deployment gets its ReplicaSet and pods, a HorizontalPodAutoscaler scales the Deployment, and
// the garbage collector deletes what an owner leaves behind, so a test can exercise an
// autoscaled workload the way a cluster runs it.

// ControllerManagerControllers are the controllers the test cluster's kube-controller-manager
// runs: what a Deployment scaled by an HPA needs, and the garbage collector that removes its
// ReplicaSets and pods. Nothing else: no service-account tokens (the ServiceAccount admission
// plugin is off, so pods ask for none), no node lifecycle (kwok keeps the nodes), no endpoints
// (loopback pods are reached at their IPs).
var ControllerManagerControllers = []string{
	"deployment-controller",
	"replicaset-controller",
	"horizontal-pod-autoscaler-controller",
	"garbage-collector-controller",
}

// HPASyncPeriod is how often the test cluster's HPA controller reads metrics and decides: 15 s
// in a real cluster, shorter here so a scale test waits seconds, not minutes.
const HPASyncPeriod = 2 * time.Second

// hpaDownscaleStabilization is the controller manager's default scale-down window for an HPA
// that sets none in spec.behavior (5 minutes in a real cluster).
const hpaDownscaleStabilization = 10 * time.Second

// startControllerManager starts kube-controller-manager with ControllerManagerControllers as
// the cluster's admin, and waits until it serves its health check.
func (c *Cluster) startControllerManager(ctx context.Context, timeout time.Duration) error {
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	port := strconv.Itoa(ports[0])
	p, err := startProcess("kube-controller-manager", filepath.Join(c.dir, "kube-controller-manager.log"), nil,
		filepath.Join(c.binDir, "kube-controller-manager"),
		"--kubeconfig="+c.kubeconfig,
		"--authentication-kubeconfig="+c.kubeconfig,
		"--authorization-kubeconfig="+c.kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+port,
		"--leader-elect=false",
		"--controllers="+strings.Join(ControllerManagerControllers, ","),
		"--horizontal-pod-autoscaler-sync-period="+HPASyncPeriod.String(),
		"--horizontal-pod-autoscaler-downscale-stabilization="+hpaDownscaleStabilization.String(),
		"--profiling=false",
	)
	if err != nil {
		return err
	}
	c.extraMu.Lock()
	c.extra = append(c.extra, p)
	c.extraMu.Unlock()
	return waitReady(ctx, []check{{proc: p, ready: httpReady("https://127.0.0.1:"+port+"/healthz", "", "ok")}}, timeout)
}
