package kubestore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/internal/store/storetest"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/replicas"
)

// grantState makes a user of ns with what the chart's Role grants the controller for its state
// (charts/ferry/templates/rbac.yaml, Role -state): ConfigMaps in full, and of Secrets only the
// state key by name, and create; migrate adds get and delete on Secrets, as the chart's
// controller.migrateStateSecrets does for an upgrade. It returns a configuration acting as the
// user, once the API server authorizes it.
func grantState(t *testing.T, c *testcluster.Cluster, ns, user string, migrate bool) *rest.Config {
	t.Helper()
	ctx := context.Background()
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{KeySecret}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
	}
	if migrate {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "delete"}})
	}
	rbac := c.Client().RbacV1()
	if _, err := rbac.Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(c.RESTConfig())
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	as := kubernetes.NewForConfigOrDie(cfg)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := as.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{Limit: 1})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Role of %s never took effect: %v", user, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := as.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("%s listing Secrets: %v, want forbidden", user, err)
	}
	return cfg
}

// openAs opens the store on ns with cfg, leading (term 1) when leading is set.
func openAs(t *testing.T, cfg *rest.Config, ns string, leading bool) (*Store, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, Options{Config: cfg, Namespace: ns, Fence: func() (int64, bool) { return 1, leading }, Holder: "test"})
	if err == nil {
		t.Cleanup(func() { s.Close() })
	}
	return s, err
}

