// Package chart is Ferry's Helm chart. Its Go side carries the chart's CustomResourceDefinitions
// (crds/) into the ferry binary, because Helm installs crds/ once and never upgrades it: `ferry
// crd apply` is how a cluster gets the CRD of the Ferry it runs (docs/kubernetes.md, "Helm
// chart"). The tests beside it check the chart itself.
package chart

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"io/fs"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
)

//go:embed crds/*.yaml
var crdFiles embed.FS

// CRDGVR is the resource of CustomResourceDefinitions.
var CRDGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// FieldManager owns the fields `ferry crd apply` sets (server-side apply).
const FieldManager = "ferry-crd"

// CRDs returns the chart's CustomResourceDefinitions, as this binary was built with them.
func CRDs() ([]*unstructured.Unstructured, error) {
	paths, err := fs.Glob(crdFiles, "crds/*.yaml")
	if err != nil {
		return nil, err
	}
	var crds []*unstructured.Unstructured
	for _, p := range paths {
		raw, err := crdFiles.ReadFile(p)
		if err != nil {
			return nil, err
		}
		crd := &unstructured.Unstructured{}
		if err := yamlutil.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096).Decode(&crd.Object); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		crds = append(crds, crd)
	}
	return crds, nil
}

// Applied is what ApplyCRDs did to one CRD.
type Applied struct {
	Name string
	// Created, or else updated in place when Generation moved (the spec changed) and unchanged
	// when it did not.
	Created                      bool
	OldGeneration, NewGeneration int64
}

func (a Applied) String() string {
	switch {
	case a.Created:
		return fmt.Sprintf("customresourcedefinition %s created", a.Name)
	case a.OldGeneration != a.NewGeneration:
		return fmt.Sprintf("customresourcedefinition %s updated (generation %d to %d)", a.Name, a.OldGeneration, a.NewGeneration)
	default:
		return fmt.Sprintf("customresourcedefinition %s unchanged", a.Name)
	}
}

// ApplyCRDs creates or updates every CRD of the chart by server-side apply and waits until the
// API server has established each. It forces ownership of the fields it sets: the CRD helm
// created from crds/ (its fields held by helm's manager) is updated in place, never deleted and
// recreated, so the FerryServices stored under it stay. Nothing else of the object is touched.
func ApplyCRDs(ctx context.Context, dyn dynamic.Interface) ([]Applied, error) {
	crds, err := CRDs()
	if err != nil {
		return nil, err
	}
	client := dyn.Resource(CRDGVR)
	var applied []Applied
	for _, crd := range crds {
		a := Applied{Name: crd.GetName(), Created: true}
		if old, err := client.Get(ctx, crd.GetName(), metav1.GetOptions{}); err == nil {
			a.Created, a.OldGeneration = false, old.GetGeneration()
		}
		data, err := crd.MarshalJSON()
		if err != nil {
			return applied, err
		}
		force := true
		got, err := client.Patch(ctx, crd.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: FieldManager, Force: &force})
		if err != nil {
			return applied, fmt.Errorf("apply customresourcedefinition %s: %w", crd.GetName(), err)
		}
		a.NewGeneration = got.GetGeneration()
		if err := waitEstablished(ctx, dyn, crd.GetName()); err != nil {
			return applied, err
		}
		applied = append(applied, a)
	}
	return applied, nil
}

// waitEstablished waits until the API server serves the CRD's current spec.
func waitEstablished(ctx context.Context, dyn dynamic.Interface, name string) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := dyn.Resource(CRDGVR).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conds {
			if m, _ := c.(map[string]any); m["type"] == "Established" {
				last = fmt.Sprint(m["message"])
				return m["status"] == "True", nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("customresourcedefinition %s not established: %v (%s)", name, err, last)
	}
	return nil
}
