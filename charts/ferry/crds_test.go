package chart

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/ferryserve/ferry/internal/testcluster"
)

// TestApplyCRDsUpgradesInPlace is `ferry crd apply` after an upgrade, on the test cluster's API
// server: the FerryService CRD as an older chart left it (one printer column and one spec field
// fewer, created the way helm creates crds/, by a plain create) is brought to the binary's
// version in place: same object (uid), a FerryService stored under the old one still there,
// and the new field no longer pruned. Applying again changes nothing.
func TestApplyCRDsUpgradesInPlace(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	crds, err := CRDs()
	if err != nil || len(crds) != 1 {
		t.Fatalf("CRDs() = %d CRDs, %v; want the FerryService CRD", len(crds), err)
	}
	old := olderCRD(t, crds[0])
	client := dyn.Resource(CRDGVR)
	if cur, err := client.Get(ctx, old.GetName(), metav1.GetOptions{}); apierrors.IsNotFound(err) {
		if _, err := client.Create(ctx, old, metav1.CreateOptions{FieldManager: "helm"}); err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	} else {
		// Another test of this package created it: make it the older one, in place.
		old.SetResourceVersion(cur.GetResourceVersion())
		if _, err := client.Update(ctx, old, metav1.UpdateOptions{FieldManager: "helm"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := waitEstablished(ctx, dyn, old.GetName()); err != nil {
		t.Fatal(err)
	}
	before, err := client.Get(ctx, old.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	createNamespace(t, ctx, c, "crd-upgrade")
	fsvcs := dyn.Resource(schema.GroupVersionResource{Group: "ferry.dev", Version: "v1alpha1", Resource: "ferryservices"}).Namespace("crd-upgrade")
	stored := ferryService("stored-before", 0)
	if _, err := fsvcs.Create(ctx, stored, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a FerryService under the older CRD: %v", err)
	}

	applied, err := ApplyCRDs(ctx, dyn)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 1 || applied[0].Created || applied[0].NewGeneration <= applied[0].OldGeneration {
		t.Errorf("ApplyCRDs = %v, want the CRD updated", applied)
	}
	after, err := client.Get(ctx, old.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.GetUID() != before.GetUID() {
		t.Errorf("the CRD was replaced (uid %s, was %s): its FerryServices would be gone", after.GetUID(), before.GetUID())
	}
	if cols := printerColumns(after); !strings.Contains(cols, "Endpoint") {
		t.Errorf("printer columns after apply %s, want Endpoint back", cols)
	}
	if _, err := fsvcs.Get(ctx, stored.GetName(), metav1.GetOptions{}); err != nil {
		t.Errorf("the FerryService stored under the older CRD: %v", err)
	}
	// The field the older schema lacked is kept now, not pruned.
	got, err := fsvcs.Create(ctx, ferryService("created-after", 2), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n, found, _ := unstructured.NestedFieldNoCopy(got.Object, "spec", "num_nodes"); !found {
		t.Errorf("spec.num_nodes pruned after the upgrade (spec %v)", got.Object["spec"])
	} else if n != int64(2) {
		t.Errorf("spec.num_nodes = %v, want 2", n)
	}

	again, err := ApplyCRDs(ctx, dyn)
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 1 || again[0].Created || again[0].NewGeneration != again[0].OldGeneration || !strings.Contains(again[0].String(), "unchanged") {
		t.Errorf("ApplyCRDs again = %v, want unchanged", again)
	}
}

// olderCRD is crd as an earlier chart might have had it: without the Endpoint printer column
// and the spec's num_nodes.
func olderCRD(t *testing.T, crd *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	old := crd.DeepCopy()
	versions, _, _ := unstructured.NestedSlice(old.Object, "spec", "versions")
	v := versions[0].(map[string]any)
	cols, _, _ := unstructured.NestedSlice(v, "additionalPrinterColumns")
	var kept []any
	for _, c := range cols {
		if c.(map[string]any)["name"] != "Endpoint" {
			kept = append(kept, c)
		}
	}
	if len(kept) == len(cols) {
		t.Fatal("the CRD has no Endpoint printer column: change olderCRD")
	}
	v["additionalPrinterColumns"] = kept
	props, found, _ := unstructured.NestedMap(v, "schema", "openAPIV3Schema", "properties", "spec", "properties")
	if _, ok := props["num_nodes"]; !found || !ok {
		t.Fatal("the CRD's spec has no num_nodes: change olderCRD")
	}
	delete(props, "num_nodes")
	if err := unstructured.SetNestedMap(v, props, "schema", "openAPIV3Schema", "properties", "spec", "properties"); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedSlice(old.Object, versions, "spec", "versions"); err != nil {
		t.Fatal(err)
	}
	return old
}

func printerColumns(crd *unstructured.Unstructured) string {
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	cols, _, _ := unstructured.NestedSlice(versions[0].(map[string]any), "additionalPrinterColumns")
	var names []string
	for _, c := range cols {
		names = append(names, c.(map[string]any)["name"].(string))
	}
	return strings.Join(names, ",")
}

// ferryService is the smallest FerryService the schema admits, with numNodes when not 0.
func ferryService(name string, numNodes int64) *unstructured.Unstructured {
	spec := map[string]any{"run": "sleep infinity", "service": map[string]any{"replicas": int64(1)}}
	if numNodes != 0 {
		spec["num_nodes"] = numNodes
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ferry.dev/v1alpha1", "kind": "FerryService",
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
}
