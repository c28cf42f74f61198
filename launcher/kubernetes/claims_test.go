package kubernetes

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/ferryserve/ferry/launcher"
)

// TestSplitClaims: pvc:// file mounts leave the files to copy and become read-only volumes of
// the pod, one per claim, each mount at its path (and path in the claim); a claim mount
// that could not be a volume mount is refused with what to write.
func TestSplitClaims(t *testing.T) {
	spec := launcher.Spec{Workdir: "/w", FileMounts: map[string]string{
		"/models": "pvc://models", "/data/train": "pvc://data/sets/train/", "/data/eval": "pvc://data/sets/eval", "/etc/app.yaml": "/snap/app.yaml"}}
	rest, claims, err := splitClaims(spec)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"/etc/app.yaml": "/snap/app.yaml"}, rest.FileMounts); diff != "" {
		t.Errorf("files left to copy (-want +got):\n%s", diff)
	}
	if len(spec.FileMounts) != 4 {
		t.Errorf("the caller's spec changed: %v", spec.FileMounts)
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "task"}}}}
	attachClaims(pod, claims)
	wantVolumes := []corev1.Volume{
		{Name: "ferry-claim-0", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data", ReadOnly: true}}},
		{Name: "ferry-claim-1", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "models", ReadOnly: true}}},
	}
	if diff := cmp.Diff(wantVolumes, pod.Spec.Volumes); diff != "" {
		t.Errorf("volumes (-want +got):\n%s", diff)
	}
	wantMounts := []corev1.VolumeMount{
		{Name: "ferry-claim-0", MountPath: "/data/eval", SubPath: "sets/eval", ReadOnly: true},
		{Name: "ferry-claim-0", MountPath: "/data/train", SubPath: "sets/train", ReadOnly: true},
		{Name: "ferry-claim-1", MountPath: "/models", ReadOnly: true},
	}
	if diff := cmp.Diff(wantMounts, pod.Spec.Containers[0].VolumeMounts); diff != "" {
		t.Errorf("mounts (-want +got):\n%s", diff)
	}

	refused := map[string]struct{ dst, src, want string }{
		"in home":      {dst: "~/models", src: "pvc://models", want: "a claim is mounted at an absolute path"},
		"root":         {dst: "/", src: "pvc://models", want: "a claim is mounted at an absolute path other than /"},
		"leaves it":    {dst: "/m", src: "pvc://models/../x", want: "must be a clean relative path"},
		"bad name":     {dst: "/m", src: "pvc://Models", want: "is not a PersistentVolumeClaim name"},
		"absolute sub": {dst: "/m", src: "pvc://models//etc", want: "must be a clean relative path"},
	}
	for name, tc := range refused {
		t.Run(name, func(t *testing.T) {
			_, _, err := splitClaims(launcher.Spec{FileMounts: map[string]string{tc.dst: tc.src}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
