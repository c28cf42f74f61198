package controller

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher/buckets/fakes3"
	"github.com/ferryserve/ferry/launcher/nodefiles"
)

// fakeSecrets serves Get from a map.
type fakeSecrets map[string]*corev1.Secret

func (f fakeSecrets) Get(_ context.Context, name string, _ metav1.GetOptions) (*corev1.Secret, error) {
	if s, ok := f[name]; ok {
		return s, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
}

// TestResolveTenantBucket: an s3:// source of a FerryService with bucketCredentials is stored
// as s3+secret://NAMESPACE/SECRET/..., the bucket is checked with the tenant's client, and that
// client is registered under NAMESPACE/SECRET (the same one across reconciles of an unchanged
// Secret); a missing, unlabelled or incomplete Secret, or a missing bucket, is refused with what
// to do, and an unlabelled or deleted Secret's client is forgotten. No error says the values.
func TestResolveTenantBucket(t *testing.T) {
	s3 := fakes3.New()
	t.Cleanup(s3.Close)
	s3.Put("tenant-data", "models/a.bin", []byte("a"))
	const secretKey = "tenant-secret-access-key-9d2e"
	t.Setenv("AWS_ENDPOINT_URL_S3", s3.URL()) // the operator's endpoint, the controller's environment
	creds := map[string][]byte{"AWS_ACCESS_KEY_ID": []byte("AKIDTENANT"), "AWS_SECRET_ACCESS_KEY": []byte(secretKey)}
	secrets := fakeSecrets{
		"creds":      {ObjectMeta: metav1.ObjectMeta{Name: "creds", Labels: map[string]string{FilesLabel: "true"}}, Data: creds},
		"unlabelled": {ObjectMeta: metav1.ObjectMeta{Name: "unlabelled"}, Data: creds},
		"no-secret-key": {ObjectMeta: metav1.ObjectMeta{Name: "no-secret-key", Labels: map[string]string{FilesLabel: "true"}},
			Data: map[string][]byte{"AWS_ACCESS_KEY_ID": []byte("AKIDTENANT")}},
		"own-endpoint": {ObjectMeta: metav1.ObjectMeta{Name: "own-endpoint", Labels: map[string]string{FilesLabel: "true"}},
			Data: map[string][]byte{"AWS_ACCESS_KEY_ID": []byte("AKIDTENANT"), "AWS_SECRET_ACCESS_KEY": []byte(secretKey), "AWS_ENDPOINT_URL_S3": []byte("http://169.254.169.254")}},
	}
	registered := map[string]nodefiles.Buckets{}
	made := 0
	src := &namespaceSources{namespace: "tenant", secrets: secrets, registerBuckets: func(ref, _ string, newClient func() nodefiles.Buckets) {
		if newClient == nil {
			delete(registered, ref)
			return
		}
		if _, ok := registered[ref]; !ok {
			made++
			registered[ref] = newClient()
		}
	}}
	task := func(url string) *configs.Task {
		return &configs.Task{Resources: configs.Resources{Infra: "kubernetes"}, FileMounts: map[string]string{"/data": url}}
	}

	ok := task("s3://tenant-data/models")
	if _, err := resolveSources(context.Background(), src, ok, "creds"); err != nil {
		t.Fatal(err)
	}
	if got, want := ok.FileMounts["/data"], "s3+secret://tenant/creds/tenant-data/models"; got != want {
		t.Errorf("stored source %q, want %q", got, want)
	}
	b, found := registered["tenant/creds"]
	if !found {
		t.Fatalf("no client registered under tenant/creds: %v", registered)
	}
	d, err := b.DownloadURL(context.Background(), nodefiles.BucketURL{Scheme: "s3", Bucket: "tenant-data", Prefix: "models"}, "models/a.bin")
	if err != nil || !strings.Contains(d.URL, "X-Amz-Credential=AKIDTENANT%2F") {
		t.Errorf("the registered client presigns %q (%v); want the tenant's access key", d.URL, err)
	}
	if _, err := resolveSources(context.Background(), src, task("s3://tenant-data/models"), "creds"); err != nil || made != 1 {
		t.Errorf("a second reconcile: %v, clients made %d; want the first kept", err, made)
	}

	cases := []struct{ name, url, creds, want string }{
		{"missing", "s3://tenant-data/models", "nowhere", "bucketCredentials: nowhere: source not found: no Secret nowhere in the FerryService's namespace"},
		{"unlabelled", "s3://tenant-data/models", "unlabelled", "Secret unlabelled is not labelled ferry.dev/files=true"},
		{"incomplete", "s3://tenant-data/models", "no-secret-key", "Secret no-secret-key has no key AWS_SECRET_ACCESS_KEY (it has AWS_ACCESS_KEY_ID)"},
		{"own endpoint", "s3://tenant-data/models", "own-endpoint", "Secret own-endpoint sets AWS_ENDPOINT_URL_S3: the S3 endpoint is the operator's to choose"},
		{"no bucket", "s3://no-such-bucket/x", "creds", "file_mounts./data: source not found: with the credentials of Secret creds: "},
	}
	for _, tc := range cases {
		_, err := resolveSources(context.Background(), src, task(tc.url), tc.creds)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), secretKey) {
			t.Errorf("%s: the error shows the secret key: %v", tc.name, err)
		}
	}
	var te *TenancyError
	if _, err := resolveSources(context.Background(), src, task("s3://tenant-data/models"), "unlabelled"); !errors.As(err, &te) {
		t.Errorf("unlabelled: %v, want a TenancyError", err)
	}
	// The Secret loses a key: its client goes (launches stop using the old values).
	saved := secrets["creds"]
	secrets["creds"] = secrets["no-secret-key"]
	if _, err := resolveSources(context.Background(), src, task("s3://tenant-data/models"), "creds"); err == nil {
		t.Fatal("a Secret without its secret key accepted")
	}
	if _, found := registered["tenant/creds"]; found {
		t.Error("the client of a Secret that lost its key is still registered")
	}
	secrets["creds"] = saved
	if _, err := resolveSources(context.Background(), src, task("s3://tenant-data/models"), "creds"); err != nil {
		t.Fatal(err)
	}
	// The owner takes the label off: its client goes.
	secrets["creds"] = secrets["unlabelled"]
	if _, err := resolveSources(context.Background(), src, task("s3://tenant-data/models"), "creds"); err == nil {
		t.Fatal("an unlabelled Secret accepted")
	}
	if _, found := registered["tenant/creds"]; found {
		t.Error("the client of a Secret whose label was taken off is still registered")
	}
}
