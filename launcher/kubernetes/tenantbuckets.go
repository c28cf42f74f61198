package kubernetes

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// A FerryService's s3:// sources are read with the tenant's credentials, never the
// controller's: the tenant names a Secret of its namespace (spec.bucketCredentials), the
// controller's FerryService reconcile reads it and registers a bucket client made from it here,
// in memory only, and stores the source as s3+secret://NAMESPACE/SECRET/BUCKET[/PREFIX] (the
// Secret's name, never its values). At launch the provider lists and presigns such a source
// with the registered client; one whose client is not registered (a controller that restarted
// and has not reconciled the FerryService yet) fails the launch with an error naming the
// Secret, which a later launch retries. Only this provider knows the scheme: every other
// infra refuses it as an unknown one (nodefiles.ParseBucketURL), so no path falls back to the
// controller's credentials.

// TenantS3Scheme prefixes an s3:// source read with the credentials of a tenant's Secret.
const TenantS3Scheme = "s3+secret://"

// TenantS3Source is the stored form of bucket (an s3:// URL) read with the credentials of
// Secret name of namespace.
func TenantS3Source(namespace, name, bucket string) string {
	return TenantS3Scheme + namespace + "/" + name + "/" + strings.TrimPrefix(bucket, "s3://")
}

// ParseTenantS3Source splits a TenantS3Source: ref is NAMESPACE/SECRET, bucket the s3:// URL;
// ok is false when src is not one.
func ParseTenantS3Source(src string) (ref, bucket string, ok bool, err error) {
	rest, ok := strings.CutPrefix(src, TenantS3Scheme)
	if !ok {
		return "", "", false, nil
	}
	parts := strings.SplitN(rest, "/", 3)
	if len(parts) != 3 || len(validation.IsDNS1123Label(parts[0])) > 0 || len(validation.IsDNS1123Subdomain(parts[1])) > 0 || parts[2] == "" {
		return "", "", true, fmt.Errorf("%w: %s: not %sNAMESPACE/SECRET/BUCKET[/PREFIX]", nodefiles.ErrFiles, src, TenantS3Scheme)
	}
	return parts[0] + "/" + parts[1], "s3://" + parts[2], true, nil
}

// TenantBuckets holds the bucket clients made from tenants' Secrets, by NAMESPACE/SECRET.
// Safe for concurrent use.
type TenantBuckets struct {
	mu      sync.Mutex
	clients map[string]tenantClient
}

// tenantClient is one Secret's client and the version of the Secret's values it was made from.
type tenantClient struct {
	version string
	buckets nodefiles.Buckets
}

// NewTenantBuckets returns an empty registry.
func NewTenantBuckets() *TenantBuckets { return &TenantBuckets{clients: map[string]tenantClient{}} }

// Set registers the client of ref (NAMESPACE/SECRET) for the Secret's values of version (a
// digest of them): newClient is called only when ref has none of that version, so a client and
// what it learnt (bucket regions) outlive reconciles of an unchanged Secret. A nil newClient
// forgets ref's client: its Secret is gone, or its owner took the label off.
func (r *TenantBuckets) Set(ref, version string, newClient func() nodefiles.Buckets) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if newClient == nil {
		delete(r.clients, ref)
		return
	}
	if c, ok := r.clients[ref]; ok && c.version == version {
		return
	}
	r.clients[ref] = tenantClient{version: version, buckets: newClient()}
}

// Get is ref's client; false when none is registered.
func (r *TenantBuckets) Get(ref string) (nodefiles.Buckets, bool) {
	if r == nil {
		return nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.clients[ref]
	return c.buckets, ok
}

// TenantBuckets is the registry this provider presigns tenants' s3:// sources with.
func (p *Provider) TenantBuckets() *TenantBuckets { return p.opts.TenantBuckets }

// splitTenantBuckets rewrites spec's (a copy's) tenant s3 sources to their s3:// URLs and
// returns the Secret each needs, by remote path. Such a source is copied, never mounted: a
// mount would read the bucket with the node's or the namespace's credentials, not the
// tenant's Secret.
func splitTenantBuckets(spec launcher.Spec) (launcher.Spec, map[string]string, error) {
	var refs map[string]string
	var mounts map[string]string
	for _, dst := range slices.Sorted(maps.Keys(spec.FileMounts)) {
		ref, bucket, ok, err := ParseTenantS3Source(spec.FileMounts[dst])
		switch {
		case !ok:
			continue
		case err != nil:
			return spec, nil, fmt.Errorf("file_mounts.%s: %w", dst, err)
		case spec.MountModes[dst] != "" && spec.MountModes[dst] != configs.ModeCopy:
			return spec, nil, fmt.Errorf("%w: file_mounts.%s: %s is read with the credentials of Secret %s, which only a copy uses: write mode: COPY", nodefiles.ErrFiles, dst, bucket, ref)
		}
		if refs == nil {
			refs, mounts = map[string]string{}, maps.Clone(spec.FileMounts)
		}
		refs[dst] = ref
		mounts[dst] = bucket
	}
	if refs != nil {
		spec.FileMounts = mounts
	}
	return spec, refs, nil
}

// bucketsFor is the client that lists and presigns mount m: the tenant's registered client when
// refs names a Secret for it, else the provider's own.
func (p *Provider) bucketsFor(m nodefiles.FileMount, refs map[string]string) (nodefiles.Buckets, error) {
	ref, ok := refs[m.Dst]
	if !ok {
		if p.opts.Buckets == nil {
			return nil, fmt.Errorf("%w: file_mounts.%s: no bucket client configured", nodefiles.ErrFiles, m.Dst)
		}
		return p.opts.Buckets, nil
	}
	b, ok := p.opts.TenantBuckets.Get(ref)
	if !ok {
		// Not ErrFiles: the task is right, the controller has not read the Secret (yet).
		return nil, fmt.Errorf("file_mounts.%s: %s: the credentials of Secret %s are not loaded (yet): the controller reads them when it reconciles the FerryService, and the launch is retried; the controller's own credentials are never used for it", m.Dst, m.Src, ref)
	}
	return b, nil
}