// TestContractUnderNarrowedSecretsRBAC runs the store contract as a user that may not list,
// watch or read any Secret but the state key: the store works on its ConfigMaps and that one
// Secret. (A store with an informer on Secrets never syncs under this Role.)
func TestContractUnderNarrowedSecretsRBAC(t *testing.T) {
	c := testcluster.Shared(t)
	storetest.Run(t, func(t *testing.T) storetest.Opener {
		ns := generatedNamespace(t, c, "ks-narrow-")
		cfg := grantState(t, c, ns, "ferry-narrow", false)
		return func(t *testing.T) store.Store {
			s, err := openAs(t, cfg, ns, true)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	})
}

// TestMigratesSecretsFromBefore: a store written before sealing (a Secret per service and job
// record, no key) is refused, with what to grant, by a controller that may not read those
// Secrets; a follower allowed to read them reads the records from them and leaves them; the
// leader allowed to moves them into sealed ConfigMaps and deletes them; after which the
// narrowed controller reads every record in full.
func TestMigratesSecretsFromBefore(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	ns := generatedNamespace(t, c, "ks-migrate-")
	task := func(run string) *configs.Task {
		return &configs.Task{Run: run, Secrets: map[string]string{"HF_TOKEN": "hf_" + run}, Envs: map[string]string{"AWS_SECRET_ACCESS_KEY": "aws_" + run}}
	}
	admin, err := openAs(t, c.RESTConfig(), ns, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.CreateService(store.Service{Name: "chat", Version: 1, Task: task("v1"), Port: 1}); err != nil {
		t.Fatal(err)
	}
	if err := admin.StartUpdate("chat", replicas.Version{Number: 2, LaunchedAs: 2, Task: task("v2")}, replicas.Rollout{From: 1, To: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CreateJob(jobs.Job{Name: "train", Task: task("train"), State: jobs.Pending}); err != nil {
		t.Fatal(err)
	}
	legacy := unsealToSecrets(t, c, admin, ns)
	admin.Close()

	narrowed := grantState(t, c, ns, "ferry-narrow", false)
	migrating := grantState(t, c, ns, "ferry-migrate", true)
	if _, err := openAs(t, narrowed, ns, true); err == nil || !strings.Contains(err.Error(), "controller.migrateStateSecrets=true") || !strings.Contains(err.Error(), "ferry-svc-chat") {
		t.Fatalf("Open with Secrets from before it may not read: %v, want the records named and what to grant", err)
	}
	follower, err := openAs(t, migrating, ns, false)
	if err != nil {
		t.Fatalf("Open as a follower that may read the Secrets: %v", err)
	}
	checkRecords(t, follower, "the follower")
	for _, name := range legacy {
		if _, err := c.Client().CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("Secret %s after a follower opened: %v, want it left to the leader", name, err)
		}
	}
	follower.Close()
	if _, err := openAs(t, migrating, ns, true); err != nil {
		t.Fatalf("Open as the leader that may move the Secrets: %v", err)
	}
	for _, name := range legacy {
		if _, err := c.Client().CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Secret %s after the migration: %v, want it gone", name, err)
		}
		if _, err := c.Client().CoreV1().ConfigMaps(ns).Get(ctx, sealedObject(name), metav1.GetOptions{}); err != nil {
			t.Errorf("sealed values of %s after the migration: %v", name, err)
		}
	}
	after, err := openAs(t, narrowed, ns, true)
	if err != nil {
		t.Fatalf("Open without access to Secrets, after the migration: %v", err)
	}
	checkRecords(t, after, "after the migration")
	if err := after.DeleteService("chat"); err != nil {
		t.Errorf("DeleteService after the migration: %v", err)
	}
}

// unsealToSecrets turns s's sealed ConfigMaps into the Secrets a store from before sealing
// kept, and deletes the state key (such a store had none); it returns the Secrets' names.
func unsealToSecrets(t *testing.T, c *testcluster.Cluster, s *Store, ns string) []string {
	t.Helper()
	ctx := context.Background()
	aead, err := s.sealer(false)
	if err != nil || aead == nil {
		t.Fatalf("the state key: %v", err)
	}
	sealed, err := c.Client().CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: kindSelector(sealedKind, "").String()})
	if err != nil || len(sealed.Items) != 2 {
		t.Fatalf("sealed ConfigMaps: %d, %v; want the service's and the job's", len(sealed.Items), err)
	}
	var names []string
	for _, cm := range sealed.Items {
		name := strings.TrimSuffix(cm.Name, sealedSuffix)
		kind := "job"
		if cm.Labels[LabelService] != "" {
			kind = "service"
		}
		sec := &corev1.Secret{ObjectMeta: objectMeta(name, kind, cm.Labels[LabelService]), Data: map[string][]byte{}}
		for k, v := range cm.Data {
			if sec.Data[k], err = unseal(aead, cm.Name, k, v); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.Client().CoreV1().Secrets(ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := c.Client().CoreV1().ConfigMaps(ns).Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	if err := c.Client().CoreV1().Secrets(ns).Delete(ctx, KeySecret, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	return names
}

// checkRecords wants TestMigratesSecretsFromBefore's service and job read in full from s.
func checkRecords(t *testing.T, s *Store, when string) {
	t.Helper()
	svc, err := s.GetService("chat")
	if err != nil || svc.Task.Secrets["HF_TOKEN"] != "hf_v2" || svc.Task.Envs["AWS_SECRET_ACCESS_KEY"] != "aws_v2" {
		t.Errorf("%s: GetService: %+v, %v; want v2 with its secrets", when, svc.Task, err)
	}
	versions, err := s.Versions("chat")
	if err != nil || len(versions) != 2 || versions[0].Task.Secrets["HF_TOKEN"] != "hf_v1" {
		t.Errorf("%s: Versions: %+v, %v; want v1 and v2 with their secrets", when, versions, err)
	}
	list, err := s.ListJobs()
	if err != nil || len(list) != 1 || list[0].Task.Secrets["HF_TOKEN"] != "hf_train" {
		t.Errorf("%s: ListJobs: %+v, %v; want the job with its secret", when, list, err)
	}
}

// TestLostStateKeyIsRefused: with the state key deleted (or replaced), reads of sealed values
// fail saying to restore it, and no write makes a new key that would leave the sealed records
// unreadable for good.
func TestLostStateKeyIsRefused(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	ns := generatedNamespace(t, c, "ks-key-")
	first, err := openAs(t, c.RESTConfig(), ns, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.CreateService(store.Service{Name: "chat", Version: 1, Task: &configs.Task{Run: "x", Secrets: map[string]string{"K": "v"}}, Port: 1}); err != nil {
		t.Fatal(err)
	}
	secrets := c.Client().CoreV1().Secrets(ns)
	if err := secrets.Delete(ctx, KeySecret, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := openAs(t, c.RESTConfig(), ns, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetService("chat"); !errors.Is(err, ErrStateKey) || !strings.Contains(err.Error(), "restore") {
		t.Errorf("GetService without the key: %v, want ErrStateKey saying to restore it", err)
	}
	if err := s.CreateService(store.Service{Name: "other", Version: 1, Task: &configs.Task{Run: "x"}, Port: 1}); !errors.Is(err, ErrStateKey) {
		t.Errorf("CreateService without the key: %v, want ErrStateKey", err)
	}
	if _, err := secrets.Get(ctx, KeySecret, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the state key after a write without it: %v, want no new key", err)
	}
	wrong := &corev1.Secret{ObjectMeta: objectMeta(KeySecret, "key", ""), Data: map[string][]byte{keySecretData: make([]byte, 32)}}
	if _, err := secrets.Create(ctx, wrong, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err = openAs(t, c.RESTConfig(), ns, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetService("chat"); !errors.Is(err, ErrStateKey) || !strings.Contains(err.Error(), "not the key") {
		t.Errorf("GetService with another key: %v, want ErrStateKey saying it is not the key", err)
	}
}
