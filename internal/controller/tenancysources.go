package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher/buckets"
	kubelauncher "github.com/ferryserve/ferry/launcher/kubernetes"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// How a FerryService's sources (tenancy.go) reach its replicas. ConfigMap and Secret sources
// are read by the leader (one GET each, in the FerryService's namespace) and snapshotted under
// FERRY_HOME/ferryservice-files/NAMESPACE, one directory per content: the task then names the
// snapshot as a CLI task names a directory, and the launch copies it as any workdir. A claim
// stays pvc://CLAIM[/SUBPATH] in the task: the Kubernetes launcher mounts it into the pod
// (launcher/kubernetes/claims.go), so the leader only checks that it exists, is labelled, and
// is in the namespace the pods run in. Snapshots no FerryService and no service names any more
// are pruned. An s3:// source is read with the tenant's credentials: the leader reads the Secret
// spec.bucketCredentials names (one GET, labelled as any source), registers a bucket client made
// from its values with the Kubernetes infras (in memory only), checks the bucket with it, and
// stores the source as s3+secret://NAMESPACE/SECRET/BUCKET/PREFIX, which the Kubernetes
// launcher presigns with that client and no other (launcher/kubernetes/tenantbuckets.go).

// configMapGetter is the one call sources make of the namespace's ConfigMaps.
type configMapGetter interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.ConfigMap, error)
}

// secretGetter is the one call sources make of the namespace's Secrets.
type secretGetter interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Secret, error)
}

// claimGetter is the one call sources make of the namespace's PersistentVolumeClaims.
type claimGetter interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.PersistentVolumeClaim, error)
}

// namespaceSources reads the sources of the FerryServices of one namespace.
type namespaceSources struct {
	namespace  string
	configMaps configMapGetter
	secrets    secretGetter
	claims     claimGetter
	// root is where snapshots are written.
	root string
	// podNamespaces are the namespaces the pods of t's Kubernetes candidates run in, by infra
	// (kubernetes/CONTEXT); nil when the controller knows no Kubernetes infra.
	podNamespaces func(t *configs.Task) map[string]string
	// registerBuckets registers the bucket client made from a tenant's credentials Secret
	// (ref NAMESPACE/SECRET) where the Kubernetes infras presign with it, or forgets it (a nil
	// newClient); nil registers nowhere (a launch then fails, naming the Secret).
	registerBuckets func(ref, version string, newClient func() nodefiles.Buckets)
}

// errSourceNotFound is a source that does not exist (yet): the reconcile retries.
var errSourceNotFound = errors.New("source not found")

// resolveSources replaces t's ConfigMap and Secret sources (checkTenancy accepted t) by
// snapshots of their contents under src.root, one directory per content (named by its hash,
// so that the same content lands at the same path after a controller restart, which rewrites
// it from the object), checks its claims, and says whether t had snapshots. The launch then
// packs them as it packs any workdir.
func resolveSources(ctx context.Context, src *namespaceSources, t *configs.Task, creds string) (bool, error) {
	var errs []error
	found := false
	var tenantBuckets *buckets.Client
	var credsErr error
	resolve := func(field, s string) string {
		if strings.HasPrefix(s, "s3://") { // checkTenancy accepted it: creds names a Secret
			if tenantBuckets == nil && credsErr == nil {
				tenantBuckets, credsErr = src.bucketCredentials(ctx, creds)
				if credsErr != nil {
					errs = append(errs, fmt.Errorf("%s: %s: %w", bucketCredentialsField, creds, credsErr))
				}
			}
			if credsErr != nil {
				return s
			}
			if err := checkTenantBucket(ctx, tenantBuckets, s, creds); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", field, err))
			}
			return kubelauncher.TenantS3Source(src.namespace, creds, s)
		}
		if claim, _ := parseClaimSource(s); claim != nil {
			if err := src.checkClaim(ctx, t, *claim); err != nil {
				errs = append(errs, fmt.Errorf("%s: %s: %w", field, s, err))
			}
			return s
		}
		ref, _ := parseObjectSource(s)
		if ref == nil {
			return s
		}
		found = true
		path, err := src.snapshot(ctx, *ref)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %s: %w", field, s, err))
			return s
		}
		return path
	}
	if t.GitWorkdir == nil && t.Workdir != "" {
		t.Workdir = resolve("workdir", t.Workdir)
	}
	for _, dst := range slices.Sorted(maps.Keys(t.FileMounts)) {
		t.FileMounts[dst] = resolve("file_mounts."+dst, t.FileMounts[dst])
	}
	return found, errors.Join(errs...)
}

