package kubernetes

import (
	"fmt"
	"maps"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// A file_mounts source pvc://CLAIM[/SUBPATH] is a PersistentVolumeClaim of the pod's namespace,
// mounted into the task's container at the mount's path, read-only: the pod sees the claim's
// files (or those under SUBPATH) as they are, nothing is copied, and no size limit applies.
// Read-only because every replica of a service mounts the same claim: replicas writing the
// same files would race, and a tenant's data set (a FerryService's claim) is not the pod's to
// change. A claim whose access mode is ReadWriteOnce attaches to one node at a time, so its
// replicas must land there; ReadOnlyMany or ReadWriteMany claims have no such limit. The mount
// path must be absolute (a volume has no $HOME to be under).

// claimScheme prefixes a claim source.
const claimScheme = "pvc://"

// claimMount is one pvc:// file mount.
type claimMount struct {
	dst, claim, subPath string
}

// splitClaims takes the pvc:// file mounts out of spec (a copy of it): they are volumes of the
// pod, not files to copy, and the rest of spec's files go on as before (files.go).
func splitClaims(spec launcher.Spec) (launcher.Spec, []claimMount, error) {
	var claims []claimMount
	var rest map[string]string
	for _, dst := range slices.Sorted(maps.Keys(spec.FileMounts)) {
		src := spec.FileMounts[dst]
		body, ok := strings.CutPrefix(src, claimScheme)
		if !ok {
			continue
		}
		if rest == nil {
			rest = maps.Clone(spec.FileMounts)
		}
		delete(rest, dst)
		name, sub, _ := strings.Cut(body, "/")
		sub = strings.TrimSuffix(sub, "/")
		switch {
		case len(validation.IsDNS1123Subdomain(name)) > 0:
			return spec, nil, fmt.Errorf("%w: file_mounts.%s: %s: %q is not a PersistentVolumeClaim name", nodefiles.ErrFiles, dst, src, name)
		case sub != "" && (!filepath.IsLocal(sub) || path.Clean(sub) != sub):
			return spec, nil, fmt.Errorf("%w: file_mounts.%s: %s: the path in the claim must be a clean relative path that stays inside it", nodefiles.ErrFiles, dst, src)
		case !strings.HasPrefix(dst, "/") || path.Clean(dst) == "/":
			return spec, nil, fmt.Errorf("%w: file_mounts.%s: %s: a claim is mounted at an absolute path other than /: write /data (or another)", nodefiles.ErrFiles, dst, src)
		}
		claims = append(claims, claimMount{dst: path.Clean(dst), claim: name, subPath: sub})
	}
	if claims != nil {
		spec.FileMounts = rest
	}
	return spec, claims, nil
}

// attachClaims adds a read-only volume per claim to pod and mounts each claim mount into its
// first container.
func attachClaims(pod *corev1.Pod, claims []claimMount) {
	volumes := map[string]string{} // claim -> volume
	ctr := &pod.Spec.Containers[0]
	for _, m := range claims {
		vol, ok := volumes[m.claim]
		if !ok {
			vol = "ferry-claim-" + strconv.Itoa(len(volumes))
			volumes[m.claim] = vol
			pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: vol, VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: m.claim, ReadOnly: true}}})
		}
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: vol, MountPath: m.dst, SubPath: m.subPath, ReadOnly: true})
	}
}
