package kubernetes

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// A pod's workdir and file mounts reach it through a Secret of its own (<pod>-files, owned by
// the pod): files.tar.gz holds the local files (nodefiles.PackLocal) and fetch.sh downloads each
// s3:// object by a presigned URL made at launch (with Options.Buckets, or for a FerryService's
// s3+secret:// source with its tenant's registered client only: tenantbuckets.go). Both are the tenant's to read and no one
// else's: a workdir holds .env files, and a presigned URL is a credential for its object until
// it expires, so they travel in a Secret, which RBAC keeps apart from ConfigMaps (pods from
// before kept them in a ConfigMap of the same name: it still works, and Terminate removes it).
// An init container, in the task's own image (it needs sh, tar, and curl or wget for buckets),
// unpacks and fetches them into an emptyDir mounted at FilesDir; the task's container mounts
// each absolute mount path from it (subPath), and links ~/sky_workdir and the ~/ mounts to it
// when it starts, its run starting in the workdir. A Secret holds at most 1 MiB, so larger
// local files must go through a bucket; the error says so. gs:// is refused: a pod has no
// Google credentials that Ferry can count on.
const (
	// FilesDir is where a pod's files are unpacked (EnvFilesDir tells the program).
	FilesDir = "/ferry/files"
	// EnvFilesDir names FilesDir in the pod's environment.
	EnvFilesDir    = "FERRY_FILES_DIR"
	filesSrcDir    = "/ferry/files-src"
	filesVolume    = "ferry-files"
	filesSrcVolume = "ferry-files-src"
	filesInitName  = "ferry-files"
	filesArchive   = "files.tar.gz"
	filesFetch     = "fetch.sh"
	secretMaxBytes = 1 << 20
	// filesPackLimit leaves room in the Secret for fetch.sh.
	filesPackLimit = nodefiles.KubernetesFilesLimit
	// filesMode is the files' mode in the secret volume: a kubelet's default (0644), which
	// the init container reads as whatever user the pod runs as; the emptyDir it unpacks into
	// is what the task sees.
	filesMode = 0o644
)

// filesObjectName is the Secret holding a pod's files (and, for pods from before, the
// ConfigMap that did).
func filesObjectName(pod string) string { return pod + "-files" }

// filesInitScript is the init container's command.
const filesInitScript = `set -e
cd "$` + EnvFilesDir + `"
tar -xzf "$FERRY_FILES_SRC/` + filesArchive + `"
sh "$FERRY_FILES_SRC/` + filesFetch + `"
`

// attachFiles adds spec's files to pod: the buckets it mounts (mounts.go), and what it copies
// (volumes, init container, mounts, the links its command makes first); it returns the
// Secret to create before the pod, nil when nothing is copied.
func (p *Provider) attachFiles(ctx context.Context, pod *corev1.Pod, spec launcher.Spec) (*corev1.Secret, error) {
	spec, tenant, err := splitTenantBuckets(spec) // read with a tenant's Secret (tenantbuckets.go)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.infra, err)
	}
	files, err := nodefiles.SpecFiles(spec)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.infra, err)
	}
	copies, mounted := nodefiles.Files{Workdir: files.Workdir}, nodefiles.Files{}
	for _, m := range files.Mounts {
		if m.Mounted() {
			mounted.Mounts = append(mounted.Mounts, m)
		} else {
			copies.Mounts = append(copies.Mounts, m)
		}
	}
	if err := nodefiles.CheckMounts(ctx, mounted, p.opts.Buckets); err != nil {
		return nil, fmt.Errorf("%s: %w", p.infra, err)
	}
	if err := p.attachMounts(pod, spec, mounted); err != nil {
		return nil, err
	}
	if copies.Empty() {
		return nil, nil
	}
	return p.attachCopies(ctx, pod, copies, tenant)
}

// attachCopies adds the files pod copies at start: local files in a Secret, bucket objects
// fetched by presigned URLs (listed in the same Secret), both unpacked by an init container.
// tenant names the Secret whose credentials read each tenant's s3 source, by remote path.
func (p *Provider) attachCopies(ctx context.Context, pod *corev1.Pod, files nodefiles.Files, tenant map[string]string) (*corev1.Secret, error) {
	archive, err := nodefiles.PackLocal(files, filesPackLimit, "a Kubernetes Secret (1 MiB)")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.infra, err)
	}
	fetch, subPaths, err := p.fetchScript(ctx, files, tenant)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.infra, err)
	}
	if n := len(archive) + len(fetch); n > secretMaxBytes {
		return nil, fmt.Errorf("%w: %s: the files and %d download URLs need %d bytes, over a Secret's 1 MiB; mount fewer objects (a narrower prefix) or fewer local files", nodefiles.ErrFiles, p.infra, strings.Count(fetch, "\nferry_get "), n)
	}
	ctr := &pod.Spec.Containers[0]
	mode := int32(filesMode)
	pod.Spec.Volumes = append(pod.Spec.Volumes,
		corev1.Volume{Name: filesSrcVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: filesObjectName(pod.Name), DefaultMode: &mode}}},
		corev1.Volume{Name: filesVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	pod.Spec.InitContainers = append(pod.Spec.InitContainers, corev1.Container{
		Name: filesInitName, Image: ctr.Image, Command: []string{"/bin/sh", "-c", filesInitScript},
		Env: []corev1.EnvVar{{Name: "FERRY_FILES_SRC", Value: filesSrcDir}, {Name: EnvFilesDir, Value: FilesDir}},
		VolumeMounts: []corev1.VolumeMount{
			{Name: filesSrcVolume, MountPath: filesSrcDir, ReadOnly: true},
			{Name: filesVolume, MountPath: FilesDir},
		},
	})
	ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: filesVolume, MountPath: FilesDir})
	ctr.Env = append(ctr.Env, corev1.EnvVar{Name: EnvFilesDir, Value: FilesDir})
	var links strings.Builder
	if files.Workdir != "" {
		ctr.Env = append(ctr.Env, corev1.EnvVar{Name: nodefiles.EnvWorkdir, Value: FilesDir + "/workdir"})
		links.WriteString(`ln -sfn "$` + nodefiles.EnvWorkdir + `" "$HOME/` + nodefiles.WorkdirName + `"` + "\n")
	}
	for i, m := range files.Mounts {
		rel, inHome, _ := m.Remote() // SpecFiles checked it
		if !inHome {
			ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: filesVolume, MountPath: "/" + rel, SubPath: subPaths[i]})
			continue
		}
		target := `"$HOME"/` + nodefiles.ShellQuote(rel)
		links.WriteString(`mkdir -p "$(dirname ` + target + `)" && ln -sfn "$` + EnvFilesDir + `"/` + nodefiles.ShellQuote(subPaths[i]) + " " + target + "\n")
	}
	ctr.Command[len(ctr.Command)-1] = links.String() + ctr.Command[len(ctr.Command)-1]
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: filesObjectName(pod.Name), Labels: maps.Clone(pod.Labels)},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{filesArchive: archive, filesFetch: []byte(fetch)},
	}, nil
}