// Keys of a tenant's bucket credentials Secret.
const (
	keyAccessKeyID     = "AWS_ACCESS_KEY_ID"
	keySecretAccessKey = "AWS_SECRET_ACCESS_KEY"
	keySessionToken    = "AWS_SESSION_TOKEN"
	keyRegion          = "AWS_REGION"
	keyEndpoint        = "AWS_ENDPOINT_URL_S3"
)

// bucketCredentials reads the tenant's credentials Secret name (one GET), labelled as any
// source, makes a bucket client from its values and registers it (registerBuckets) for the
// launches, and returns it. The values stay in memory: no error, log or status names them.
func (src *namespaceSources) bucketCredentials(ctx context.Context, name string) (*buckets.Client, error) {
	ref := src.namespace + "/" + name
	data, err := src.readObject(ctx, objectSource{kind: kindSecret, name: name})
	client, err := src.tenantClient(name, data, err)
	var te *TenancyError
	if (errors.Is(err, errSourceNotFound) || errors.As(err, &te)) && src.registerBuckets != nil {
		// Gone, unlabelled (its owner took it back) or no longer usable: launches stop using
		// the client made from what it held before.
		src.registerBuckets(ref, "", nil)
	}
	if err != nil {
		return nil, err
	}
	if src.registerBuckets != nil {
		src.registerBuckets(ref, client.version, func() nodefiles.Buckets { return client.Client })
	}
	return client.Client, nil
}

// tenantClient is a bucket client made from a credentials Secret's data, with a version that
// changes when the values do; readErr is the Secret's read, passed through.
func (src *namespaceSources) tenantClient(name string, data map[string][]byte, readErr error) (versionedClient, error) {
	if readErr != nil {
		return versionedClient{}, readErr
	}
	for _, k := range []string{keyAccessKeyID, keySecretAccessKey} {
		if len(data[k]) == 0 {
			return versionedClient{}, fmt.Errorf("%w: Secret %s has no key %s (it has %s): the bucket credentials are %s and %s, optionally %s and %s",
				errSourceNotFound, name, k, strings.Join(slices.Sorted(maps.Keys(data)), ", "), keyAccessKeyID, keySecretAccessKey, keySessionToken, keyRegion)
		}
	}
	if len(data[keyEndpoint]) > 0 {
		// The controller would send its requests (the bucket check, listings) wherever a
		// tenant points it, from inside the cluster: the S3 endpoint is the operator's.
		return versionedClient{}, fmt.Errorf("%w: Secret %s sets %s: the S3 endpoint is the operator's to choose (the controller's own %s), not a FerryService's: remove the key",
			errSourceNotFound, name, keyEndpoint, keyEndpoint)
	}
	h := sha256.New()
	for _, k := range []string{keyAccessKeyID, keySecretAccessKey, keySessionToken, keyRegion} {
		fmt.Fprintf(h, "%d:%s", len(data[k]), data[k])
	}
	version := hex.EncodeToString(h.Sum(nil))
	var opts buckets.Options
	opts.Credentials = credentials.NewStaticCredentialsProvider(string(data[keyAccessKeyID]), string(data[keySecretAccessKey]), string(data[keySessionToken]))
	if r := string(data[keyRegion]); r != "" {
		opts.S3Region = r
	}
	return versionedClient{buckets.New(opts), version}, nil
}

