package kubernetes

import (
	"context"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ferryserve/ferry/internal/testcluster"
)

// grantRole gives user, in namespace ns, a Role of rules (named name) and returns a REST config
// that acts as user. It returns once the API server's authorizer allows user every verb on every
// resource of rules: the RBAC authorizer reads Roles and RoleBindings from an informer cache, so
// a binding just created may not apply yet, and a test that acted at once would be refused
// something it was granted (list pods) rather than what it was not (on a loaded host this
// took over a second).
func grantRole(t *testing.T, c *testcluster.Cluster, ns, name, user string, rules []rbacv1.PolicyRule) *rest.Config {
	t.Helper()
	ctx := context.Background()
	rbac := c.Client().RbacV1()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	if _, err := rbac.Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: user, APIGroup: rbacv1.GroupName}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}}
	if _, err := rbac.RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := c.RESTConfig()
	cfg.Impersonate.UserName = user
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Asked as user (SelfSubjectAccessReview), so the answer comes from the same authorizer
	// that will judge the provider's requests.
	var want []authorizationv1.ResourceAttributes
	for _, rule := range rules {
		for _, group := range rule.APIGroups {
			for _, resource := range rule.Resources {
				for _, verb := range rule.Verbs {
					want = append(want, authorizationv1.ResourceAttributes{Namespace: ns, Group: group, Resource: resource, Verb: verb})
				}
			}
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, attrs := range want {
		for {
			review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attrs}}
			got, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
			if err == nil && got.Status.Allowed {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still may not %s %s in %s 30 s after its RoleBinding: %v (review %+v)", user, attrs.Verb, attrs.Resource, ns, err, got)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return cfg
}
