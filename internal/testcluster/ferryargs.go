package testcluster

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// FerryArgsAnnotation, on a pod, names the ferry command the kubelet stand-in runs for it instead
// of `ferry replica-sim`: the arguments after the binary, split on white space, with $(POD_IP)
// replaced by the pod's IP (Kubernetes' own syntax for a variable in a container's args). A
// Deployment of attached proxies, say, runs
//
//	ferry.dev/test-ferry-args: proxy --attach-all --listen $(POD_IP):8000 --metrics-listen $(POD_IP):9465
//
// so that its pods are real `ferry proxy` processes, each on its own loopback IP, started and
// stopped (SIGTERM, then SIGKILL after KubeletOptions.StopGrace) as the pods come and go. The
// first container's literal env values are in its environment, as for a replica-sim.
const FerryArgsAnnotation = "ferry.dev/test-ferry-args"

// ferryArgs is the command line FerryArgsAnnotation asks of pod, if it asks one.
func ferryArgs(pod *corev1.Pod) ([]string, bool) {
	value, ok := pod.Annotations[FerryArgsAnnotation]
	if !ok {
		return nil, false
	}
	args := strings.Fields(value)
	for i, arg := range args {
		args[i] = strings.ReplaceAll(arg, "$(POD_IP)", pod.Status.PodIP)
	}
	return args, true
}