// versionedClient is a tenant's bucket client and the digest of the values it was made from.
type versionedClient struct {
	*buckets.Client
	version string
}

// checkTenantBucket checks, with the tenant's client, that the bucket of s3 source s exists
// and the credentials may list its prefix.
func checkTenantBucket(ctx context.Context, client *buckets.Client, s, creds string) error {
	u, _, err := nodefiles.ParseBucketURL(s)
	if err != nil {
		return err
	}
	if err := client.CheckBucket(ctx, u); err != nil {
		return fmt.Errorf("%w: with the credentials of Secret %s: %v", errSourceNotFound, creds, err)
	}
	return nil
}

// unlabelled is the refusal of an object whose owner did not label it for FerryServices.
func unlabelled(kind, name, resource string) error {
	return &TenancyError{Problems: []string{fmt.Sprintf("%s %s is not labelled %s=true, by which its owner lets FerryServices read it: label it (kubectl label %s %s %s=true)",
		kind, name, FilesLabel, resource, name, FilesLabel)}}
}

// readObject reads ref's ConfigMap or Secret: its files, by key.
func (src *namespaceSources) readObject(ctx context.Context, ref objectSource) (map[string][]byte, error) {
	var (
		objLabels map[string]string
		files     = map[string][]byte{}
		err       error
		resource  = "configmap"
	)
	if ref.kind == kindSecret {
		resource = "secret"
		var s *corev1.Secret
		if s, err = src.secrets.Get(ctx, ref.name, metav1.GetOptions{}); err == nil {
			objLabels = s.Labels
			maps.Copy(files, s.Data)
		}
	} else {
		var cm *corev1.ConfigMap
		if cm, err = src.configMaps.Get(ctx, ref.name, metav1.GetOptions{}); err == nil {
			objLabels = cm.Labels
			for k, v := range cm.Data {
				files[k] = []byte(v)
			}
			maps.Copy(files, cm.BinaryData)
		}
	}
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("%w: no %s %s in the FerryService's namespace: create it (labelled %s=true)", errSourceNotFound, ref.kind, ref.name, FilesLabel)
	case apierrors.IsForbidden(err):
		hint := ""
		if resource == "secret" {
			hint = " (with the Helm chart: --set controller.secretSources=true)"
		}
		return nil, fmt.Errorf("the controller may not read %s %s (%v): grant its service account get on %ss in namespace %s%s", ref.kind, ref.name, apierrors.ReasonForError(err), resource, src.namespace, hint)
	case err != nil:
		return nil, fmt.Errorf("read %s %s: %w", ref.kind, ref.name, err)
	case objLabels[FilesLabel] != "true":
		return nil, unlabelled(ref.kind, ref.name, resource)
	}
	return files, nil
}

// snapshot writes ref's object (or its one key) under src.root and returns the path of the
// directory (or file).
func (src *namespaceSources) snapshot(ctx context.Context, ref objectSource) (string, error) {
	files, err := src.readObject(ctx, ref)
	if err != nil {
		return "", err
	}
	if ref.key != "" {
		v, ok := files[ref.key]
		if !ok {
			return "", fmt.Errorf("%w: %s %s has no key %s (it has %s)", errSourceNotFound, ref.kind, ref.name, ref.key, strings.Join(slices.Sorted(maps.Keys(files)), ", "))
		}
		files = map[string][]byte{ref.key: v}
	}
	dir, err := writeSnapshot(src.root, files)
	if err != nil {
		return "", err
	}
	if ref.key != "" {
		return filepath.Join(dir, ref.key), nil
	}
	return dir, nil
}

