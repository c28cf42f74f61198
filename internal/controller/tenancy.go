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
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
)

// The tenancy of FerryServices. Whoever may create a FerryService in the controller's namespace
// is a tenant, not the operator: Ferry must not do for them what their own Kubernetes rights do
// not allow. A task file submitted through the CLI runs as the operator (its local paths are
// the operator's files); a FerryService does not, so its spec is held to these rules, by the
// admission webhook at apply time and again before anything launches:
//
//   - workdir and file_mounts never name a path: the controller would pack its own files (its
//     service-account token, its API token, proxy.token) into the tenant's pods. Their sources
//     are ConfigMaps of the FerryService's namespace, configmap://NAME (every key a file of
//     the directory) or configmap://NAME/KEY (one file), which their owner lets FerryServices
//     read by labelling them ferry.dev/files=true; or a git workdir, cloned inside the pod.
//   - No bucket sources (s3://, gs://): Ferry would list and presign them with the
//     controller's own credentials, so a tenant could read any bucket the controller can.
//   - Every candidate names its infra, kubernetes or a cloud: infra local (or none, or *,
//     which may mean local) runs the replicas' commands on the controller's own host.
//   - No service.tls (files on the controller's host) and no config.kubernetes pod_config or
//     custom_metadata (a partial pod can mount host paths, run privileged or take another
//     service account): only a task the operator gives through the CLI or API may set those.

// FilesLabel is the label, with value "true", by which a ConfigMap's owner lets FerryServices
// of its namespace use it as a workdir or file_mounts source. Ferry's own ConfigMaps never
// carry it, so a tenant cannot have Ferry copy the controller's state into a pod.
const FilesLabel = "ferry.dev/files"

// configMapScheme prefixes a ConfigMap source: configmap://NAME or configmap://NAME/KEY.
const configMapScheme = "configmap://"

// TenancyError is a FerryService asking for what a tenant may not have Ferry do; Problems
// name each field, what it asks, and what to write instead.
type TenancyError struct{ Problems []string }

func (e *TenancyError) Error() string {
	return "refused for a FerryService (a tenant's spec may not reach the controller's host, files or credentials): " + strings.Join(e.Problems, "; ")
}

// Unwrap makes a TenancyError an api.ErrInvalid.
func (e *TenancyError) Unwrap() error { return api.ErrInvalid }

// checkTenancy says what in t a FerryService may not ask for, every problem at once; nil when
// nothing. It reads no state: the webhook runs it as it is.
func checkTenancy(t *configs.Task) error {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	cands := t.Resources.Candidates()
	for i, c := range cands {
		field := "resources.infra"
		if len(cands) > 1 {
			field = fmt.Sprintf("resources alternative %d: infra", i+1)
		}
		switch cloud, _, _ := strings.Cut(c.Infra, "/"); cloud {
		case configs.InfraLocal:
			add("%s: local runs the replicas' commands on the controller's own host (in its pod, with its credentials): use infra: kubernetes (or a cloud)", field)
		case "", "*":
			add("%s: required, naming kubernetes or a cloud: without it Ferry may place replicas on the controller's own host (local)", field)
		}
	}
	if t.GitWorkdir == nil && t.Workdir != "" {
		if ref, err := parseConfigMapSource(t.Workdir); err != nil {
			add("workdir: %v", err)
		} else if ref == nil {
			add("workdir: %s is a path on the controller's filesystem: put the files in a ConfigMap of this namespace labelled %s=true and write workdir: configmap://NAME", t.Workdir, FilesLabel)
		} else if ref.key != "" {
			add("workdir: %s names one key, and a workdir is a directory: write configmap://%s", t.Workdir, ref.name)
		}
	}
	for _, dst := range slices.Sorted(maps.Keys(t.FileMounts)) {
		src := t.FileMounts[dst]
		ref, err := parseConfigMapSource(src)
		switch {
		case err != nil:
			add("file_mounts.%s: %v", dst, err)
		case ref != nil:
		case strings.HasPrefix(src, "s3://"), strings.HasPrefix(src, "gs://"):
			add("file_mounts.%s: %s would be listed and presigned with the controller's bucket credentials, not yours: copy the files into a ConfigMap (configmap://NAME or configmap://NAME/KEY)", dst, src)
		case strings.Contains(src, "://"):
			add("file_mounts.%s: %s: a FerryService's sources are configmap://NAME or configmap://NAME/KEY", dst, src)
		default:
			add("file_mounts.%s: %s is a path on the controller's filesystem: put the file in a ConfigMap of this namespace labelled %s=true and write configmap://NAME/KEY", dst, src, FilesLabel)
		}
	}
	if t.Service != nil && t.Service.TLS != nil {
		add("service.tls: keyfile and certfile are files on the controller's host: terminate TLS in front of the endpoint (an Ingress or a Gateway)")
	}
	if k := t.Config; k != nil && k.Kubernetes != nil && (len(k.Kubernetes.PodConfig) > 0 || len(k.Kubernetes.CustomMetadata) > 0) {
		add("config.kubernetes: pod_config and custom_metadata can mount host paths, run privileged or take another service account; only a task given to the CLI or the API (the operator) may set them, not a FerryService")
	}
	if len(problems) == 0 {
		return nil
	}
	return &TenancyError{Problems: problems}
}

