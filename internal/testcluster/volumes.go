package testcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// PersistentVolumeClaims. No controller-manager or storage provisioner runs, and the
// scheduler leaves a pod whose claim is unbound Pending, so the Kubelet stand-in provisions and
// binds every claim itself: a hostPath PersistentVolume "pvc-<claim UID>" on a directory of
// the cluster's (volumes/<namespace>_<claim>_<UID>), bound both ways as the volume controller
// binds them. The directory outlives the pods that use it and goes with the claim (reclaim
// policy Delete). The API server runs without the StorageObjectInUseProtection admission
// plugin, so a deleted claim goes at once rather than waiting on a finalizer nobody removes.

// Annotations the volume controller sets on a claim it bound; the scheduler counts a claim as
// bound only with bind-completed.
const (
	annBindCompleted      = "pv.kubernetes.io/bind-completed"
	annBoundByController  = "pv.kubernetes.io/bound-by-controller"
	annProvisionedBy      = "pv.kubernetes.io/provisioned-by"
	standInProvisionerTag = "ferry.testcluster/kubelet-stand-in"
)

// claimVolumeName is the PersistentVolume the stand-in makes for a claim.
func claimVolumeName(pvc *corev1.PersistentVolumeClaim) string { return "pvc-" + string(pvc.UID) }

// claimHostDir is the host directory behind a claim.
func (k *Kubelet) claimHostDir(pvc *corev1.PersistentVolumeClaim) string {
	return filepath.Join(k.cluster.Dir(), "volumes", pvc.Namespace+"_"+pvc.Name+"_"+string(pvc.UID))
}

// bindClaim provisions a volume for the claim namespace/name and binds them, unless it is bound
// or gone. An error means try again.
func (k *Kubelet) bindClaim(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pvc, err := k.pvcs.PersistentVolumeClaims(ns).Get(name)
	if err != nil || pvc.DeletionTimestamp != nil || pvc.Spec.VolumeName != "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	dir := k.claimHostDir(pvc)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	size := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if size.IsZero() {
		size = resource.MustParse("1Gi")
	}
	class := ""
	if pvc.Spec.StorageClassName != nil {
		class = *pvc.Spec.StorageClassName
	}
	hostPathType := corev1.HostPathDirectory
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        claimVolumeName(pvc),
			Annotations: map[string]string{annProvisionedBy: standInProvisionerTag},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   pvc.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              class,
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &hostPathType},
			},
			ClaimRef: &corev1.ObjectReference{
				Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID,
			},
		},
	}
	client := k.cluster.Client().CoreV1()
	created, err := client.PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = client.PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("create volume for claim %s: %w", key, err)
	}
	if created.Status.Phase != corev1.VolumeBound {
		created.Status.Phase = corev1.VolumeBound
		if _, err := client.PersistentVolumes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("bind volume %s: %w", pv.Name, err)
		}
	}
	cur, err := client.PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil || cur.UID != pvc.UID {
		return nil // gone; releaseClaim cleans up
	}
	cur.Spec.VolumeName = pv.Name
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	cur.Annotations[annBindCompleted] = "yes"
	cur.Annotations[annBoundByController] = "yes"
	if cur, err = client.PersistentVolumeClaims(ns).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("bind claim %s: %w", key, err)
	}
	cur.Status.Phase = corev1.ClaimBound
	cur.Status.AccessModes = pvc.Spec.AccessModes
	cur.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: size}
	if _, err := client.PersistentVolumeClaims(ns).UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("mark claim %s bound: %w", key, err)
	}
	return nil
}

// releaseClaim deletes a deleted claim's volume and directory (reclaim policy Delete).
func (k *Kubelet) releaseClaim(obj any) {
	if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	pvc, ok := obj.(*corev1.PersistentVolumeClaim)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := k.cluster.Client().CoreV1().PersistentVolumes().Delete(ctx, claimVolumeName(pvc), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return
	}
	_ = os.RemoveAll(k.claimHostDir(pvc))
}

// ClaimDir is the host directory holding the claim namespace/name's data, once the stand-in
// bound it: what a pod mounting the claim sees.
func (k *Kubelet) ClaimDir(namespace, claim string) (string, error) {
	if k.pvcs == nil {
		return "", fmt.Errorf("%w: the kubelet stand-in has not started", errNotReady)
	}
	pvc, err := k.pvcs.PersistentVolumeClaims(namespace).Get(claim)
	if err != nil {
		return "", fmt.Errorf("%w: claim %s/%s: %v", errNotReady, namespace, claim, err)
	}
	if pvc.Spec.VolumeName == "" {
		return "", fmt.Errorf("%w: claim %s/%s is not bound yet", errNotReady, namespace, claim)
	}
	pv, err := k.pvs.Get(pvc.Spec.VolumeName)
	if err != nil {
		return "", fmt.Errorf("%w: volume %s of claim %s/%s: %v", errNotReady, pvc.Spec.VolumeName, namespace, claim, err)
	}
	if pv.Spec.HostPath == nil {
		return "", fmt.Errorf("volume %s of claim %s/%s is not on this host", pv.Name, namespace, claim)
	}
	return pv.Spec.HostPath.Path, nil
}