// checkClaim checks that claim exists in the namespace, is labelled for FerryServices, and
// is in the namespace every one of t's Kubernetes infras runs its pods in: a pod mounts claims
// of its own namespace only, so a claim of the same name elsewhere would be another's.
func (src *namespaceSources) checkClaim(ctx context.Context, t *configs.Task, claim claimSource) error {
	var others []string
	if src.podNamespaces != nil {
		pods := src.podNamespaces(t)
		for _, infra := range slices.Sorted(maps.Keys(pods)) {
			if ns := pods[infra]; ns != src.namespace {
				others = append(others, fmt.Sprintf("%s runs its pods in namespace %s", infra, ns))
			}
		}
	}
	if len(others) > 0 {
		return &TenancyError{Problems: []string{fmt.Sprintf("claim %s is in namespace %s, and a pod mounts the claims of its own namespace only, but %s: name an infra (kubernetes/CONTEXT) whose namespace is %s",
			claim.name, src.namespace, strings.Join(others, ", "), src.namespace)}}
	}
	pvc, err := src.claims.Get(ctx, claim.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: no PersistentVolumeClaim %s in the FerryService's namespace: create it (labelled %s=true)", errSourceNotFound, claim.name, FilesLabel)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("the controller may not read PersistentVolumeClaim %s (%v): grant its service account get on persistentvolumeclaims in namespace %s", claim.name, apierrors.ReasonForError(err), src.namespace)
	case err != nil:
		return fmt.Errorf("read PersistentVolumeClaim %s: %w", claim.name, err)
	case pvc.Labels[FilesLabel] != "true":
		return unlabelled("PersistentVolumeClaim", claim.name, "pvc")
	}
	return nil
}

// writeSnapshot writes files into root/<hash of files>, once: a directory that exists already
// holds the same content. It is written beside and renamed into place, so a launch never
// packs half of it.
func writeSnapshot(root string, files map[string][]byte) (string, error) {
	h := sha256.New()
	keys := slices.Sorted(maps.Keys(files))
	for _, k := range keys {
		fmt.Fprintf(h, "%d:%s%d:", len(k), k, len(files[k]))
		h.Write(files[k])
	}
	dir := filepath.Join(root, hex.EncodeToString(h.Sum(nil))[:32])
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(root, tmpSnapshotPrefix)
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for _, k := range keys {
		// ConfigMap and Secret keys are [-._a-zA-Z0-9]+ and never . or ..: always a name
		// inside tmp.
		if !filepath.IsLocal(k) || strings.ContainsRune(k, filepath.Separator) {
			return "", fmt.Errorf("key %q is not a file name", k)
		}
		if err := os.WriteFile(filepath.Join(tmp, k), files[k], 0o644); err != nil {
			return "", err
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, statErr := os.Stat(dir); statErr == nil {
			return dir, nil // written meanwhile, with the same content
		}
		return "", err
	}
	return dir, nil
}

// tmpSnapshotPrefix starts the name of a snapshot being written.
const tmpSnapshotPrefix = ".tmp-"

// snapshotsNamed adds to inUse the snapshot directories (names under root) that t names.
func snapshotsNamed(root string, t *configs.Task, inUse map[string]bool) {
	add := func(p string) {
		if rel, err := filepath.Rel(root, p); err == nil && filepath.IsLocal(rel) {
			inUse[strings.SplitN(filepath.ToSlash(rel), "/", 2)[0]] = true
		}
	}
	if t.GitWorkdir == nil && t.Workdir != "" {
		add(t.Workdir)
	}
	for _, src := range t.FileMounts {
		add(src)
	}
}

// pruneSnapshots removes the snapshot directories under root that are not in inUse, and says
// how many it removed. A snapshot being written (.tmp-) is left to its writer.
func pruneSnapshots(root string, inUse map[string]bool) (int, error) {
	entries, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var errs []error
	removed := 0
	for _, e := range entries {
		if inUse[e.Name()] || strings.HasPrefix(e.Name(), tmpSnapshotPrefix) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}
