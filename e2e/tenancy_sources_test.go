package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher/buckets/fakes3"
)

// A FerryService's files from the tenant's own side: Secrets and PersistentVolumeClaims of
// its namespace, labelled ferry.dev/files=true by their owner (internal/controller/tenancy.go).

// filesLabels lets FerryServices use an object as a source.
var filesLabels = map[string]string{"ferry.dev/files": "true"}

// tenantSecretValue is a Secret's value that must reach the pod and nothing else.
const tenantSecretValue = "tenant-secret-3f9a1c"

// TestFerryServiceSecretSources: a Secret of the namespace, labelled, reaches the pods as a
// directory and as one file; the service serves with Tenancy Accepted; the value is in no
// ConfigMap Ferry keeps (its records), nor in `serve status`; once the FerryService is deleted
// the controller prunes the snapshot it wrote.
func TestFerryServiceSecretSources(t *testing.T) {
	e, ns, dyn := newFerryServiceEnv(t, "e2e-tenancy-secret-")
	c := testcluster.Shared(t)
	ctx := context.Background()
	if _, err := c.Client().CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds", Labels: filesLabels},
		Data: map[string][]byte{"token": []byte(tenantSecretValue), "user": []byte("tenant")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	spec := fmt.Sprintf(fsvcSpec, 1) + "  file_mounts:\n    /etc/creds: secret://creds\n    /etc/token: secret://creds/token\n"
	files := serveAcceptedTenant(t, ctx, c, e, dyn, ns, spec)
	for _, name := range []string{"mounts/0/token", "mounts/0/user", "mounts/1/token"} {
		var found bool
		for got, data := range files {
			found = found || strings.HasSuffix(got, name) && (data == tenantSecretValue || data == "tenant")
		}
		if !found {
			t.Errorf("the pod's files lack %s; they hold %v", name, keys(files))
		}
	}
	// No ConfigMap at all holds it: the pod's files object is a Secret the pod owns.
	cms, err := c.Client().CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range cms.Items {
		for k, v := range cm.Data {
			if strings.Contains(v, tenantSecretValue) {
				t.Errorf("ConfigMap %s key %s holds the Secret's value", cm.Name, k)
			}
		}
		for k, v := range cm.BinaryData {
			if strings.Contains(string(v), tenantSecretValue) {
				t.Errorf("ConfigMap %s key %s holds the Secret's value", cm.Name, k)
			}
		}
	}
	if out := e.mustRun("serve", "status", "tenant", "--json"); strings.Contains(out, tenantSecretValue) {
		t.Errorf("serve status shows the Secret's value:\n%s", out)
	}

	snapshots := filepath.Join(e.home, "ferryservice-files", ns)
	if entries, err := os.ReadDir(snapshots); err != nil || len(entries) == 0 {
		t.Fatalf("the controller's snapshots of the Secret: %v, %v", entries, err)
	}
	if err := dyn.Resource(fsvcGVR).Namespace(ns).Delete(ctx, "tenant", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the snapshots of the deleted FerryService's Secret are pruned", func() (bool, string) {
		entries, err := os.ReadDir(snapshots)
		if err != nil {
			return false, err.Error()
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return len(names) == 0, fmt.Sprint(names)
	})
}

// TestFerryServiceClaimSources: a labelled PersistentVolumeClaim of the namespace is mounted
// read-only into the pod at the mount's path (a path in the claim too), nothing of it is
// copied into the pod's files, and the service serves. (The stand-in runs a service's pod as
// replica-sim, not its command, so what the program reads there is a job pod's to show.)
func TestFerryServiceClaimSources(t *testing.T) {
	e, ns, dyn := newFerryServiceEnv(t, "e2e-tenancy-pvc-")
	c := testcluster.Shared(t)
	ctx := context.Background()
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "models", Labels: filesLabels},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if _, err := c.Client().CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	spec := fmt.Sprintf(fsvcSpec, 1) + "  file_mounts:\n    /models: pvc://models/sim\n    /all: pvc://models\n"
	if err := applyFerryService(ctx, dyn, ns, "tenant", spec); err != nil {
		t.Fatal(err)
	}
	waitFerryService(t, ctx, c, ns, "tenant", "READY", "1/1")
	pods, err := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "ferry.service=tenant"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the service's pods: %d, %v", len(pods.Items), err)
	}
	pod := pods.Items[0]
	var volume string
	for _, v := range pod.Spec.Volumes {
		if pvc := v.PersistentVolumeClaim; pvc != nil && pvc.ClaimName == "models" {
			if !pvc.ReadOnly {
				t.Errorf("volume %s mounts the claim writable", v.Name)
			}
			volume = v.Name
		}
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		if m.Name == volume {
			mounts[m.MountPath] = m
		}
	}
	if m, ok := mounts["/models"]; !ok || m.SubPath != "sim" || !m.ReadOnly {
		t.Errorf("mount /models: %+v (found %v); want the claim's sim, read-only", m, ok)
	}
	if m, ok := mounts["/all"]; !ok || m.SubPath != "" || !m.ReadOnly {
		t.Errorf("mount /all: %+v (found %v); want the whole claim, read-only", m, ok)
	}
	for _, v := range pod.Spec.Volumes {
		if v.ConfigMap != nil || v.Secret != nil {
			t.Errorf("the pod copies files (volume %s), though its one source is a claim", v.Name)
		}
	}
	st, err := e.status("tenant")
	if err != nil {
		t.Fatal(err)
	}
	chatPlain(t, st.Endpoint)
}

