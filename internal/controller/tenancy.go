package controller

import (
	"cmp"
	"fmt"
	"maps"
	"path"
	"path/filepath"
	"slices"
	"strings"

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
//     are objects of the FerryService's namespace whose owner lets FerryServices use them by
//     labelling them ferry.dev/files=true: a ConfigMap or a Secret, configmap://NAME or
//     secret://NAME (every key a file of the directory) or configmap://NAME/KEY,
//     secret://NAME/KEY (one file), snapshotted by the controller (tenancysources.go); a
//     PersistentVolumeClaim, pvc://CLAIM[/SUBPATH] (file_mounts only, infra kubernetes only),
//     mounted read-only into the pods as a volume; or a git workdir, cloned inside the pod.
//   - A bucket source (s3:// only) is read with the tenant's credentials, never the
//     controller's (which would let a tenant read any bucket the controller can): the spec
//     names a Secret of its namespace, labelled ferry.dev/files=true, in bucketCredentials
//     (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optionally AWS_SESSION_TOKEN and AWS_REGION;
//     never the endpoint, which is the operator's), and every candidate is infra kubernetes:
//     a pod fetches the objects
//     by URLs presigned with the tenant's credentials (tenancysources.go,
//     launcher/kubernetes/tenantbuckets.go), where a VM would fetch them with the controller's
//     instance credentials. Copied only (no mode MOUNT). gs:// is refused: a pod has no
//     Google credentials.
//   - Every candidate names its infra, kubernetes or a cloud: infra local (or none, or *,
//     which may mean local) runs the replicas' commands on the controller's own host.
//   - No service.tls (files on the controller's host) and no config.kubernetes pod_config or
//     custom_metadata (a partial pod can mount host paths, run privileged or take another
//     service account): only a task the operator gives through the CLI or API may set those.

// FilesLabel is the label, with value "true", by which the owner of a ConfigMap, Secret or
// PersistentVolumeClaim lets FerryServices of its namespace use it as a workdir or file_mounts
// source. Ferry's own objects never carry it, so a tenant cannot have Ferry copy the
// controller's state (its records, its sealed secrets, its home's claim) into a pod.
const FilesLabel = "ferry.dev/files"

// The schemes of a FerryService's sources.
const (
	configMapScheme = "configmap://"
	secretScheme    = "secret://"
	claimScheme     = "pvc://"
	// sourceSpellings lists them for messages.
	sourceSpellings = "configmap://NAME[/KEY], secret://NAME[/KEY], pvc://CLAIM[/SUBPATH] or s3://BUCKET[/PREFIX] (with bucketCredentials)"
)

// TenancyError is a FerryService asking for what a tenant may not have Ferry do; Problems
// name each field, what it asks, and what to write instead.
type TenancyError struct{ Problems []string }

func (e *TenancyError) Error() string {
	return "refused for a FerryService (a tenant's spec may not reach the controller's host, files or credentials): " + strings.Join(e.Problems, "; ")
}

// Unwrap makes a TenancyError an api.ErrInvalid.
func (e *TenancyError) Unwrap() error { return api.ErrInvalid }

// checkTenancy says what in t a FerryService may not ask for, every problem at once; nil when
// nothing. creds is the spec's bucketCredentials ("" when none). It reads no state: the webhook
// runs it as it is.
func checkTenancy(t *configs.Task, creds string) error {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	notKube := checkInfras(t, add)
	if t.Service.Disaggregated() && t.Service.Pools.Prefill.Resources != nil {
		// The prefill pool's resources of its own are held to the same rules.
		checkInfras(t.PoolTask(configs.PoolPrefill), func(format string, args ...any) {
			add("service.pools.prefill."+format, args...)
		})
	}
	if t.GitWorkdir == nil && t.Workdir != "" {
		checkWorkdirSource(t.Workdir, add)
	}
	if msgs := validation.IsDNS1123Subdomain(creds); creds != "" && len(msgs) > 0 {
		add("%s: %q is not a Secret name (%s)", bucketCredentialsField, creds, strings.Join(msgs, "; "))
	}
	for _, dst := range slices.Sorted(maps.Keys(t.FileMounts)) {
		if src := t.FileMounts[dst]; strings.HasPrefix(src, "s3://") {
			checkBucketSource(dst, src, t.MountModes[dst], creds, notKube, add)
			continue
		}
		checkMountSource(dst, t.FileMounts[dst], notKube, add)
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

// checkInfras refuses the candidates that may run on the controller's host, and returns the
// first candidate's infra that is not Kubernetes ("" when every one is), which claims need.
func checkInfras(t *configs.Task, add func(string, ...any)) (notKube string) {
	cands := t.Resources.Candidates()
	for i, c := range cands {
		field := "resources.infra"
		if len(cands) > 1 {
			field = fmt.Sprintf("resources alternative %d: infra", i+1)
		}
		cloud, _, _ := strings.Cut(c.Infra, "/")
		switch cloud {
		case configs.InfraLocal:
			add("%s: local runs the replicas' commands on the controller's own host (in its pod, with its credentials): use infra: kubernetes (or a cloud)", field)
		case "", "*":
			add("%s: required, naming kubernetes or a cloud: without it Ferry may place replicas on the controller's own host (local)", field)
		}
		if cloud != kubernetesInfra && notKube == "" {
			notKube = cmp.Or(c.Infra, "any infra")
		}
	}
	return notKube
}

// kubernetesInfra is the infra whose pods can mount a claim.
const kubernetesInfra = "kubernetes"

// checkWorkdirSource says what is wrong with a workdir source (a directory).
func checkWorkdirSource(src string, add func(string, ...any)) {
	obj, err := parseObjectSource(src)
	switch {
	case err != nil:
		add("workdir: %v", err)
	case obj != nil && obj.key != "":
		add("workdir: %s names one key, and a workdir is a directory: write %s%s", src, obj.scheme(), obj.name)
	case obj != nil:
	case strings.HasPrefix(src, claimScheme):
		add("workdir: %s: a workdir is copied into the pod, a claim is mounted: mount it with file_mounts (/code: %s) and start run with cd /code", src, src)
	default:
		add("workdir: %s is a path on the controller's filesystem: put the files in a ConfigMap (or a Secret) of this namespace labelled %s=true and write workdir: configmap://NAME (or secret://NAME)", src, FilesLabel)
	}
}

// checkMountSource says what is wrong with file_mounts' source for dst; notKube is an infra
// of the task that is not Kubernetes ("" when none).
func checkMountSource(dst, src, notKube string, add func(string, ...any)) {
	obj, err := parseObjectSource(src)
	if err != nil {
		add("file_mounts.%s: %v", dst, err)
		return
	}
	if obj != nil {
		return
	}
	claim, err := parseClaimSource(src)
	switch {
	case err != nil:
		add("file_mounts.%s: %v", dst, err)
	case claim != nil && notKube != "":
		add("file_mounts.%s: %s is a PersistentVolumeClaim, which only pods of infra kubernetes mount, and this FerryService may run on %s: name infra: kubernetes in every alternative, or use a configmap:// or secret:// source", dst, src, notKube)
	case claim != nil && !strings.HasPrefix(dst, "/"):
		add("file_mounts.%s: a claim is mounted at an absolute path: write /%s (or another absolute path)", dst, strings.TrimPrefix(strings.TrimPrefix(dst, "~"), "/"))
	case claim != nil:
	case strings.HasPrefix(src, "gs://"):
		add("file_mounts.%s: %s: a pod has no Google credentials to fetch it with, and Ferry would list it with the controller's: copy the data to s3:// and name your credentials in %s, or put it in a PersistentVolumeClaim of this namespace (pvc://CLAIM)", dst, src, bucketCredentialsField)
	case strings.Contains(src, "://"):
		add("file_mounts.%s: %s: a FerryService's sources are %s", dst, src, sourceSpellings)
	default:
		add("file_mounts.%s: %s is a path on the controller's filesystem: put the file in a ConfigMap (or a Secret) of this namespace labelled %s=true and write configmap://NAME/KEY (or secret://NAME/KEY)", dst, src, FilesLabel)
	}
}

// bucketCredentialsField is the spec field naming the Secret of the tenant's bucket
// credentials.
const bucketCredentialsField = "bucketCredentials"

// checkBucketSource says what is wrong with an s3:// source of file_mounts for dst, copied or
// mounted as mode says; creds is the spec's bucketCredentials, notKube an infra of the task
// that is not Kubernetes ("" when none).
func checkBucketSource(dst, src string, mode configs.MountMode, creds, notKube string, add func(string, ...any)) {
	switch {
	case creds == "":
		add("file_mounts.%s: %s would be listed and presigned with the controller's bucket credentials, not yours: name a Secret of this namespace holding yours (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY; labelled %s=true) in spec.%s, or put the data in a PersistentVolumeClaim of this namespace (pvc://CLAIM), or small files in a ConfigMap or Secret (configmap://NAME, secret://NAME)", dst, src, FilesLabel, bucketCredentialsField)
	case notKube != "":
		add("file_mounts.%s: %s is fetched with your credentials (%s) by pods only, and this FerryService may run on %s, whose VMs would fetch it with the controller's: name infra: kubernetes in every alternative", dst, src, bucketCredentialsField, notKube)
	case mode != "" && mode != configs.ModeCopy:
		add("file_mounts.%s: %s is copied into the pods with your credentials (%s), and mode %s would mount it with the node's: write mode: COPY (or the source alone)", dst, src, bucketCredentialsField, mode)
	}
}

// objectSource is a configmap://NAME[/KEY] or secret://NAME[/KEY] source.
type objectSource struct {
	// kind is "ConfigMap" or "Secret".
	kind, name, key string
}

// scheme is the source's scheme, as written.
func (o objectSource) scheme() string {
	if o.kind == kindSecret {
		return secretScheme
	}
	return configMapScheme
}

// The kinds of object sources.
const (
	kindConfigMap = "ConfigMap"
	kindSecret    = "Secret"
)

// parseObjectSource reads src as a ConfigMap or Secret source: nil and no error when src is
// neither.
func parseObjectSource(src string) (*objectSource, error) {
	kind := kindConfigMap
	rest, ok := strings.CutPrefix(src, configMapScheme)
	if !ok {
		if rest, ok = strings.CutPrefix(src, secretScheme); !ok {
			return nil, nil
		}
		kind = kindSecret
	}
	name, key, hasKey := strings.Cut(rest, "/")
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return nil, fmt.Errorf("%s: %q is not a %s name (%s)", src, name, kind, strings.Join(msgs, "; "))
	}
	if hasKey {
		if msgs := validation.IsConfigMapKey(key); len(msgs) > 0 {
			return nil, fmt.Errorf("%s: %q is not a %s key (%s)", src, key, kind, strings.Join(msgs, "; "))
		}
	}
	return &objectSource{kind: kind, name: name, key: key}, nil
}

// claimSource is a pvc://CLAIM[/SUBPATH] source.
type claimSource struct{ name, subPath string }

// parseClaimSource reads src as a claim source: nil and no error when src is not one.
func parseClaimSource(src string) (*claimSource, error) {
	rest, ok := strings.CutPrefix(src, claimScheme)
	if !ok {
		return nil, nil
	}
	name, sub, _ := strings.Cut(rest, "/")
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return nil, fmt.Errorf("%s: %q is not a PersistentVolumeClaim name (%s)", src, name, strings.Join(msgs, "; "))
	}
	sub = strings.TrimSuffix(sub, "/")
	if sub != "" && (!filepath.IsLocal(sub) || path.Clean(sub) != sub) {
		return nil, fmt.Errorf("%s: the path in the claim, %q, must be a clean relative path that stays inside it", src, sub)
	}
	return &claimSource{name: name, subPath: sub}, nil
}
