package kubernetes

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Replica and job pods run with Kubernetes' "restricted" Pod Security profile as far as Ferry
// can know it holds, and without an API token, unless the task asks for more through
// config.kubernetes.pod_config (podconfig.go). restrict fills what the task left unset, after
// pod_config is merged and the files are attached, so that whatever a task writes wins:
//
//   - automountServiceAccountToken: false. A replica's program has no business with the API
//     server; a task that needs the token (an operator, a job that lists pods) writes
//     automountServiceAccountToken: true. Naming a serviceAccountName alone does not bring
//     the token back: clouds' workload identities (EKS IRSA and Pod Identity, GKE Workload
//     Identity) project their own tokens and do not need it.
//   - seccompProfile RuntimeDefault for the pod.
//   - every container, init containers included: allowPrivilegeEscalation false and
//     capabilities drop ALL (a task's capabilities.add keeps the drop, so it gets exactly what
//     it adds; drop: [] keeps the runtime's default set).
//   - runAsNonRoot true when the pod's user is known and not root: the task sets runAsUser
//     (pod or container) above 0. Ferry does not read an image's USER (it would need the
//     registry and the image's credentials), the default image and the common serving images
//     (vllm/vllm-openai, lmsysorg/sglang, text-generation-inference) run as root, and their
//     setup installs packages; runAsNonRoot on a root image stops its container from starting
//     ("container has runAsNonRoot and image will run as root"). So an unknown user stays as
//     the image says, and a namespace that enforces "restricted" needs the task to say
//     runAsUser.
//   - A privileged container (one that mounts a bucket with FUSE, mounts.go, or a task that
//     asks) is left as it is: privilege includes every capability and escalation, and the API
//     server refuses privileged with allowPrivilegeEscalation false.

// restrict applies Ferry's defaults to what pod leaves unset.
func restrict(pod *corev1.Pod) {
	if pod.Spec.AutomountServiceAccountToken == nil {
		pod.Spec.AutomountServiceAccountToken = new(false)
	}
	if pod.Spec.SecurityContext == nil {
		pod.Spec.SecurityContext = &corev1.PodSecurityContext{}
	}
	psc := pod.Spec.SecurityContext
	if psc.SeccompProfile == nil {
		psc.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	}
	for i := range pod.Spec.InitContainers {
		restrictContainer(&pod.Spec.InitContainers[i], psc)
	}
	for i := range pod.Spec.Containers {
		restrictContainer(&pod.Spec.Containers[i], psc)
	}
}

// restrictContainer applies the container half of restrict.
func restrictContainer(c *corev1.Container, psc *corev1.PodSecurityContext) {
	if c.SecurityContext == nil {
		c.SecurityContext = &corev1.SecurityContext{}
	}
	sc := c.SecurityContext
	if sc.Privileged != nil && *sc.Privileged {
		return
	}
	if sc.AllowPrivilegeEscalation == nil {
		sc.AllowPrivilegeEscalation = new(false)
	}
	if sc.Capabilities == nil {
		sc.Capabilities = &corev1.Capabilities{}
	}
	if sc.Capabilities.Drop == nil {
		sc.Capabilities.Drop = []corev1.Capability{"ALL"}
	}
	if sc.RunAsNonRoot != nil || psc.RunAsNonRoot != nil {
		return
	}
	uid := sc.RunAsUser
	if uid == nil {
		uid = psc.RunAsUser
	}
	if uid != nil && *uid > 0 {
		sc.RunAsNonRoot = new(true)
	}
}

// podSecurityHint adds what to do to a refusal by the namespace's Pod Security admission
// ("violates PodSecurity"); other errors are returned as they are.
func podSecurityHint(err error) error {
	if err == nil || !strings.Contains(err.Error(), "violates PodSecurity") {
		return err
	}
	return fmt.Errorf("%w (the namespace's Pod Security level refuses the pod. Ferry's pods meet \"restricted\" but for runAsNonRoot, "+
		"which holds when the task names a non-root user: config.kubernetes.pod_config: {spec: {securityContext: {runAsUser: 1000}}}; "+
		"a pod that mounts a bucket with FUSE (MOUNT, MOUNT_CACHED) runs privileged, which only the \"privileged\" level admits: "+
		"run it in another namespace or copy the files (mode: COPY))", err)
}