// TestFerryServiceSourcesRefusedInStatus: a Secret or a claim whose owner did not label it,
// or that does not exist, is refused in the object's status with a Tenancy condition False
// and what to do, and nothing is launched.
func TestFerryServiceSourcesRefusedInStatus(t *testing.T) {
	_, ns, dyn := newFerryServiceEnv(t, "e2e-tenancy-src-refused-")
	c := testcluster.Shared(t)
	ctx := context.Background()
	if _, err := c.Client().CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "unlabelled"},
		Data: map[string][]byte{"k": []byte("v")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client().CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "unlabelled"},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf(fsvcSpec, 1)
	cases := []struct{ name, spec, reason, want string }{
		{name: "unlabelled-secret", spec: base + "  file_mounts:\n    /etc/k: secret://unlabelled/k\n", reason: "Refused",
			want: "Secret unlabelled is not labelled ferry.dev/files=true, by which its owner lets FerryServices read it: label it (kubectl label secret unlabelled ferry.dev/files=true)"},
		{name: "missing-secret", spec: base + "  workdir: secret://nowhere\n", reason: "SourceUnavailable",
			want: "no Secret nowhere in the FerryService's namespace: create it (labelled ferry.dev/files=true)"},
		{name: "unlabelled-claim", spec: base + "  file_mounts:\n    /data: pvc://unlabelled\n", reason: "Refused",
			want: "PersistentVolumeClaim unlabelled is not labelled ferry.dev/files=true, by which its owner lets FerryServices read it: label it (kubectl label pvc unlabelled ferry.dev/files=true)"},
		{name: "missing-claim", spec: base + "  file_mounts:\n    /data: pvc://nowhere/sub\n", reason: "SourceUnavailable",
			want: "file_mounts./data: pvc://nowhere/sub: source not found: no PersistentVolumeClaim nowhere in the FerryService's namespace: create it (labelled ferry.dev/files=true)"},
	}
	for _, tc := range cases {
		if err := applyFerryService(ctx, dyn, ns, tc.name, tc.spec); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
	}
	for _, tc := range cases {
		eventually(t, 30*time.Second, tc.name+"'s status says INVALID with a Tenancy condition False and why", func() (bool, string) {
			u, err := dyn.Resource(fsvcGVR).Namespace(ns).Get(ctx, tc.name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			st, _, _ := unstructured.NestedString(u.Object, "status", "status")
			cond := condition(u, "Tenancy")
			return st == "INVALID" && cond["status"] == "False" && cond["reason"] == tc.reason && strings.Contains(fmt.Sprint(cond["message"]), tc.want), fmt.Sprintf("%s %v", st, cond)
		})
	}
	if pods, err := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err != nil || len(pods.Items) != 0 {
		t.Errorf("pods made for refused FerryServices: %d, %v", len(pods.Items), err)
	}
}