// fetchScript is fetch.sh: a download per bucket object, by presigned URL. subPaths[i] is
// where mount i lands under FilesDir. A mount tenant names is listed and presigned with the
// client of the tenant's Secret, never with the provider's own.
func (p *Provider) fetchScript(ctx context.Context, files nodefiles.Files, tenant map[string]string) (string, []string, error) {
	var b strings.Builder
	b.WriteString(`ferry_get() {
  mkdir -p "$(dirname "$2")"
  if command -v curl >/dev/null 2>&1; then curl -fsSL --retry 3 -o "$2" "$1"; else wget -q -O "$2" "$1"; fi ||
    { echo "ferry: download of $2 failed" >&2; exit 1; }
}
`)
	subPaths := make([]string, len(files.Mounts))
	for i, m := range files.Mounts {
		dir := "mounts/" + strconv.Itoa(i)
		subPaths[i] = dir
		if m.Bucket == nil {
			if info, err := os.Stat(m.Src); err == nil && !info.IsDir() {
				subPaths[i] = dir + "/" + path.Base(m.Dst)
			}
			continue
		}
		if m.Bucket.Scheme != "s3" {
			return "", nil, fmt.Errorf("%w: file_mounts.%s: %s: a pod has no Google credentials Ferry can count on; copy the data to s3:// (presigned downloads work anywhere) or use a PersistentVolumeClaim", nodefiles.ErrFiles, m.Dst, m.Src)
		}
		client, err := p.bucketsFor(m, tenant)
		if err != nil {
			return "", nil, err
		}
		objs, err := client.List(ctx, *m.Bucket)
		if err != nil {
			return "", nil, fmt.Errorf("file_mounts.%s: %w", m.Dst, err)
		}
		b.WriteString("echo " + nodefiles.ShellQuote(fmt.Sprintf("ferry: fetching %d objects of %s", len(objs), m.Src)) + "\n")
		for _, o := range objs {
			rel := m.Bucket.KeyPath(o.Key)
			if rel == "" {
				rel = path.Base(m.Dst)
				subPaths[i] = dir + "/" + rel
			} else if !filepath.IsLocal(rel) {
				return "", nil, fmt.Errorf("%w: file_mounts.%s: object %q leaves its mount", nodefiles.ErrFiles, m.Dst, o.Key)
			}
			d, err := client.DownloadURL(ctx, *m.Bucket, o.Key)
			if err != nil {
				return "", nil, fmt.Errorf("file_mounts.%s: %w", m.Dst, err)
			}
			b.WriteString("ferry_get " + nodefiles.ShellQuote(d.URL) + ` "$` + EnvFilesDir + `"/` + nodefiles.ShellQuote(dir+"/"+rel) + "\n")
		}
	}
	return b.String(), subPaths, nil
}

// createFiles creates the pod's files Secret.
func (p *Provider) createFiles(ctx context.Context, files *corev1.Secret) error {
	if _, err := p.client.CoreV1().Secrets(p.ns).Create(ctx, files, metav1.CreateOptions{}); err != nil {
		return p.classify(err, "create secret "+files.Name)
	}
	p.log.Info("created the pod's files", zap.String("secret", files.Name), zap.Int("archive_bytes", len(files.Data[filesArchive])))
	return nil
}

// ownFiles makes the pod the owner of its files Secret, so that the cluster removes it with
// the pod even if Ferry never gets to.
func (p *Provider) ownFiles(ctx context.Context, pod *corev1.Pod) {
	patch := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":%q,"uid":%q}]}}`, pod.Name, pod.UID)
	if _, err := p.client.CoreV1().Secrets(p.ns).Patch(ctx, filesObjectName(pod.Name), types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		p.log.Warn("set the pod as its files' owner", zap.String("pod", pod.Name), zap.Error(err))
	}
}

// deleteFiles removes the pod's files Secret, if it has one, and the files ConfigMap of a pod
// launched before files moved to Secrets (the pod owns it, so the cluster removes it too; this
// is for one whose owner was never set).
func (p *Provider) deleteFiles(ctx context.Context, pod string) error {
	name := filesObjectName(pod)
	err := p.client.CoreV1().Secrets(p.ns).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return p.classify(err, "delete secret "+name)
	}
	err = p.client.CoreV1().ConfigMaps(p.ns).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return p.classify(err, "delete config map "+name)
	}
	return nil
}