// configMapSource is a configmap://NAME[/KEY] source.
type configMapSource struct{ name, key string }

// parseConfigMapSource reads src as a ConfigMap source: nil and no error when src is not one.
func parseConfigMapSource(src string) (*configMapSource, error) {
	rest, ok := strings.CutPrefix(src, configMapScheme)
	if !ok {
		return nil, nil
	}
	name, key, hasKey := strings.Cut(rest, "/")
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return nil, fmt.Errorf("%s: %q is not a ConfigMap name (%s)", src, name, strings.Join(msgs, "; "))
	}
	if hasKey {
		if msgs := validation.IsConfigMapKey(key); len(msgs) > 0 {
			return nil, fmt.Errorf("%s: %q is not a ConfigMap key (%s)", src, key, strings.Join(msgs, "; "))
		}
	}
	return &configMapSource{name: name, key: key}, nil
}

// configMapGetter is the one call resolveSources makes of the namespace's ConfigMaps.
type configMapGetter interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.ConfigMap, error)
}

// errSourceNotFound is a ConfigMap source that does not exist (yet): the reconcile retries.
var errSourceNotFound = errors.New("source not found")

// resolveSources replaces t's ConfigMap sources (checkTenancy accepted t) by snapshots of their
// contents under root, one directory per content (named by its hash, so that the same content
// lands at the same path after a controller restart, which rewrites it from the ConfigMap),
// and says whether t had any. The launch then packs them as it packs any workdir.
func resolveSources(ctx context.Context, cms configMapGetter, root string, t *configs.Task) (bool, error) {
	var errs []error
	found := false
	resolve := func(field, src string) string {
		ref, _ := parseConfigMapSource(src)
		if ref == nil {
			return src
		}
		found = true
		path, err := snapshotConfigMap(ctx, cms, root, *ref)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %s: %w", field, src, err))
			return src
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

// snapshotConfigMap writes ref's ConfigMap (or its one key) under root and returns the path of
// the directory (or file).
func snapshotConfigMap(ctx context.Context, cms configMapGetter, root string, ref configMapSource) (string, error) {
	cm, err := cms.Get(ctx, ref.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", fmt.Errorf("%w: no ConfigMap %s in the FerryService's namespace: create it (labelled %s=true)", errSourceNotFound, ref.name, FilesLabel)
	}
	if err != nil {
		return "", fmt.Errorf("read ConfigMap %s: %w", ref.name, err)
	}
	if cm.Labels[FilesLabel] != "true" {
		return "", &TenancyError{Problems: []string{fmt.Sprintf("ConfigMap %s is not labelled %s=true, by which its owner lets FerryServices read it: label it (kubectl label configmap %s %s=true)", ref.name, FilesLabel, ref.name, FilesLabel)}}
	}
	files := map[string][]byte{}
	for k, v := range cm.Data {
		files[k] = []byte(v)
	}
	maps.Copy(files, cm.BinaryData)
	if ref.key != "" {
		v, ok := files[ref.key]
		if !ok {
			return "", fmt.Errorf("%w: ConfigMap %s has no key %s (it has %s)", errSourceNotFound, ref.name, ref.key, strings.Join(slices.Sorted(maps.Keys(files)), ", "))
		}
		files = map[string][]byte{ref.key: v}
	}
	dir, err := writeSnapshot(root, files)
	if err != nil {
		return "", err
	}
	if ref.key != "" {
		return filepath.Join(dir, ref.key), nil
	}
	return dir, nil
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
	tmp, err := os.MkdirTemp(root, ".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for _, k := range keys {
		// ConfigMap keys are [-._a-zA-Z0-9]+ and never . or ..: always a name inside tmp.
		if !filepath.IsLocal(k) || strings.ContainsRune(k, filepath.Separator) {
			return "", fmt.Errorf("ConfigMap key %q is not a file name", k)
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