// tenantBucketKey is the tenant's AWS secret access key: it must reach the controller's memory
// and nothing else.
const tenantBucketKey = "tenant-bucket-key-7c41e9"

// TestFerryServiceBucketSources: an s3:// source of a FerryService is listed and presigned
// with the credentials of the Secret its spec names in bucketCredentials, never with the
// controller's (which can read the same fake S3 with a key of its own): the pod's files
// Secret holds URLs signed with the tenant's access key id, which fetch the bucket's objects
// (the stand-in runs no init container for a service's pod, so the test fetches them as it
// would); the service serves; and the tenant's secret key is in no ConfigMap, not in `serve
// status --json` (which names the Secret), nor in the controller's log.
func TestFerryServiceBucketSources(t *testing.T) {
	s3 := fakes3.New()
	t.Cleanup(s3.Close)
	s3.Put("tenant-data", "models/config.json", []byte("tenant-config"))
	s3.Put("tenant-data", "models/shards/0.bin", []byte("tenant-shard"))
	e, ns, dyn := newFerryServiceEnv(t, "e2e-tenancy-s3-", append(append([]string{}, awsEnv...), "AWS_ENDPOINT_URL_S3="+s3.URL())...)
	c := testcluster.Shared(t)
	ctx := context.Background()
	if _, err := c.Client().CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bucket-creds", Labels: filesLabels},
		StringData: map[string]string{"AWS_ACCESS_KEY_ID": "AKIDTENANTE2E", "AWS_SECRET_ACCESS_KEY": tenantBucketKey}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	spec := fmt.Sprintf(fsvcSpec, 1) + "  bucketCredentials: bucket-creds\n  file_mounts:\n    /models: s3://tenant-data/models\n"
	if err := applyFerryService(ctx, dyn, ns, "tenant", spec); err != nil {
		t.Fatal(err)
	}
	waitFerryService(t, ctx, c, ns, "tenant", "READY", "1/1")
	st, err := e.status("tenant")
	if err != nil {
		t.Fatal(err)
	}
	chatPlain(t, st.Endpoint)

	pods, err := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "ferry.service=tenant"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the service's pods: %d, %v", len(pods.Items), err)
	}
	files, err := c.Client().CoreV1().Secrets(ns).Get(ctx, pods.Items[0].Name+"-files", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fetch := string(files.Data["fetch.sh"])
	urls := regexp.MustCompile(`ferry_get '([^']+)'`).FindAllStringSubmatch(fetch, -1)
	if len(urls) != 2 || strings.Count(fetch, "X-Amz-Credential=AKIDTENANTE2E%2F") != 2 || strings.Contains(fetch, "AKIAFERRYE2E") {
		t.Fatalf("fetch.sh is not two URLs signed with the tenant's key alone:\n%s", fetch)
	}
	var got []string
	for _, u := range urls {
		resp, err := http.Get(u[1])
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got = append(got, fmt.Sprintf("%d %s", resp.StatusCode, body))
	}
	slices.Sort(got)
	if want := []string{"200 tenant-config", "200 tenant-shard"}; !slices.Equal(got, want) {
		t.Errorf("the presigned URLs fetch %v, want %v", got, want)
	}

	out := e.mustRun("serve", "status", "tenant", "--json")
	if strings.Contains(out, tenantBucketKey) || !strings.Contains(out, "s3+secret://"+ns+"/bucket-creds/tenant-data/models") {
		t.Errorf("serve status shows the key, or not the Secret's name:\n%s", out)
	}
	cms, err := c.Client().CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range cms.Items {
		for k, v := range cm.Data {
			if strings.Contains(v, tenantBucketKey) {
				t.Errorf("ConfigMap %s key %s holds the tenant's secret key", cm.Name, k)
			}
		}
		for k, v := range cm.BinaryData {
			if strings.Contains(string(v), tenantBucketKey) {
				t.Errorf("ConfigMap %s key %s holds the tenant's secret key", cm.Name, k)
			}
		}
	}
	if log, err := os.ReadFile(filepath.Join(e.home, "controller.log")); err != nil || strings.Contains(string(log), tenantBucketKey) {
		t.Errorf("the controller's log: %v, or it holds the tenant's secret key", err)
	}
}

// TestFerryServiceBucketSourcesRefused: an s3:// source whose credentials Secret is not
// labelled, or does not exist, is refused in status with what to do; one on a FerryService
// that may run on a cloud (whose VMs would fetch with the controller's credentials), or with
// no bucketCredentials, is refused as breaking the tenancy rules; nothing is launched.
func TestFerryServiceBucketSourcesRefused(t *testing.T) {
	_, ns, dyn := newFerryServiceEnv(t, "e2e-tenancy-s3-refused-")
	c := testcluster.Shared(t)
	ctx := context.Background()
	if _, err := c.Client().CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "unlabelled"},
		StringData: map[string]string{"AWS_ACCESS_KEY_ID": "AKIDTENANTE2E", "AWS_SECRET_ACCESS_KEY": tenantBucketKey}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf(fsvcSpec, 1)
	mount := "  file_mounts:\n    /models: s3://tenant-data/models\n"
	cases := []struct{ name, spec, reason, want string }{
		{name: "unlabelled-creds", spec: base + "  bucketCredentials: unlabelled\n" + mount, reason: "Refused",
			want: "Secret unlabelled is not labelled ferry.dev/files=true, by which its owner lets FerryServices read it: label it (kubectl label secret unlabelled ferry.dev/files=true)"},
		{name: "missing-creds", spec: base + "  bucketCredentials: nowhere\n" + mount, reason: "SourceUnavailable",
			want: "bucketCredentials: nowhere: source not found: no Secret nowhere in the FerryService's namespace: create it (labelled ferry.dev/files=true)"},
		{name: "creds-on-a-cloud", spec: strings.Replace(base, "    infra: kubernetes\n    accelerators: A10G:1\n", "    ordered:\n      - infra: kubernetes\n      - infra: aws\n", 1) + "  bucketCredentials: unlabelled\n" + mount, reason: "Refused",
			want: "file_mounts./models: s3://tenant-data/models is fetched with your credentials (bucketCredentials) by pods only, and this FerryService may run on aws, whose VMs would fetch it with the controller's"},
		{name: "no-creds", spec: base + mount, reason: "Refused",
			want: "file_mounts./models: s3://tenant-data/models would be listed and presigned with the controller's bucket credentials, not yours"},
	}
	for _, tc := range cases {
		if err := applyFerryService(ctx, dyn, ns, tc.name, tc.spec); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
	}
	for _, tc := range cases {
		eventually(t, 30*time.Second, tc.name+"'s status says INVALID with a Tenancy condition False and why", func() (bool, string) {
			u, err := dyn.Resource(fsvcGVR).Namespace(ns).Get(ctx, tc.name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			st, _, _ := unstructured.NestedString(u.Object, "status", "status")
			cond := condition(u, "Tenancy")
			return st == "INVALID" && cond["status"] == "False" && cond["reason"] == tc.reason && strings.Contains(fmt.Sprint(cond["message"]), tc.want), fmt.Sprintf("%s %v", st, cond)
		})
	}
	if pods, err := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err != nil || len(pods.Items) != 0 {
		t.Errorf("pods made for refused FerryServices: %d, %v", len(pods.Items), err)
	}
}
